"""Finetuner: epochs over a labelled dataset, metrics each epoch (Rapidformer's Finetuner).

    class MyFinetuner(Finetuner):
        def train_valid_test_datasets_provider(self):
            return train_ds, valid_ds, test_ds, collate_fn    # collate_fn None: stack fields
        def model_optimizer_lr_scheduler_provider(self):
            return model, None, None
        def run_forward_step(self, batch, model):             # batch: dict/tuple of tensors
            return loss
        def run_compute_metrics(self, model, eval_dataloader):
            predictions, labels = [], []
            for batch in eval_dataloader:                      # this rank's share of the set
                predictions.append(model(batch["x"]).argmax(axis=-1).asnumpy())
                labels.append(batch["label"].asnumpy())
            predictions = eval_dataloader.without_padding(predictions)   # ZeRO-3 pads (EvalDataLoader)
            labels = eval_dataloader.without_padding(labels)
            predictions = self.gather(np.concatenate(predictions))   # every DP rank's, concatenated
            labels = self.gather(np.concatenate(labels))
            return {"accuracy": float((predictions == labels).mean())}

`run_forward_step` is compiled into the training step (mindspore.jit); `run_compute_metrics` runs
eagerly with the model in eval mode, over batches of tensors. Training runs `--epochs` passes
(or `--train-iters` iterations) in global batches of `--global-batch-size`, shuffled per epoch.

The validation set is evaluated after every epoch (and at the end of a run that stops
mid-epoch); a test set, if given, once at the end. With --save, the best evaluation so far by
`--best-metric` (higher is better; default: the first metric returned) is kept under
`<save>/best/`: a checkpoint like the others (Megatron layout, written atomically, loadable with
--load or --pretrained-checkpoint), replaced only by a strictly better evaluation, never pruned
by --keep-last-n-checkpoints, its metadata.json recording {"best": {metric, value, epoch,
iteration}}. A resumed run competes with the best its earlier part kept.

With data parallelism each DP rank evaluates 1/DP of the samples (`eval_dataloader.indices`);
`self.gather` collects every rank's arrays so that the metrics cover the whole set. Metrics that
still differ between DP ranks (run_compute_metrics did not gather) are detected after each
evaluation: a warning says so once, and the metrics reported, and compared for `best/`, are then
each rank's value weighted by its number of samples (`DataParallelMetrics`).

--skip-train evaluates the --load checkpoint's weights on the validation and test sets, without
a training set, --epochs, optimizer or learning-rate schedule: the provider may return
`train=None`.
"""
import os

import numpy as np

from rapidgpt.data.samplers import EpochSampler, SequentialSampler, micro_batches
from rapidgpt.flag_parser import ArgumentError
from rapidgpt.parallel.comm import sum_over_ranks
from rapidgpt.parallel.state import get_data_parallel_rank, get_data_parallel_world_size, get_parallel_state
from rapidgpt.training.checkpoint_files import BEST, best_record, find_checkpoint, read_metadata
from rapidgpt.training.checkpointing import load_checkpoint, save_checkpoint
from rapidgpt.training.hook_contract import HookContractError, check_returned
from rapidgpt.training.reporting import report_metrics
from rapidgpt.training.trainer import Trainer, hook, to_tensors


class EvalDataLoader:
    """Re-iterable batches of tensors over an evaluation dataset: each sample once, in order, on
    one data-parallel rank (rank r takes the r-th micro-batch of each group of DP micro-batches).

    `indices` are the dataset indices of this rank's samples in the order its batches hold them
    (`self.gather(indices)` lines gathered rows up with the dataset), `num_samples` their count;
    `split` is "validation" or "test".

    With `equal_batches` (ZeRO-3: every data-parallel rank must run each forward, which gathers
    the layers' weights from all of them) a rank left without a batch in the last group runs
    `padding_batches` (0 or 1) more at the end, of the set's first sample again: leave their
    results out with `without_padding(per_batch_results)` (RapidGPT's metric helpers do).
    """

    def __init__(self, dataset, micro_batch_size, collate_fn, split="validation", equal_batches=False):
        self.dataset, self.collate_fn, self.split = dataset, collate_fn, split
        self.sampler = SequentialSampler(len(dataset), micro_batch_size, get_data_parallel_rank(),
                                         get_data_parallel_world_size(), equal_batches)
        self.padding_batches = self.sampler.padding_batches

    def without_padding(self, results):
        """`results` (one per batch this loader yielded) without the padding batches'."""
        return list(results)[:len(results) - self.padding_batches]

    def __iter__(self):
        return map(to_tensors, micro_batches(self.dataset, self.sampler, self.collate_fn))

    def __len__(self):
        """The number of batches this rank's iteration yields."""
        return sum(1 for _ in self.sampler)

    @property
    def indices(self):
        return np.array([i for batch in self.sampler.real_batches() for i in batch], np.int64)

    @property
    def num_samples(self):
        return len(self.indices)


