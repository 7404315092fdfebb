"""Megatron's batch-size ramp-up (--rampup-batch-size START INCREMENT SAMPLES): the batch sizes and
the number of iterations against a line-by-line port of Megatron-LM's rule, its flag checks, and
a run that follows the ramp and resumes mid-ramp exactly; --iterations-to-skip on the ramp."""
import re
import shutil

import pytest

from rapidgpt.arguments import parse_args
from rapidgpt.config.batch_size_rampup import BatchSizeRampup
from rapidgpt.tasks.pretraining import main as pretrain_main
from rapidgpt.training.checkpoint_files import LATEST
from tensorboard_events import scalars


class MegatronRampup:
    """megatron/core/num_microbatches_calculator.py RampupBatchsizeNumMicroBatchesCalculator.update
    and megatron/training/training.py update_train_iters, as they were before Megatron-LM 532ad926
    replaced them (consistency checks and logging left out)."""

    def __init__(self, global_batch_size, start, increment, samples):
        self.global_batch_size, self.start, self.increment, self.samples = global_batch_size, start, increment, samples
        num_increments = (global_batch_size - start) // increment
        self.rampup_samples_per_increment = samples / num_increments

    def update(self, consumed_samples):
        if consumed_samples > self.samples:
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = self.start + steps * self.increment
            assert self.current_global_batch_size <= self.global_batch_size
        return self.current_global_batch_size

    def train_iters(self, train_samples):
        iterations = 0
        consumed_samples = 0
        while consumed_samples <= self.samples and consumed_samples <= train_samples:
            self.update(consumed_samples)
            consumed_samples += self.current_global_batch_size
            iterations += 1
        self.update(0)
        if train_samples > consumed_samples:
            iterations += (train_samples - consumed_samples) // self.global_batch_size
        return iterations


@pytest.mark.parametrize("gbs, start, increment, samples, train_samples",
                         [(16, 4, 4, 64, 160), (1536, 16, 16, 5859375, 146484375), (64, 8, 8, 100, 1000),
                          (24, 24, 8, 50, 100)])
