"""Finetuner: epochs over a labelled dataset, metrics each epoch (Rapidformer's Finetuner).

    class MyFinetuner(Finetuner):
        def train_valid_test_datasets_provider(self):
            return train_ds, valid_ds, test_ds, collate_fn    # collate_fn None: stack fields
        def model_optimizer_lr_scheduler_provider(self):
            return model, None, None
        def run_forward_step(self, batch, model):             # batch: dict/tuple of tensors
            return loss
        def run_compute_metrics(self, model, eval_dataloader):
            ...                                               # loop over batches, return {"accuracy": ...}

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
"""
import os

from rapidgpt.data.samplers import EpochSampler, SequentialSampler, micro_batches
from rapidgpt.parallel.comm import sum_over_ranks
from rapidgpt.parallel.state import get_data_parallel_rank, get_data_parallel_world_size, get_parallel_state
from rapidgpt.training.checkpoint_files import BEST, best_record
from rapidgpt.training.checkpointing import save_checkpoint
from rapidgpt.training.reporting import report_metrics
from rapidgpt.training.trainer import Trainer, hook, to_tensors


class EvalDataLoader:
    """Re-iterable batches of tensors over an evaluation dataset: each sample once, in order, on
    one data-parallel rank (rank r takes the r-th micro-batch of each group of DP micro-batches)."""

    def __init__(self, dataset, micro_batch_size, collate_fn):
        self.dataset, self.micro_batch_size, self.collate_fn = dataset, micro_batch_size, collate_fn

    def __iter__(self):
        sampler = SequentialSampler(len(self.dataset), self.micro_batch_size, get_data_parallel_rank(),
                                    get_data_parallel_world_size())
        return map(to_tensors, micro_batches(self.dataset, sampler, self.collate_fn))

    def __len__(self):
        return -(-len(self.dataset) // self.micro_batch_size)


class Finetuner(Trainer):

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
        train_ds, valid_ds, test_ds, collate_fn = self.train_valid_test_datasets_provider()
        iters_per_epoch = len(train_ds) // args.global_batch_size
        if iters_per_epoch == 0:
            raise ValueError(f"the training set has {len(train_ds)} samples, fewer than "
                             f"--global-batch-size {args.global_batch_size}")
        if not (args.epochs or args.train_iters):
            raise ValueError("finetuning needs --epochs (or --train-iters)")
        # --epochs becomes iterations here, before the default LR schedule (which decays over
        # --train-iters) is built.
        args.train_iters = train_iters = args.train_iters or args.epochs * iters_per_epoch
        model, optimizer, scheduler = self.build_model_optimizer_scheduler()
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, scheduler
        iteration, consumed = self.load_checkpoint_if_asked()
        self.best = best_record(args.save) if args.save and iteration else None
        sampler = EpochSampler(len(train_ds), consumed, args.micro_batch_size, get_data_parallel_rank(),
                               get_data_parallel_world_size(), seed=args.seed)
        batches = micro_batches(train_ds, sampler, collate_fn, args.num_workers)
        eval_loader = EvalDataLoader(valid_ds, args.micro_batch_size, collate_fn) if valid_ds is not None else None
        self.history = []

        def forward(batch):
            return self.run_forward_step(batch, model)

        def evaluate(iteration):
            metrics = self._compute_metrics(eval_loader)
            epoch = iteration / iters_per_epoch
            report_metrics(f"validation at epoch {epoch:g} (iteration {iteration})", iteration, metrics)
            self.history.append((iteration, metrics))
            if args.save and not args.skip_train:
                self._keep_if_best(iteration, epoch, metrics)

        def test(iteration):
            metrics = self._compute_metrics(EvalDataLoader(test_ds, args.micro_batch_size, collate_fn))
            report_metrics(f"test at the end of training (iteration {iteration})", iteration, metrics, "test")

        finished = True
        if not args.skip_train and iteration < train_iters:
            finished = self.train_loop(model, optimizer, scheduler, forward, batches, train_iters,
                                       evaluate if eval_loader is not None else None, iters_per_epoch,
                                       start_iteration=iteration, consumed=consumed)
        if finished and eval_loader is not None and (args.skip_train or train_iters % iters_per_epoch):
            self._evaluate_in_eval_mode(model, evaluate, train_iters)
        if finished and test_ds is not None:
            self._evaluate_in_eval_mode(model, test, train_iters)
        return model

    def _compute_metrics(self, loader):
        return {name: float(value) for name, value in self.run_compute_metrics(self.model, loader).items()}

    def _keep_if_best(self, iteration, epoch, metrics):
        """Save under <save>/best/ when --best-metric beats every earlier evaluation (module doc)."""
        args = self.args
        name = args.best_metric or next(iter(metrics))
        if name not in metrics:
            raise ValueError(f"--best-metric {name}: run_compute_metrics returned {', '.join(metrics)}; "
                             f"choose one of them")
        better = self.best is None or self.best["metric"] != name or metrics[name] > self.best["value"]
        # Saving is collective: every rank must take the same decision.
        agreeing = sum_over_ranks(int(better))
        if agreeing not in (0, get_parallel_state().world_size):
            raise ValueError(f"--best-metric {name}: the ranks' run_compute_metrics returned different values "
                             f"({agreeing} of {get_parallel_state().world_size} found a new best); gather "
                             f"predictions over data-parallel ranks with self.gather before computing metrics")
        if not better:
            return
        self.best = {"metric": name, "value": metrics[name], "epoch": epoch, "iteration": iteration}
        path = save_checkpoint(args, iteration, iteration * args.global_batch_size, self.model, self.optimizer,
                               self.lr_scheduler, directory=os.path.join(args.save, BEST), keep_last_n=1,
                               extra_metadata={"best": self.best})
        self.logger.info(f"  best {name} so far ({metrics[name]:.6f} at epoch {epoch:g}): saved to {path}")
