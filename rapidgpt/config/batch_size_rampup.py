"""Megatron's batch-size schedules: `--rampup-batch-size START INCREMENT SAMPLES` and
`--step-batch-size-schedule "THRESHOLD:BS ..."`.

Step schedule (Megatron-LM's StepBatchsizeNumMicroBatchesCalculator): the global batch size is BS
of the last entry whose THRESHOLD the consumed tokens have reached. THRESHOLD counts tokens (K, M,
B, T: 1e3 ... 1e12), turned into samples by --seq-length (threshold // seq_length, as Megatron,
which always gives the calculator the sequence length); the first must be 0, the next strictly
larger. The run's --global-batch-size is then Megatron's default (micro-batch x data-parallel size:
what an evaluation iteration reads) and may not be given; --train-samples counts iterations while
fewer samples than it are consumed (Megatron's update_train_iters). Each batch size must be a
multiple of micro-batch x data-parallel size (checked up front for every entry).

Ramp-up:

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

_SUFFIXES = {"K": 10 ** 3, "M": 10 ** 6, "B": 10 ** 9, "T": 10 ** 12}


def add_batch_size_rampup_args(parser):
    g = parser.add_argument_group("batch-size schedules")
    g.add_argument("--rampup-batch-size", nargs=3, type=int, default=None, metavar=("START", "INCREMENT", "SAMPLES"),
                   help="Megatron's: start at global batch size START and add INCREMENT evenly over the first "
                        "SAMPLES samples until --global-batch-size (needs --train-samples)")
    g.add_argument("--step-batch-size-schedule", default=None, metavar='"TOKENS:BS ..."',
                   help='Megatron\'s: global batch size BS once TOKENS tokens are consumed, e.g. "0:384 200B:768" '
                        "(suffixes K, M, B, T)")


class BatchSizeSchedule:
    """What the trainer asks of a schedule: `batch_size_at(consumed samples)`, `per_micro_batch`
    (micro-batch size x data-parallel size) and `describe()`."""

    def num_micro_batches_at(self, consumed_samples):
        return self.batch_size_at(consumed_samples) // self.per_micro_batch

    def consumed_after(self, iterations):
        """The samples the first `iterations` iterations consume."""
        consumed = 0
        for _ in range(iterations):
            consumed += self.batch_size_at(consumed)
        return consumed


@dataclass(frozen=True)
class StepBatchSizeSchedule(BatchSizeSchedule):
    """`steps`: ((threshold in samples, global batch size), ...), thresholds increasing from 0;
    `text`: the flag's value."""
    steps: tuple
    per_micro_batch: int
    text: str = ""

    def batch_size_at(self, consumed_samples):
        return [size for threshold, size in self.steps if consumed_samples >= threshold][-1]

    def train_iters(self, train_samples):
        """Megatron's update_train_iters: iterations while fewer than `train_samples` samples are
        consumed -> (iterations, samples they consume)."""
        iterations, consumed = 0, 0
        while consumed < train_samples:
            consumed += self.batch_size_at(consumed)
            iterations += 1
        return iterations, consumed

    def describe(self):
        steps = ", ".join(f"{size} from sample {threshold}" for threshold, size in self.steps)
        return f"step batch-size schedule {self.text!r}: global batch size {steps}"


def parse_step_schedule(text, seq_length):
    """`text` ("THRESHOLD:BS ...", commas allowed) -> ((threshold // seq_length, BS), ...) sorted,
    as Megatron's _parse_schedule; ValueError naming a bad entry."""
    def number(value):
        value = value.strip().upper()
        scale = _SUFFIXES.get(value[-1:], 1)
        return int(float(value[:-1] if scale > 1 else value) * scale)

    steps = []
    for entry in text.replace(",", " ").split():
        threshold, colon, size = entry.partition(":")
        try:
            steps.append((number(threshold) // seq_length, number(size)))
        except ValueError:
            colon = ""
        if not colon:
            raise ValueError(f"entry {entry!r} is not THRESHOLD:BATCH_SIZE (e.g. 0:384 200B:768)")
    return tuple(sorted(steps))


@dataclass(frozen=True)
class BatchSizeRampup(BatchSizeSchedule):
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
    """After the layout and schedule checks: args.batch_size_rampup (a BatchSizeRampup or a
    StepBatchSizeSchedule, or None), and with it --train-iters from --train-samples as Megatron
    counts it."""
    args.batch_size_rampup = None
    if args.step_batch_size_schedule is not None:
        _check_step_schedule(args, check)
        return
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


def _check_step_schedule(args, check):
    flag, per = "--step-batch-size-schedule", max(1, args.micro_batch_size) * getattr(args, "data_parallel_size", 1)
    if not check.require(args.rampup_batch_size is None, f"{flag}: give it or --rampup-batch-size, not both"):
        return
    try:
        steps = parse_step_schedule(args.step_batch_size_schedule, args.seq_length)
    except ValueError as e:
        check.add(f"{flag}: {e}")
        return
    problems = ["no entry" if not steps else None,
                f"the first threshold must be 0, got {steps[0][0] * args.seq_length} tokens"
                if steps and steps[0][0] != 0 else None,
                "thresholds must increase strictly (in samples of --seq-length tokens)"
                if any(a[0] >= b[0] for a, b in zip(steps, steps[1:])) else None,
                next((f"batch size {size} is not a positive multiple of --micro-batch-size {args.micro_batch_size} x "
                      f"data-parallel size {args.data_parallel_size} = {per}" for _, size in steps
                      if size <= 0 or size % per), None)]
    problem = next((p for p in problems if p), None)
    if not check.require(problem is None, f"{flag} {args.step_batch_size_schedule!r}: {problem}"):
        return
    args.batch_size_rampup = StepBatchSizeSchedule(steps, per, args.step_batch_size_schedule)
    if args.train_samples:
        args.train_iters, _ = args.batch_size_rampup.train_iters(args.train_samples)
