"""The template both Pretrainer and Finetuner are made of: hook checks, model/optimizer set-up,
and the training loop.

The loop, per iteration: take `num_micro_batches` micro-batches from the train iterator, stack
them, run the compiled step (training/step.py) with the scheduler's learning rate, advance the
scheduler by the global batch, report (Megatron log line, tqdm, TensorBoard), and evaluate every
`--eval-interval` iterations.
"""
import inspect
import time

import numpy as np
from mindspore import Tensor

from rapidgpt.global_vars import get_args, get_logger
from rapidgpt.optim import build_lr_scheduler, build_optimizer
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.training.reporting import Reporter
from rapidgpt.training.step import EvalStep, TrainStep


def to_tensors(batch):
    """A collated micro-batch (dict/tuple of numpy arrays) as MindSpore tensors."""
    if isinstance(batch, dict):
        return {key: Tensor(value) for key, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(Tensor(value) for value in batch)
    return Tensor(batch)


def stack_micro_batches(micro_batches):
    """n micro-batches -> one dict/tuple of tensors `[n, micro_batch, ...]` for the compiled step."""
    first = micro_batches[0]
    if isinstance(first, dict):
        return {key: Tensor(np.stack([mb[key] for mb in micro_batches])) for key in first}
    return tuple(Tensor(np.stack([mb[i] for mb in micro_batches])) for i in range(len(first)))


def hook(signature):
    """Marks a template method as a hook the user must override; `signature` is shown in errors."""
    def mark(function):
        function.__hook_signature__ = signature
        return function
    return mark


class Trainer:
    """Base of the templates: hooks are the methods marked with `@hook` in the subclasses."""

    def __init__(self, engine=None):
        self.engine = engine
        self.args = get_args()
        self.logger = get_logger()

    def check_hooks(self):
        """Every hook must be overridden; the error names the missing ones with their signature."""
        missing = [f"    def {name}{member.__hook_signature__}"
                   for name, member in inspect.getmembers(type(self))
                   if hasattr(member, "__hook_signature__")]
        if missing:
            raise NotImplementedError(
                f"{type(self).__name__} must implement these hooks of {type(self).__mro__[1].__name__}:\n"
                + "\n".join(missing))

    def build_model_optimizer_scheduler(self, **provider_kwargs):
        """The user's model/optimizer/scheduler; None optimizer or scheduler are built from the flags.

        Parameters declared by RapidGPT layers get their seeded, layout-independent values here,
        before anything is compiled.
        """
        result = self.model_optimizer_lr_scheduler_provider(**provider_kwargs)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise TypeError("model_optimizer_lr_scheduler_provider must return (model, optimizer or "
                            "None, lr_scheduler or None)")
        model, optimizer, scheduler = result
        initialize_parameters(model, self.args.seed)
        if optimizer is None:
            optimizer = build_optimizer(self.args, model.trainable_params())
        if scheduler is None:
            scheduler = build_lr_scheduler(self.args)
        for required in ("parameters",):
            if not hasattr(optimizer, required):
                raise TypeError(f"the optimizer from model_optimizer_lr_scheduler_provider needs "
                                f"`{required}` and must be callable as optimizer(grads, lr); use "
                                f"rapidgpt.optim.AdamW/SGD or return None to build one from the flags")
        return model, optimizer, scheduler

    def train_loop(self, model, optimizer, scheduler, forward, train_batches, train_iters,
                   evaluate=None, eval_interval=None, tokens_per_sample=None):
        """Run `train_iters` iterations; `evaluate(iteration)` every `eval_interval` iterations."""
        args = self.args
        n, gbs = args.num_micro_batches, args.global_batch_size
        tokens_per_sample = tokens_per_sample or args.seq_length
        step = TrainStep(forward, optimizer, n, args.clip_grad, jit=args.jit)
        reporter = Reporter(args, train_iters)
        self.reporter = reporter
        consumed = 0
        model.set_train(True)
        try:
            for iteration in range(1, train_iters + 1):
                start = time.perf_counter()
                stacked = stack_micro_batches([next(train_batches) for _ in range(n)])
                loss, norm, finite = step(stacked, scheduler.get_lr())
                scheduler.step(gbs)
                consumed += gbs
                reporter.iteration(iteration, consumed, {"lm loss": loss}, scheduler.get_lr(), norm,
                                   finite, time.perf_counter() - start, gbs * tokens_per_sample)
                if evaluate is not None and eval_interval and iteration % eval_interval == 0:
                    self._evaluate_in_eval_mode(model, evaluate, iteration)
        finally:
            reporter.close()
        return consumed

    def _evaluate_in_eval_mode(self, model, evaluate, iteration):
        model.set_train(False)
        try:
            evaluate(iteration)
        finally:
            model.set_train(True)

    def eval_step(self, forward):
        """A compiled forward-only `micro_batch -> loss` over this trainer's forward hook."""
        return EvalStep(forward, jit=self.args.jit)

    def gather(self, values):
        """Metric values from every data-parallel rank, concatenated (one rank: the values)."""
        return np.asarray(values)

