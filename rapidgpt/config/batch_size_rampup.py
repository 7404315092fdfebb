"""Megatron's batch-size ramp-up: `--rampup-batch-size START INCREMENT SAMPLES`.

The global batch size starts at START and grows by INCREMENT every SAMPLES / ((--global-batch-size -
START) / INCREMENT) consumed samples until it reaches --global-batch-size, which it keeps once more
than SAMPLES samples are consumed. This is Megatron-LM's RampupBatchsizeNumMicroBatchesCalculator
and its update_train_iters (sample-based training only: --train-samples), as they were until
Megatron replaced them by --step-batch-size-schedule; at Megatron-LM d98e8a6 the flag still
parses but no longer has an effect there.

The batch size is a function of the consumed samples alone, so a run resumed from a checkpoint
(which records them) continues the ramp exactly where it was. The number of micro-batches per
step follows it (batch size / (micro-batch size x data-parallel size)): every size of the ramp must
be such a multiple, checked up front. The step compiles one graph per number of micro-batches
(rapidgpt/training/trainer.py).
"""
from dataclasses import dataclass


def add_batch_size_rampup_args(parser):
    g = parser.add_argument_group("batch-size ramp-up")
    g.add_argument("--rampup-batch-size", nargs=3, type=int, default=None, metavar=("START", "INCREMENT", "SAMPLES"),
                   help="Megatron's: start at global batch size START and add INCREMENT evenly over the first "
                        "SAMPLES samples until --global-batch-size (needs --train-samples)")


@dataclass(frozen=True)
class BatchSizeRampup:
    """The ramp of a run: `start`, `increment`, `samples` (the flag's three values),
    `global_batch_size` (its end), `per_micro_batch` (micro-batch size x data-parallel size)."""
    start: int
    increment: int
    samples: int
    global_batch_size: int
    per_micro_batch: int

    @property
    def increments(self):
        return (self.global_batch_size - self.start) // self.increment

    def batch_size_at(self, consumed_samples):
        """The global batch size of the iteration that starts after `consumed_samples`."""
        if consumed_samples > self.samples or self.increments == 0:
            return self.global_batch_size
        samples_per_increment = self.samples / self.increments        # a float, as in Megatron
        return self.start + int(consumed_samples / samples_per_increment) * self.increment

    def num_micro_batches_at(self, consumed_samples):
        return self.batch_size_at(consumed_samples) // self.per_micro_batch

    def consumed_after(self, iterations):
        """The samples the first `iterations` iterations consume."""
        consumed = 0
        for _ in range(iterations):
            consumed += self.batch_size_at(consumed)
        return consumed

    def train_iters(self, train_samples):
        """Megatron's update_train_iters: the ramp's iterations while at most SAMPLES (and at most
        `train_samples`) samples are consumed, then whole global batches (a partial last one is
        dropped) -> (iterations, samples they consume)."""
        iterations, consumed = 0, 0
        while consumed <= self.samples and consumed <= train_samples:
            consumed += self.batch_size_at(consumed)
            iterations += 1
        if train_samples > consumed:
            whole = (train_samples - consumed) // self.global_batch_size
            iterations, consumed = iterations + whole, consumed + whole * self.global_batch_size
        return iterations, consumed

    def describe(self):
        return (f"batch-size ramp-up: global batch size {self.start} to {self.global_batch_size} in steps of "
                f"{self.increment} over {self.samples} samples")


def check_batch_size_rampup_args(args, check):
    """After the layout and schedule checks: args.batch_size_rampup (a BatchSizeRampup, or None),
    and with it --train-iters from --train-samples as Megatron counts it."""
    args.batch_size_rampup = None
    if args.rampup_batch_size is None:
        return
    start, increment, samples = args.rampup_batch_size
    gbs, per = args.global_batch_size, max(1, args.micro_batch_size) * getattr(args, "data_parallel_size", 1)
    ok = check.require(not args.train_iters or args.train_samples,
                       "--rampup-batch-size: the ramp is counted in samples; give the training length as "
                       "--train-samples (Megatron's rule), not --train-iters")
    ok &= check.require(start > 0 and increment > 0 and samples > 0,
                        f"--rampup-batch-size: START, INCREMENT and SAMPLES must be positive, got {start} {increment} "
                        f"{samples} (without a ramp, drop the flag)")
    ok &= check.require(start <= gbs and (gbs - start) % max(increment, 1) == 0,
                        f"--rampup-batch-size: --global-batch-size {gbs} must be START {start} plus a whole "
                        f"number of INCREMENT {increment}")
    if not ok:
        return
    misfits = [size for size in range(start, gbs + 1, increment) if size % per]
    if not check.require(not misfits, f"--rampup-batch-size: batch size {misfits[0] if misfits else 0} of the ramp "
                                      f"is not a multiple of --micro-batch-size {args.micro_batch_size} x "
                                      f"data-parallel size {args.data_parallel_size} = {per}; choose START and "
                                      f"INCREMENT as multiples of {per}"):
        return
    args.batch_size_rampup = BatchSizeRampup(start, increment, samples, gbs, per)
    if args.train_samples:
        args.train_iters, _ = args.batch_size_rampup.train_iters(args.train_samples)