class DataParallelMetrics:
    """Makes every data-parallel rank report the same metrics, and says so when they did not.

    `agree(metrics, num_samples)` gathers one row `[num_samples, *values]` from each DP rank. Equal
    values (run_compute_metrics gathered, so each rank computed over the whole set): `metrics` is
    returned as it is. Different: each metric becomes the mean of the ranks' values weighted by
    their number of samples — the same on every rank, exact for per-sample averages such as
    accuracy (the weighted mean of per-rank accuracies is the accuracy over the union), not for
    metrics like F1 — and the first time, one warning names the metrics, the ranks' values and
    the fix.
    """

    def __init__(self, gather, logger):
        self.gather, self.logger, self.warned = gather, logger, False

    def agree(self, metrics, num_samples):
        names = list(metrics)
        # [DP, 1 + metrics]. The gather sends fp32: values equal on every rank stay equal, and the
        # means below come from these same rows on every rank, so the ranks agree to the bit.
        rows = self.gather(np.array([[num_samples, *metrics.values()]], np.float64))
        differing = [column for column in range(1, rows.shape[1])
                     if not all(np.array_equal(value, rows[0, column], equal_nan=True)
                                for value in rows[:, column])]
        if not differing:
            return metrics
        if not self.warned:
            self.warned = True
            self.logger.warning(self._warning([names[column - 1] for column in differing], rows[:, differing],
                                              rows[:, 0]))
        # A rank without samples computed its metrics over nothing (NaN, or anything): weight 0.
        counted = rows[rows[:, 0] > 0]
        means = counted[:, 0] @ counted[:, 1:] / counted[:, 0].sum()
        return {name: float(mean) for name, mean in zip(names, means)}

    @staticmethod
    def _warning(names, values, samples):
        """The warning: `values [DP, len(names)]` of the differing metrics, `samples [DP]`."""
        per_rank = "; ".join(f"{name}: " + ", ".join(f"rank {rank} {value:.6f}" for rank, value in enumerate(column))
                             for name, column in zip(names, values.T))
        counts = ", ".join(f"rank {rank} {int(n)}" for rank, n in enumerate(samples))
        return (f"WARNING: run_compute_metrics returned different values on the data-parallel ranks "
                f"({per_rank}; samples evaluated: {counts}). run_compute_metrics sees 1/DP of the validation "
                f"set on each data-parallel rank; gather predictions/labels with self.gather(...) before "
                f"computing metrics. Until then each metric is reported, and compared for best/, as the mean "
                f"over the data-parallel ranks weighted by their number of samples: exact for per-sample "
                f"averages such as accuracy, not for metrics like F1.")


