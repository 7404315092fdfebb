"""Pretrainer: Megatron's pretrain() as a template with four hooks.

    class MyPretrainer(Pretrainer):
        def train_valid_test_datasets_provider(self, train_val_test_num_samples):
            return train_ds, valid_ds, test_ds                # map-style datasets
        def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
            return model, None, None                          # None: built from the flags
        def run_forward_step(self, data_iterator, model):
            batch = next_batch(data_iterator)                 # Megatron: next(data_iterator)
            output = model(batch["tokens"], batch["position_ids"], labels=batch["labels"])
            return output, partial(lm_loss_func, batch["loss_mask"])
        # run_compute_metrics(self, model, eval_data_iterator) has a default: loss (+ PPL)

The step is compiled (training/step.py), so `run_forward_step` is traced by `mindspore.jit`:
read the micro-batch with `rapidgpt.next_batch(data_iterator)`, which returns the batch being
traced (a dict of tensors `[micro_batch, ...]`) and is `next()` on a real iterator otherwise.
Code that cannot be compiled runs with `--no-jit` (PyNative, slower).
"""
import numpy as np

from rapidgpt.data.samplers import PretrainingSampler, micro_batches
from rapidgpt.flag_parser import ArgumentError
from rapidgpt.parallel.state import get_data_parallel_rank, get_data_parallel_world_size
from rapidgpt.training.hook_contract import check_returned, check_length
from rapidgpt.training.reporting import report_validation
from rapidgpt.training.trainer import Trainer, hook, to_tensors


def next_batch(data_iterator):
    """The next micro-batch: the traced batch inside the compiled step, `next()` elsewhere.

    The `isinstance` test is resolved while compiling, so the compiled graph has no branch.
    """
    if isinstance(data_iterator, (dict, tuple, list)):
        return data_iterator
    return next(data_iterator)


class Pretrainer(Trainer):

    @hook("(self, train_val_test_num_samples) -> (train, valid, test) datasets")
    def train_valid_test_datasets_provider(self, train_val_test_num_samples):
        raise NotImplementedError

    @hook("(self, pre_process=True, post_process=True, vp_stage=None) -> (model, optimizer|None, lr_scheduler|None)")
    def model_optimizer_lr_scheduler_provider(self, pre_process=True, post_process=True, vp_stage=None):
        raise NotImplementedError

    @hook("(self, data_iterator, model) -> loss, or (output, loss_fn) as Megatron")
    def run_forward_step(self, data_iterator, model):
        raise NotImplementedError

    def run_compute_metrics(self, model, eval_data_iterator):
        """Default evaluation, Megatron's: the mean over --eval-iters global batches of each statistic
        the loss function returns (BERT: "lm loss", "sop loss"), or of the loss ("lm loss"); with
        --calculate-per-token-loss the sums over all their tokens divided by the tokens."""
        n = self.args.eval_iters * self.args.num_micro_batches
        results = [self._eval_step(to_tensors(next(eval_data_iterator))) for _ in range(n)]
        names = list(results[0][1]) if results else []
        columns = [[loss] + [stats[name] for name in names] + [tokens] for loss, stats, tokens in results]
        values = self.gather(np.array(columns, np.float64).reshape(len(results), 2 + len(names)))
        means = values[:, :-1].sum(axis=0) / values[:, -1].sum() if len(values) else np.zeros(1 + len(names))
        return {name: float(mean) for name, mean in zip(names, means[1:])} if names else {"lm loss": float(means[0])}

    def train_val_test_num_samples(self):
        """Samples each split must provide, as Megatron computes them."""
        args = self.args
        gbs = args.global_batch_size
        evaluations = args.train_iters // args.eval_interval + 1
        rampup = getattr(args, "batch_size_rampup", None)       # evaluations use the whole --global-batch-size
        train = args.train_iters * gbs if rampup is None else rampup.consumed_after(args.train_iters)
        return [train, evaluations * args.eval_iters * gbs, args.eval_iters * gbs]

    def _iterator(self, dataset, consumed=0):
        args = self.args
        sampler = PretrainingSampler(len(dataset), consumed, args.micro_batch_size,
                                     get_data_parallel_rank(), get_data_parallel_world_size())
        return micro_batches(dataset, sampler, num_workers=args.num_workers)

    def train(self):
        """Build data and model through the hooks, train --train-iters iterations, evaluate."""
        self.check_hooks()
        args = self.args
        if not args.train_iters:
            raise ArgumentError("--train-iters: pretraining needs --train-iters (or --train-samples)")
        self.timers("train/valid/test-data-iterators-setup").start()
        num_samples = self.train_val_test_num_samples()
        train_ds, valid_ds, test_ds = check_returned(
            self.train_valid_test_datasets_provider(num_samples), "train_valid_test_datasets_provider",
            ("train", "valid", "test"))
        if not args.skip_train:
            check_length(train_ds, num_samples[0], "training",
                         f"--train-iters {args.train_iters} x --global-batch-size {args.global_batch_size}")
        if args.eval_iters:
            check_length(valid_ds, num_samples[1], "validation",
                         f"{num_samples[1] // (args.eval_iters * args.global_batch_size)} evaluations of "
                         f"--eval-iters {args.eval_iters} x --global-batch-size {args.global_batch_size}")
            check_length(test_ds, num_samples[2], "test",
                         f"--eval-iters {args.eval_iters} x --global-batch-size {args.global_batch_size}")
        self.timers("train/valid/test-data-iterators-setup").stop()
        model, optimizer, scheduler = self.build_model_optimizer_scheduler()
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, scheduler

        def forward(micro_batch):
            return self.run_forward_step(micro_batch, model)

        self._eval_step = self.eval_step(forward, model)
        iteration, consumed = self.load_checkpoint_if_asked()
        self.log_setup_times()
        # Evaluations before `iteration` consumed these validation samples (Megatron's count).
        gbs = args.global_batch_size
        valid_consumed = (iteration // args.eval_interval) * args.eval_iters * gbs
        valid_iterator = (self._iterator(valid_ds, valid_consumed)
                          if valid_ds is not None and args.eval_iters else None)

        def evaluate(iteration, label=None, iterator=valid_iterator):
            metrics = self.run_compute_metrics(model, iterator)
            report_validation(label or f"iteration {iteration}", iteration, metrics)
            self.last_metrics = metrics

        finished = True
        if not args.skip_train and iteration < args.train_iters:
            finished = self.train_loop(model, optimizer, scheduler, forward, self._iterator(train_ds, consumed),
                                       args.train_iters, evaluate if valid_iterator else None,
                                       args.eval_interval, start_iteration=iteration, consumed=consumed)
        if not finished:
            return model
        end = args.train_iters if not args.skip_train else iteration
        if valid_iterator is not None:
            self._evaluate_in_eval_mode(model, lambda it: evaluate(
                it, "the end of training for val data"), end)
        if test_ds is not None and args.eval_iters:
            self._evaluate_in_eval_mode(model, lambda it: evaluate(
                it, "the end of training for test data", self._iterator(test_ds)), end)
        return model
