"""Megatron's rerun state machine (--rerun-mode, --error-injection-*, --check-for-*): the machine's
paths against Megatron's (exit codes, messages, what is re-run and held) with a scripted step, the
compiled step's hold rule against numpy, the tracker file against a port of Megatron's rule, and
whole runs: a held step changes nothing (fp16 loss scale, Adam, weights), so runs with injected
errors or report_stats print the plain run's losses, and a checkpoint saved to re-run from
resumes into the plain run."""
import datetime
import math
import re

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from rapidgpt.arguments import ArgumentError
from rapidgpt.config.rerun import RerunConfig, _checks, iterations_rejected_twice
from rapidgpt.optim import OptimizerWrapper, build_optimizer
from rapidgpt.optim.grad_scaler import DynamicGradScaler
from rapidgpt.optim.mixed_precision import rejected
from rapidgpt.tasks.pretraining import main as pretrain_main
from rapidgpt.training.rerun_state_machine import (EXIT_CODE_FAILED_ON_RESULT_VALIDATION,
                                                   EXIT_CODE_RESUME_TO_DISAMBIGUATE, NO_LIMIT, RerunStateMachine,
                                                   ResultRejected, relative_difference)
from rapidgpt.training.step import StepResult, TrainStep

from test_engine import _forward, _model_and_batch, make_engine, validate


def held_by(loss, norm, validation):
    """The compiled step's rule (rapidgpt.optim.mixed_precision.rejected), restated."""
    loss_limit, norm_limit, non_finite, hold = validation
    too_large = (math.isfinite(loss) and loss >= loss_limit) or (math.isfinite(norm) and norm >= norm_limit)
    return bool(hold) or (bool(non_finite) and not (math.isfinite(loss) and math.isfinite(norm))) or too_large


class ScriptedStep:
    """`step(validation)` returning the scripted (loss, norm) of each call in turn (the last one
    repeats), held as the compiled step would hold it; it records every call's validation."""

    def __init__(self, *values):
        self.values, self.calls = list(values), []

    def __call__(self, validation):
        loss, norm = self.values[min(len(self.calls), len(self.values) - 1)]
        self.calls.append(validation)
        held = validation is not None and held_by(loss, norm, validation)
        return StepResult(loss, norm, not held and math.isfinite(norm), 1.0, held=held)


class Log:
    def __init__(self):
        self.lines = []

    def info(self, line):
        self.lines.append(line)

    warning = error = info

    def text(self):
        return "\n".join(self.lines)


def machine(mode="validate_results", nan=True, spiky=False, large=False, rate=0, kind="transient_error",
            identity=("node-a", 0), tracker=None, rank=0, world_size=1, suspects_gathered=None):
    config = RerunConfig(mode, _checks(nan, spiky, large), rate, kind, tracker)
    log = Log()
    gathered = suspects_gathered or [identity]

    def gather(values):
        assert len(values) == 257            # length, device, 255 bytes of the host name
        rows = []
        for node, device in gathered:
            encoded = list(node.encode())
            rows.append([len(encoded), device] + encoded + [0] * (255 - len(encoded)))
        return np.array(rows, np.float64)
    return RerunStateMachine(config, 5, rank, world_size, log, identity, gather, lambda flag: flag), log


def first_step(rerun):
    assert rerun.run_step(1, ScriptedStep((2.0, 1.0))).exit_code is None    # never checked: no checkpoint yet


def test_the_first_step_is_not_checked_and_a_good_step_runs_once():
    rerun, log = machine(rate=0)
    step = ScriptedStep((float("nan"), float("nan")))
    outcome = rerun.run_step(1, step)
    assert outcome.exit_code is None and step.calls == [[NO_LIMIT, NO_LIMIT, 0.0, 0.0]]   # skipped as an overflow
    step = ScriptedStep((2.0, 1.0))
    outcome = rerun.run_step(2, step)
    assert outcome.exit_code is None and outcome.result.updated and step.calls == [[NO_LIMIT, NO_LIMIT, 1.0, 0.0]]
    assert log.lines == ["Result validation enabled"]