class Finetuner(Trainer):

    # Not a language model: the log line says "loss" and counts samples, not tokens.
    loss_name = "loss"
    throughput_unit = "samples"

    @hook("(self) -> (train, valid, test, collate_fn)")
    def train_valid_test_datasets_provider(self):
        raise NotImplementedError

    @hook("(self) -> (model, optimizer|None, lr_scheduler|None)")
    def model_optimizer_lr_scheduler_provider(self):
        raise NotImplementedError

    @hook("(self, batch, model) -> scalar loss")
    def run_forward_step(self, batch, model):
        raise NotImplementedError

    @hook("(self, model, eval_dataloader) -> dict of floats (use self.gather across ranks)")
    def run_compute_metrics(self, model, eval_dataloader):
        raise NotImplementedError

    def train(self):
        self.check_hooks()
        args = self.args
        if args.pipeline_model_parallel_size > 1:
            # Finetuning batches are collated by the user and evaluated with user metrics on every
            # rank; pipeline stages would need both split by stage: use a Pretrainer for PP.
            raise ArgumentError(f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size}: the "
                                f"Finetuner runs without pipeline stages; use tensor/data parallelism, or a "
                                f"Pretrainer (its run_forward_step and datasets) for pipeline parallelism")
        if args.rampup_batch_size is not None:
            raise ArgumentError("--rampup-batch-size: the Finetuner's epochs use a constant --global-batch-size; "
                                "ramp up in pretraining (a Pretrainer, or --task pretraining)")
        self.timers("train/valid/test-data-iterators-setup").start()
        train_ds, valid_ds, test_ds, collate_fn = check_returned(
            self.train_valid_test_datasets_provider(), "train_valid_test_datasets_provider",
            ("train", "valid", "test", "collate_fn"))
        self.timers("train/valid/test-data-iterators-setup").stop()
        self.history, self.best = [], None
        self._data_parallel_metrics = DataParallelMetrics(self.gather, self.logger)
        if args.skip_train:
            return self._evaluate_checkpoint(valid_ds, test_ds, collate_fn)
        if train_ds is None:
            raise HookContractError("train_valid_test_datasets_provider returned no training set; give the "
                                    "training data, or --skip-train --load DIR to only evaluate a checkpoint")
        iters_per_epoch = len(train_ds) // args.global_batch_size
        if iters_per_epoch == 0:
            raise HookContractError(f"train_valid_test_datasets_provider returned a training set of "
                                    f"{len(train_ds)} samples, fewer than --global-batch-size "
                                    f"{args.global_batch_size}; lower the batch size or give more data")
        if not (args.epochs or args.train_iters):
            raise ArgumentError("--epochs: finetuning needs --epochs (or --train-iters)")
        # --epochs becomes iterations here, before the default LR schedule (which decays over
        # --train-iters) is built.
        args.train_iters = train_iters = args.train_iters or args.epochs * iters_per_epoch
        model, optimizer, scheduler = self.build_model_optimizer_scheduler()
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, scheduler
        iteration, consumed = self.load_checkpoint_if_asked()
        self.log_setup_times()
        self.best = best_record(args.save) if args.save and iteration else None
        sampler = EpochSampler(len(train_ds), consumed, args.micro_batch_size, get_data_parallel_rank(),
                               get_data_parallel_world_size(), seed=args.seed)
        batches = micro_batches(train_ds, sampler, collate_fn, args.num_workers)
        eval_loader = self._eval_loader(valid_ds, collate_fn) if valid_ds is not None else None

        def forward(batch):
            return self.run_forward_step(batch, model)

        def evaluate(iteration):
            metrics = self._compute_metrics(eval_loader)
            epoch = iteration / iters_per_epoch
            report_metrics(f"validation at epoch {epoch:g} (iteration {iteration})", iteration, metrics)
            self.history.append((iteration, metrics))
            if args.save:
                self._keep_if_best(iteration, epoch, metrics)

        def test(iteration):
            metrics = self._compute_metrics(self._eval_loader(test_ds, collate_fn, "test"))
            report_metrics(f"test at the end of training (iteration {iteration})", iteration, metrics, "test")

        finished = True
        if iteration < train_iters:
            finished = self.train_loop(model, optimizer, scheduler, forward, batches, train_iters,
                                       evaluate if eval_loader is not None else None, iters_per_epoch,
                                       start_iteration=iteration, consumed=consumed)
        if finished and eval_loader is not None and train_iters % iters_per_epoch:
            self._evaluate_in_eval_mode(model, evaluate, train_iters)
        if finished and test_ds is not None:
            self._evaluate_in_eval_mode(model, test, train_iters)
        return model

    def _evaluate_checkpoint(self, valid_ds, test_ds, collate_fn):
        """--skip-train: the --load checkpoint's weights on the validation and test sets.

        Nothing trains, so only the provider's model is built (its optimizer and the LR schedule,
        which needs --train-iters, are not) and only the weights are loaded."""
        args = self.args
        model, _, _ = self.build_model()              # the weights come from --load
        load_checkpoint(args, model, logger=self.logger)
        iteration = read_metadata(find_checkpoint(args.load))["iteration"]
        self.logger.info(f" loaded checkpoint from {args.load} at iteration {iteration} (--skip-train: "
                         f"weights only, to evaluate)")
        self.model = model
        model.set_train(False)
        for split, dataset in (("validation", valid_ds), ("test", test_ds)):
            if dataset is not None:
                metrics = self._compute_metrics(self._eval_loader(dataset, collate_fn, split))
                report_metrics(f"{split} of the --load checkpoint (iteration {iteration})", iteration, metrics,
                               split)
                if split == "validation":
                    self.history.append((iteration, metrics))
        return model

    def _eval_loader(self, dataset, collate_fn, split="validation"):
        return EvalDataLoader(dataset, self.args.micro_batch_size, collate_fn, split,
                              equal_batches=self.args.zero.stage == 3)

    def _compute_metrics(self, loader):
        metrics = {name: float(value) for name, value in self.run_compute_metrics(self.model, loader).items()}
        if get_data_parallel_world_size() == 1:
            return metrics
        return self._data_parallel_metrics.agree(metrics, loader.num_samples)

    def _keep_if_best(self, iteration, epoch, metrics):
        """Save under <save>/best/ when --best-metric beats every earlier evaluation (module doc)."""
        args = self.args
        name = args.best_metric or next(iter(metrics))
        if name not in metrics:
            raise ArgumentError(f"--best-metric: {name}: run_compute_metrics returned {', '.join(metrics)}; "
                                f"choose one of them")
        better = self.best is None or self.best["metric"] != name or metrics[name] > self.best["value"]
        # Saving is collective: every rank must take the same decision.
        agreeing = sum_over_ranks(int(better))
        if agreeing not in (0, get_parallel_state().world_size):
            raise HookContractError(f"--best-metric {name}: the ranks' run_compute_metrics returned different values "
                             f"({agreeing} of {get_parallel_state().world_size} found a new best); gather "
                             f"predictions over data-parallel ranks with self.gather before computing metrics")
        if not better:
            return
        self.best = {"metric": name, "value": metrics[name], "epoch": epoch, "iteration": iteration}
        path = save_checkpoint(args, iteration, iteration * args.global_batch_size, self.model, self.optimizer,
                               self.lr_scheduler, directory=os.path.join(args.save, BEST), keep_last_n=1,
                               extra_metadata={"best": self.best})
        self.logger.info(f"  best {name} so far ({metrics[name]:.6f} at epoch {epoch:g}): saved to {path}")