def test_the_ramp_is_megatrons(gbs, start, increment, samples, train_samples):
    """Batch sizes at every consumed count a run passes through, and the iterations of
    --train-samples. (The second row is the GPT-3 175B script's ramp; START = --global-batch-size,
    where Megatron divides by zero, is a constant batch size here.)"""
    ours = BatchSizeRampup(start, increment, samples, gbs, per_micro_batch=1)
    if start == gbs:
        assert ours.train_iters(train_samples) == (train_samples // gbs, train_samples // gbs * gbs)
        return
    megatron = MegatronRampup(gbs, start, increment, samples)
    consumed = 0
    for _ in range(ours.train_iters(train_samples)[0]):
        assert ours.batch_size_at(consumed) == megatron.update(consumed), consumed
        consumed += ours.batch_size_at(consumed)
    assert ours.train_iters(train_samples) == (megatron.train_iters(train_samples), consumed) and consumed <= train_samples


BASE = ["--task", "pretraining", "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "4", "--global-batch-size", "16", "--lr", "1e-3",
        "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "0", "--hidden-dropout", "0.1",
        "--attention-dropout", "0.1", "--no-progress-bar", "--max-new-tokens", "0", "--seed", "7"]


@pytest.mark.parametrize("flags, message", [
    (["--train-iters", "10"], "--rampup-batch-size: the ramp is counted in samples; give the training length as "
                              "--train-samples"),
    (["--train-samples", "160", "--rampup-batch-size", "4", "5", "64"],
     "--global-batch-size 16 must be START 4 plus a whole number of INCREMENT 5"),
    (["--train-samples", "160", "--rampup-batch-size", "2", "2", "64"],
     "batch size 2 of the ramp is not a multiple of --micro-batch-size 4 x data-parallel size 1 = 4"),
    (["--train-samples", "160", "--rampup-batch-size", "0", "4", "64"], "START, INCREMENT and SAMPLES must be positive"),
    (["--train-samples", "160", "--rampup-batch-size", "4", "4", "0"], "START, INCREMENT and SAMPLES must be positive"),
], ids=["train-iters", "increment", "micro-batch", "zero-start", "zero-samples"])
def test_a_ramp_that_cannot_run_is_one_line(capsys, flags, message):
    argv = BASE + flags + ([] if "--rampup-batch-size" in flags else ["--rampup-batch-size", "4", "4", "64"])
    with pytest.raises(SystemExit) as exit_status:
        parse_args(argv=argv)
    assert exit_status.value.code == 2
    errors = capsys.readouterr().err.strip().split("\n")
    assert len(errors) == 2 and message in errors[0], errors            # the line and argparse's usage hint


LINE = re.compile(r" iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) \|.*? global batch size:\s+(\d+) \| "
                  r"lm loss: ([\d.E+-]+) \|")


def run(capsys, *argv):
    """{iteration: (of, consumed samples, global batch size, lm loss)} and the output."""
    assert pretrain_main(BASE + ["--train-samples", "160", "--rampup-batch-size", "4", "4", "64", *argv]) == 0
    out = capsys.readouterr().out
    return {int(m.group(1)): m.groups()[1:] for m in LINE.finditer(out)}, out


@pytest.mark.usefixtures("demo_cache")
def test_a_run_follows_the_ramp_and_resumes_mid_ramp_exactly(tmp_path, capsys):
    """--rampup-batch-size 4 4 64 to --global-batch-size 16 (micro-batches of 4: 1 to 4 per step),
    --train-samples 160: Megatron's 16 iterations (11 on the ramp, 72 samples, then 5 of 16), each
    logging the port's batch size and the consumed samples; resumed from the checkpoint of
    iteration 5 (consumed 20, before the first increase at 21.3 samples), it prints the
    uninterrupted run's iterations 6-16 and TensorBoard holds the same float32 losses and batch
    sizes."""
    save = tmp_path / "ckpt"
    full, out = run(capsys, "--save", str(save), "--save-interval", "5", "--tensorboard-dir", str(tmp_path / "full"))
    megatron, consumed, expected = MegatronRampup(16, 4, 4, 64), 0, {}
    for i in range(1, megatron.train_iters(160) + 1):
        size = megatron.update(consumed)
        consumed += size
        expected[i] = ("16", str(consumed), str(size))
    assert {i: line[:3] for i, line in full.items()} == expected
    assert [size for _, _, size in expected.values()] == ["4"] * 6 + ["8"] * 3 + ["12"] * 2 + ["16"] * 5
    assert "setting initial batch size to 4" in out and "ramping up batch size from 4 to 8" in out
    assert "ramping up batch size from 12 to 16" in out

    load = tmp_path / "at5"
    shutil.copytree(save / "iter_0000005", load / "iter_0000005")
    (load / LATEST).write_text("5")
    resumed, out = run(capsys, "--load", str(load), "--tensorboard-dir", str(tmp_path / "resumed"))
    assert "setting initial batch size to 4" in out            # consumed 20: still the first size
    assert resumed == {i: full[i] for i in range(6, 17)}
    for tag in ("lm_loss", "batch-size"):
        expected_scalars = {i: v for i, v in scalars(tmp_path / "full", tag).items() if i > 5}
        assert len(expected_scalars) == 11 and scalars(tmp_path / "resumed", tag) == expected_scalars, tag


@pytest.mark.usefixtures("demo_cache")
def test_iterations_to_skip_consume_their_ramped_batch_without_a_step(capsys):
    """--iterations-to-skip 3 8 on the ramp above, as Megatron's dummy_train_step: iterations 3
    (4 samples) and 8 (8 samples) print no line but their samples are consumed, so every other
    iteration has the uninterrupted ramp's batch size and consumed samples; no step is taken, so
    the LR schedule (linear decay over 160 samples; the log shows the rate after the step, as
    Megatron's) does not advance over the skipped samples."""
    lines, out = run(capsys, "--iterations-to-skip", "3", "8")
    megatron, consumed, expected, stepped, stepped_after = MegatronRampup(16, 4, 4, 64), 0, {}, 0, {}
    for i in range(1, megatron.train_iters(160) + 1):
        size = megatron.update(consumed)
        consumed += size
        expected[i] = ("16", str(consumed), str(size))
        stepped += 0 if i in (3, 8) else size
        stepped_after[i] = stepped
    assert {i: line[:3] for i, line in lines.items()} == {i: v for i, v in expected.items() if i not in (3, 8)}
    assert " > iteration 3 skipped (--iterations-to-skip): its 4 samples consumed without a step" in out
    assert " > iteration 8 skipped (--iterations-to-skip): its 8 samples consumed without a step" in out
    logged = {int(i): float(lr) for i, lr in re.findall(r" iteration\s+(\d+)/.*?\| learning rate: ([\d.E+-]+) \|", out)}
    assert logged == pytest.approx({i: 1e-3 * (1 - stepped_after[i] / 160) for i in lines}, rel=1e-5)


# BASE without --global-batch-size, which a step schedule replaces.
NO_GBS = BASE[:BASE.index("--global-batch-size")] + BASE[BASE.index("--global-batch-size") + 2:]


class MegatronStepSchedule:
    """megatron/core/num_microbatches_calculator.py StepBatchsizeNumMicroBatchesCalculator (its
    _parse_numeric_value, _parse_schedule and _get_batch_size_for_samples, with the seq_length Megatron
    passes) and megatron/training/training.py update_train_iters' branch for it, at d98e8a6."""

    def __init__(self, schedule, seq_length):
        self.schedule = []
        for entry in schedule.strip().replace(',', ' ').split():
            threshold_str, batch_size_str = entry.split(':', 1)
            self.schedule.append((self.parse(threshold_str) // seq_length, self.parse(batch_size_str)))
        self.schedule.sort(key=lambda x: x[0])

    @staticmethod
    def parse(value_str):
        value_str = value_str.strip().upper()
        multiplier = 1
        for suffix, scale in (('T', 1_000_000_000_000), ('B', 1_000_000_000), ('M', 1_000_000), ('K', 1_000)):
            if value_str.endswith(suffix):
                multiplier, value_str = scale, value_str[:-1]
                break
        return int(float(value_str) * multiplier)

    def update(self, consumed_samples):
        batch_size = self.schedule[0][1]
        for threshold, bs in self.schedule:
            if consumed_samples >= threshold:
                batch_size = bs
            else:
                break
        return batch_size

    def train_iters(self, train_samples):
        iterations, consumed_samples = 0, 0
        while consumed_samples < train_samples:
            consumed_samples += self.update(consumed_samples)
            iterations += 1
        return iterations


@pytest.mark.parametrize("schedule, seq_length, train_samples",
                         [("0:384 200B:768 400B:1152", 4096, 200_000_000), ("0:768 250B:1536 500B:3072 750B:6144", 8192,
                                                                            190_000_000),
                          ("0:4, 256:8 1K:16", 16, 300), ("0:8 6K:16", 1, 20000)],
                         ids=["15b-release", "megatron-example", "tiny", "samples"])
def test_the_step_schedule_is_megatrons(schedule, seq_length, train_samples):
    """Batch sizes at every consumed count a run passes through, and the iterations of --train-samples
    (the first row is Megatron's gpt3_15b_8t_release schedule)."""
    from rapidgpt.config.batch_size_rampup import StepBatchSizeSchedule, parse_step_schedule
    megatron = MegatronStepSchedule(schedule, seq_length)
    ours = StepBatchSizeSchedule(parse_step_schedule(schedule, seq_length), per_micro_batch=4, text=schedule)
    iterations, consumed = ours.train_iters(train_samples)
    assert iterations == megatron.train_iters(train_samples)
    at = 0
    for _ in range(min(iterations, 5000)):
        assert ours.batch_size_at(at) == megatron.update(at), at
        at += megatron.update(at)
    for threshold, _ in megatron.schedule:      # either side of each step
        for near in (threshold - 1, threshold, threshold + 1):
            assert ours.batch_size_at(max(near, 0)) == megatron.update(max(near, 0))
    assert consumed == ours.consumed_after(iterations) >= train_samples


@pytest.mark.parametrize("flags, message", [
    (["--step-batch-size-schedule", "16:4 256:8"], "the first threshold must be 0, got 16 tokens"),
    (["--step-batch-size-schedule", "0:4 8:8"], "thresholds must increase strictly"),
    (["--step-batch-size-schedule", "0:4 256:6"], "batch size 6 is not a positive multiple of --micro-batch-size 4"),
    (["--step-batch-size-schedule", "0:4 256"], "entry '256' is not THRESHOLD:BATCH_SIZE"),
    (["--step-batch-size-schedule", "0:4", "--global-batch-size", "8"],
     "--global-batch-size: not with --step-batch-size-schedule"),
], ids=["first", "increasing", "multiple", "entry", "global-batch-size"])
def test_a_step_schedule_that_cannot_run_is_one_line(capsys, flags, message):
    argv = NO_GBS + ["--train-samples", "160", *flags]
    with pytest.raises(SystemExit):
        parse_args(argv=argv)
    errors = capsys.readouterr().err.strip().split("\n")
    assert len(errors) == 2 and message in errors[0], errors


@pytest.mark.usefixtures("demo_cache")
def test_a_run_follows_the_step_schedule(capsys):
    """--step-batch-size-schedule "0:4 256:8 1K:16" at 16 tokens a sample (steps at samples 16 and 64),
    micro-batches of 4, --train-samples 120: Megatron's iterations, each logging the port's batch size."""
    assert pretrain_main(NO_GBS + ["--train-samples", "120", "--step-batch-size-schedule", "0:4 256:8 1K:16"]) == 0
    out = capsys.readouterr().out
    lines = {int(m.group(1)): m.groups()[1:4] for m in LINE.finditer(out)}
    megatron, consumed, expected = MegatronStepSchedule("0:4 256:8 1K:16", 16), 0, {}
    iterations = megatron.train_iters(120)
    for i in range(1, iterations + 1):
        size = megatron.update(consumed)
        consumed += size
        expected[i] = (str(iterations), str(consumed), str(size))
    assert lines == expected and [v[2] for v in expected.values()] == ["4"] * 4 + ["8"] * 6 + ["16"] * 4
    assert "setting initial batch size to 4 (step batch-size schedule '0:4 256:8 1K:16'" in out
    assert "ramping up batch size from 8 to 16" in out