def test_a_nan_loss_reproduced_in_place_saves_and_exits_16_then_a_resume_elsewhere_tells_a_persistent_error():
    rerun, log = machine(identity=("node-a", 3))
    first_step(rerun)
    step = ScriptedStep((float("nan"), float("nan")))
    outcome = rerun.run_step(2, step)
    assert (outcome.save, outcome.exit_code) == (True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)
    assert step.calls == [[NO_LIMIT, NO_LIMIT, 1.0, 0.0], [NO_LIMIT, NO_LIMIT, 0.0, 1.0]]    # both held
    text = log.text()
    assert "Unexpected result nan on rank 0 at iteration #2 invocation #1 (message='found NaN in local forward " \
           "loss calculation')" in text
    assert "Rank 0, node node-a, device 3, iteration #2: First rerun: unexpected result is reproducible within the " \
           "tolerance (nan = nan). Need to rerun on a different GPU to verify correctness.!" in text
    assert "Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun the last " \
           "iteration and establish a diagnostic" in text
    state = rerun.state_dict()
    assert state["suspects"] == [("node-a", 3)] and state["iteration"] == 2

    again, log = machine(identity=("node-a", 3))                 # resumed on the same device
    again.load_state_dict(state, same_layout=True)
    outcome = again.run_step(2, ScriptedStep((float("nan"), float("nan"))))
    assert (outcome.save, outcome.exit_code) == (False, EXIT_CODE_RESUME_TO_DISAMBIGUATE)
    assert "Got rescheduled on the same GPU. Need to resume again from the same checkpoint (node: node-a, gpu: 3)" \
        in log.text()

    elsewhere, log = machine(identity=("node-b", 0))             # on another device the loss is fine
    elsewhere.load_state_dict(state, same_layout=True)
    step = ScriptedStep((2.5, 1.0))
    outcome = elsewhere.run_step(2, step)
    assert outcome.exit_code == EXIT_CODE_FAILED_ON_RESULT_VALIDATION and step.calls == [[NO_LIMIT, NO_LIMIT, 0.0, 1.0]]
    assert "Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely " \
           "incorrect (2.5 != nan)" in log.text()
    assert "Rank 0, node node-b, device 0, iteration #2: Possible persistent error!!" in log.text()


def test_a_nan_loss_not_reproduced_is_a_transient_error_and_exits_17():
    rerun, log = machine()
    first_step(rerun)
    outcome = rerun.run_step(2, ScriptedStep((float("nan"), 1.0), (2.0, 1.0)))
    assert (outcome.save, outcome.exit_code) == (False, EXIT_CODE_FAILED_ON_RESULT_VALIDATION)
    assert "Rank 0, node node-a, device 0, iteration #2: Possible transient error!!" in log.text()
    assert "Exiting now. The job can be resumed from a previous checkpoint" in log.text()


@pytest.mark.parametrize("kind, in_place, elsewhere", [
    ("transient_error", EXIT_CODE_FAILED_ON_RESULT_VALIDATION, None),
    ("persistent_error", EXIT_CODE_RESUME_TO_DISAMBIGUATE, "Possible persistent error!!"),
    ("correct_result", EXIT_CODE_RESUME_TO_DISAMBIGUATE,
     "Correct result (but possible Application error) (found NaN in local forward loss calculation)!"),
])
def test_injected_errors_take_megatrons_paths(kind, in_place, elsewhere):
    """--error-injection-rate 1: the first check (the loss's NaN check) of every checked step is
    rejected; the injected type decides whether the re-runs reproduce it (the values never differ)."""
    rerun, log = machine(rate=1, kind=kind)
    first_step(rerun)
    step = ScriptedStep((2.0, 1.0))
    outcome = rerun.run_step(2, step)
    assert outcome.exit_code == in_place and step.calls[0][3] == 1.0          # the initial run is held
    names = {"transient_error": "Transient error", "persistent_error": "Persistent error",
             "correct_result": "Expected result"}
    assert f"Injecting error type {names[kind]}" in log.text()
    if elsewhere is None:
        assert "Possible transient error!!" in log.text()
        return
    resumed, log = machine(rate=1, kind=kind, identity=("node-b", 0))
    resumed.load_state_dict(rerun.state_dict(), same_layout=True)
    assert resumed.run_step(2, ScriptedStep((2.0, 1.0))).exit_code == EXIT_CODE_FAILED_ON_RESULT_VALIDATION
    assert elsewhere in log.text()
    assert "Exiting now. A checkpoint at the last iteration already exists if further examination is needed" \
        in log.text()


def test_injection_draws_follow_megatrons_rule_on_every_rank_alike():
    """A check is hit when (draw + rank) % rate == 0 on some rank: with 4 ranks and rate 8, each of
    a step's 6 checks is hit with probability 1/2; every rank finds the same check (so all hold
    the step), and a rank says so only when it was hit itself."""
    hits, said = {}, {}
    for rank in range(4):
        rerun, log = machine(rate=8, large=True, spiky=True, rank=rank, world_size=4)
        hits[rank] = [rerun._injection(i) for i in range(2, 402)]
        said[rank] = len(log.lines)
    assert hits[0] == hits[1] == hits[2] == hits[3]
    injected = sum(h is not None for h in hits[0])
    assert 0.95 < injected / 400 <= 1.0                # 1 - (1/2)^6 = 0.984
    assert sum(said.values()) >= injected and all(0 < n < injected for n in said.values())
    assert [hits[0].count(i) / injected for i in range(2)] == pytest.approx([0.5 / 0.984, 0.25 / 0.984], abs=0.08)


def test_a_spiky_loss_is_told_after_100_samples_and_its_rerun_is_applied():
    """--check-for-spiky-loss: a loss >= 10x the largest of the first 100 checked steps' (the graph
    gets that limit in float32) is rejected; the check is not fatal: the re-run is applied and
    training goes on, whether it reproduces the spike or not."""
    rerun, log = machine(spiky=True)
    first_step(rerun)
    for i in range(2, 102):
        assert rerun.run_step(i, ScriptedStep((3.0 + i / 1000, 1.0))).exit_code is None
    assert "Max value for loss: 3.101" in log.text()
    limit = float(np.float32(3.101 * 10))
    step = ScriptedStep((limit, 1.0), (limit, 1.0))                 # reproduced: a real spike
    outcome = rerun.run_step(102, step)
    assert step.calls == [[limit, NO_LIMIT, 1.0, 0.0], [NO_LIMIT, NO_LIMIT, 1.0, 0.0]]
    assert outcome.exit_code is None and outcome.result.updated and not outcome.result.held
    assert "Continuing normal execution because failed validation was not fatal" in log.text()
    assert "Rank 0, node node-a, device 0, iteration #102: First rerun: unexpected result is reproducible" in log.text()
    just_below = float(np.nextafter(np.float32(limit), np.float32(0)))
    assert rerun.run_step(103, ScriptedStep((just_below, 1.0))).result.updated


def test_report_stats_runs_every_step_twice_the_first_held():
    rerun, log = machine(mode="report_stats", large=True)
    for i, second_norm in zip((1, 2, 3), (1.0, 1.0, 1.1)):
        step = ScriptedStep((2.0, 1.0), (2.0, second_norm))
        outcome = rerun.run_step(i, step)
        assert [c[3] for c in step.calls] == [1.0, 0.0] and outcome.result.grad_norm == second_norm
    text = log.text()
    assert text.count("Stats on computation determinism in validation calls") == 2     # iterations 1 and 3
    assert "  From validation call 'found NaN in local forward loss calculation':\n    3 samples, all identical" in text
    difference = relative_difference(1.0, 1.1)
    assert (f"    3/2 total/identical samples, rel. variability: avg= {difference / 3:.3E}, p50= 0.000E+00"
            in text)


def test_disabled_stops_at_a_nan_loss_in_one_line_and_only_warns_of_a_spike():
    rerun, log = machine(mode="disabled", spiky=True)
    with pytest.raises(ResultRejected, match=r"Rank 0, node node-a, device 0, iteration 1: Unexpected result nan "
                                             r"\(message='found NaN in local forward loss calculation'\); "
                                             r"--rerun-mode validate_results re-runs"):
        rerun.run_step(1, ScriptedStep((float("nan"), float("nan"))))


def test_a_pending_rerun_is_ignored_when_the_layout_changed():
    rerun, _ = machine()
    first_step(rerun)
    rerun.run_step(2, ScriptedStep((float("nan"), 1.0)))
    resumed, log = machine()
    resumed.load_state_dict(rerun.state_dict(), same_layout=False)
    assert "Job sharding has changed: Rerun state will be ignored" in log.text()
    assert resumed.run_step(2, ScriptedStep((2.0, 1.0))).exit_code is None


def test_every_ranks_device_is_recorded_and_any_rank_back_on_its_device_restarts_again():
    devices = [("node-a", 0), ("node-a", 1), ("node-b", 0), ("node-b", 1)]
    rerun, _ = machine(rank=2, world_size=4, identity=devices[2], suspects_gathered=devices)
    first_step(rerun)
    rerun.run_step(2, ScriptedStep((float("inf"), 1.0)))
    state = rerun.state_dict()
    assert state["suspects"] == devices and state["failed_check"] == "found Inf in local forward loss calculation"
    resumed, log = machine(rank=1, world_size=4, identity=("node-c", 0))
    resumed.any_rank = lambda flag: True                       # another rank got its old device back
    resumed.load_state_dict(state, same_layout=True)
    assert resumed.run_step(2, ScriptedStep((float("inf"), 1.0))).exit_code == EXIT_CODE_RESUME_TO_DISAMBIGUATE


def megatron_skipped_iterations(tracker_file_name):
    """megatron/core/rerun_state_machine.py RerunStateMachine.get_skipped_iterations_from_tracker_file
    at d98e8a6, logging left out."""
    iterations_to_potentially_skip, iterations_to_ignore = set(), set()
    iterations_seen, iterations_seen_by_job = set(), {}
    regex = r"ts=.+ node=.+ device=.+ jobID=(.+) rank=(.+) iteration=(.+) status=(.+) result=.+ message=.+"
    with open(tracker_file_name) as f:
        for line in f.readlines():
            match = re.search(regex, line)
            if match:
                job, rank, iteration = str(match[1]), int(match[2]), int(match[3])
                status = str(match[4]).split(".")[-1].upper()
                if status in ["RERUN_DISABLED", "FIRST_RERUN_REPRODUCIBLE", "SECOND_RERUN_REPRODUCIBLE"]:
                    if (rank, iteration) in iterations_seen:
                        iterations_to_potentially_skip.add(iteration)
                    iterations_seen.add((rank, iteration))
                    iterations_seen_by_job.setdefault(job, {}).setdefault(iteration, set()).add(rank)
                    if len(iterations_seen_by_job[job][iteration]) > 1:
                        iterations_to_ignore.add(iteration)
    return sorted(iterations_to_potentially_skip - iterations_to_ignore)


def test_the_tracker_file_skips_megatrons_iterations(tmp_path):
    """Lines written by the machine itself, and Megatron's enum spelling of a status, in random
    mixes: the iterations to skip equal a port of Megatron's rule."""
    rng = np.random.default_rng(0)
    statuses = ["initial_run", "first_rerun_not_reproducible", "first_rerun_reproducible", "rerun_disabled",
                "second_rerun_reproducible", "RerunValidationStatus.FIRST_RERUN_REPRODUCIBLE"]
    for trial in range(20):
        path = tmp_path / f"tracker{trial}.txt"
        with open(path, "w") as f:
            for _ in range(30):
                f.write(f"ts={datetime.datetime.now()} node=n{rng.integers(2)} device=0 jobID={rng.integers(2)} "
                        f"rank={rng.integers(3)} iteration={rng.integers(1, 6)} status={rng.choice(statuses)} "
                        f"result=nan message='found NaN in local forward loss calculation'\n")
        assert iterations_rejected_twice(path) == megatron_skipped_iterations(path)
    tracker = tmp_path / "written.txt"
    rerun, _ = machine(mode="disabled", tracker=str(tracker))
    for _ in range(2):
        with pytest.raises(ResultRejected):
            rerun.run_step(4, ScriptedStep((float("nan"), 1.0)))
    assert iterations_rejected_twice(tracker) == megatron_skipped_iterations(tracker) == [4]
    args = validate("--train-iters", "10", "--result-rejected-tracker-filename", str(tracker),
                    "--iterations-to-skip", "7")
    assert args.iterations_to_skip == [4, 7]


def test_flags():
    args = validate("--train-iters", "10", "--fp16")
    assert [c.message for c in args.rerun.checks] == [] and not args.rerun.validates
    assert not getattr(args, "megatron_flag_lines", [])
    args = validate("--train-iters", "10", "--fp16", "--error-injection-rate", "10")
    assert args.megatron_flag_lines == [" > --error-injection-rate: no result is checked (under fp16's dynamic loss "
                                        "scale NaN and Inf are the scaler's signal, as in Megatron); add "
                                        "--check-for-spiky-loss or --check-for-large-grads"]
    args = validate("--train-iters", "10", "--fp16", "--loss-scale", "8", "--check-for-large-grads")
    assert [(c.value, c.rejects, c.fatal) for c in args.rerun.checks] == [
        ("loss", "nan", True), ("loss", "inf", True), ("grad norm", "nan", True), ("grad norm", "inf", True),
        ("grad norm", "large", False)]
    assert not validate("--train-iters", "10", "--no-check-for-nan-in-loss-and-grad").rerun.validates
    with pytest.raises(ArgumentError, match="--error-injection-rate: -1 must be 0"):
        validate("--train-iters", "10", "--error-injection-rate", "-1")
    with pytest.raises(ArgumentError, match="--result-rejected-tracker-filename /no/such/dir/t.txt: cannot be "
                                            "appended to"):
        validate("--train-iters", "10", "--result-rejected-tracker-filename", "/no/such/dir/t.txt")


# ---- the compiled step ------------------------------------------------------------------------------

def test_the_graph_holds_what_the_host_rule_holds():
    inf, nan = math.inf, math.nan
    cases = [(2.0, 1.0, [inf, inf, 0, 0]), (2.0, 1.0, [inf, inf, 0, 1]), (2.0, 1.0, [2.0, inf, 0, 0]),
             (2.0, 1.0, [2.5, inf, 0, 0]), (2.0, 1.0, [inf, 1.0, 0, 0]), (nan, 1.0, [inf, inf, 0, 0]),
             (nan, 1.0, [inf, inf, 1, 0]), (2.0, inf, [inf, inf, 1, 0]), (inf, 1.0, [1.0, inf, 0, 0]),
             (2.0, nan, [inf, 0.5, 0, 0])]
    graph = ms.jit(rejected)
    for loss, norm, validation in cases:
        held = graph(Tensor(loss, ms.float32), Tensor(norm, ms.float32), Tensor(validation, ms.float32))
        assert bool(held) == held_by(loss, norm, validation), (loss, norm, validation)


def test_a_held_step_changes_nothing_and_the_scaler_keeps_its_state():
    args = make_engine("--hidden-dropout", "0", "--attention-dropout", "0").args
    model, batch = _model_and_batch(args, 4)
    step = TrainStep(_forward(model), OptimizerWrapper.around(build_optimizer(args, model.trainable_params()), 1.0), 1)
    stacked = {k: Tensor(v[None]) for k, v in batch.items()}
    before = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    held = step(stacked, 1e-3, 1, [NO_LIMIT, NO_LIMIT, 1.0, 1.0])
    assert held.held and not held.updated and math.isfinite(held.loss)
    for p in model.trainable_params():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=p.name)
    limited = step(stacked, 1e-3, 1, [held.loss, NO_LIMIT, 1.0, 0.0])        # the loss at its limit
    assert limited.held and limited.loss == held.loss and limited.grad_norm == held.grad_norm
    applied = step(stacked, 1e-3, 1, [NO_LIMIT, NO_LIMIT, 1.0, 0.0])
    assert applied.updated and not applied.held and applied.loss == held.loss
    assert any(not np.array_equal(p.asnumpy(), before[p.name]) for p in model.trainable_params())

    scaler = DynamicGradScaler(1024.0, 1.0, 2, 1)
    update = ms.jit(scaler.update)
    update(Tensor(True), Tensor(True))
    assert float(scaler.scale) == 1024.0 and int(scaler.hysteresis_tracker) == 1
    update(Tensor(True), Tensor(False))
    assert float(scaler.scale) == 512.0


# ---- whole runs -------------------------------------------------------------------------------------

RUN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
       "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--train-iters", "6",
       "--log-interval", "1", "--no-progress-bar", "--max-new-tokens", "0", "--eval-iters", "0", "--seed", "3"]
LINE = re.compile(r"^ iteration\s+(\d+)/.*$", re.MULTILINE)
TIMES = ("elapsed time per iteration (ms)", "tokens per second")


def values(line):
    """An iteration line's fields but its times: loss, loss scale, grad norm (the last two absent
    when the step overflowed), skipped and nan counts, consumed samples, learning rate."""
    fields = (field.split(":") for field in line.split("|")[1:] if ":" in field)
    return {name.strip(): value.strip() for name, value in fields if name.strip() not in TIMES}


def run(capsys, *argv, code=0):
    """{iteration: {field: value}} and the output of a run exiting `code`."""
    if code:
        with pytest.raises(SystemExit) as stopped:
            pretrain_main(RUN + list(argv))
        assert stopped.value.code == code
    else:
        assert pretrain_main(RUN + list(argv)) == 0
    out = capsys.readouterr().out
    return {int(m[1]): values(m[0]) for m in LINE.finditer(out)}, out


@pytest.mark.usefixtures("demo_cache")
def test_fp16_runs_with_every_step_held_and_rerun_print_the_plain_runs_values(capsys):
    """fp16 with its dynamic loss scale (the NaN checks off, so injection hits the spiky-loss check,
    which is not fatal): every checked step is held, re-run and then applied. The losses, loss
    scales (overflows included), grad norms and skipped counts are the plain run's: a held step
    moves neither the weights, Adam's state, nor the scaler. report_stats' runs, each step held
    once, print them too."""
    fp16 = ["--fp16", "--initial-loss-scale", "1048576", "--loss-scale-window", "2", "--hysteresis", "1",
            "--check-for-spiky-loss"]
    plain, _ = run(capsys, *fp16)
    assert [line["loss scale"] for line in plain.values()] == ["524288.0", "262144.0", "262144.0", "131072.0",
                                                               "131072.0", "262144.0"]     # backed off and grew
    assert [line["number of skipped iterations"] for line in plain.values()] == ["1", "1", "0", "1", "0", "0"]
    injected, out = run(capsys, *fp16, "--error-injection-rate", "1", "--error-injection-type", "transient_error")
    assert injected == plain
    assert out.count("Injecting error type Transient error") == 5
    assert out.count("Possible transient error!!") == 5
    assert out.count("Continuing normal execution because failed validation was not fatal") == 5
    stats, out = run(capsys, *fp16, "--rerun-mode", "report_stats")
    assert stats == plain and "    5 samples, all identical" in out


@pytest.mark.usefixtures("demo_cache")
def test_a_reproduced_error_saves_the_iteration_before_which_resumes_into_the_plain_run(capsys, tmp_path):
    """--error-injection-type persistent_error: iteration 2 is held, reproduced in place, and the
    run saves iteration 1 and exits 16. Resumed on the same device it exits 16 again (no new
    checkpoint); resumed with --rerun-mode disabled it continues as the plain run did."""
    plain, _ = run(capsys)
    save = tmp_path / "ckpt"
    flags = ["--save", str(save), "--load", str(save), "--save-interval", "100"]
    lines, out = run(capsys, *flags, "--error-injection-rate", "1", "--error-injection-type", "persistent_error",
                     code=EXIT_CODE_RESUME_TO_DISAMBIGUATE)
    assert lines == {1: plain[1]} and sorted(p.name for p in save.iterdir()) == ["iter_0000001",
                                                                                 "latest_checkpointed_iteration.txt"]
    assert "First rerun: unexpected result is reproducible within the tolerance" in out
    lines, out = run(capsys, *flags, "--error-injection-rate", "1", "--error-injection-type", "persistent_error",
                     code=EXIT_CODE_RESUME_TO_DISAMBIGUATE)
    assert lines == {} and "Getting RerunStateMachine state from checkpoint. Will rerun step." in out
    assert "Got rescheduled on the same GPU" in out and not (save / "iter_0000002").exists()
    lines, out = run(capsys, *flags, "--rerun-mode", "disabled")
    assert lines == {i: plain[i] for i in range(2, 7)}
    assert "RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint" in out
