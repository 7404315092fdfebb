"""Distributed runs (msrun, CPU backend) against the single-process run.

Every collective of rapidgpt.parallel.comm on sub-groups of 4 ranks against numpy; then the tiny
GPT trained with TP=2 (with sequence parallelism) and DP=2 (TP=2 x DP=2: with ZeRO, tests/test_zero.py) must print the single-process run's loss and grad
norm at every iteration, and its validation loss (dropout on: the masks do not depend on the
layout), within 1e-5 relative, and end with the same weights (gathered from its per-TP-rank
checkpoint). Checkpoints move between layouts: a TP=2 x DP=2 (ZeRO-2) checkpoint resumes in one process,
continuing the uninterrupted run (a single-process one on PP=2 x TP=2: tests/test_pipeline.py); a TP=2 checkpoint
evaluated in one process (resharded on load, or converted by data_tools/convert_checkpoint.py)
gives the TP=2 run's validation loss.

Recompute: selective recompute at TP=2 with sequence parallelism prints exactly what that run
prints without it. (fp16 on several ranks, and full recompute: tests/test_zero.py.)
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import psutil
import pytest

from batched_runs import BatchedRuns, msrun, tensorboard_of
from rapidgpt.tokenizer import padded_vocab_size
from rapidgpt.training.checkpoint_files import checkpoint_problem, find_checkpoint
from rapidgpt.training.checkpointing import gathered_tensors
from tensorboard_events import scalars

REPO = Path(__file__).resolve().parent.parent
HEADS = 4
TINY = ["--task", "pretraining", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", str(HEADS),
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
        "--lr-warmup-iters", "2", "--log-interval", "1", "--eval-interval", "6", "--eval-iters", "2",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--no-progress-bar", "--max-new-tokens", "0",
        "--train-iters", "12", "--seed", "3", "--make-vocab-size-divisible-by", "96"]
# Megatron's statistics, in the runs that check them (assert_same_statistics) and the full-recompute
# ones, which they once broke at TP=2; not in every run: they add seconds to each step's compile.
STATISTICS = ("--log-num-zeros-in-grad", "--log-params-norm")
VALUES = re.compile(r"((?:lm )?loss(?: value)?|grad norm): ([\d.E+-]+)")      # a Finetuner logs "loss"
FP16 = ("--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "3")
SCALES = re.compile(r" iteration\s+(\d+)/.*?\| loss scale: ([\d.]+) \|.*?number of skipped iterations:\s+(\d+)")
ACCURACY = re.compile(r"validation at epoch \d+ \(iteration \d+\) \| accuracy: ([0-9.]+)")


def values(text, tensorboard=None, pattern=VALUES):
    """[(name, value)] of the losses, grad norms and validation losses a run printed (`pattern`'s
    names), in order. With the run's --tensorboard-dir, each grad norm is its TensorBoard scalar,
    named "grad-norm" (the log's 3 decimals would hide differences up to 5e-4; the losses print 7
    digits)."""
    found = [(name, float(v)) for name, v in pattern.findall(text)]
    if tensorboard is None:
        return found
    precise = [norm for _, norm in sorted(scalars(tensorboard, "grad-norm").items())]
    printed = [i for i, (name, _) in enumerate(found) if name == "grad norm"]
    assert len(precise) == len(printed), (len(precise), len(printed), tensorboard)
    for i, norm in zip(printed, precise):
        assert abs(found[i][1] - norm) <= 5e-4 + 1e-6 * norm, (i, found[i][1], norm)     # the same iteration's
        found[i] = ("grad-norm", norm)
    return found


def assert_close_run(found, reference, rel):
    """`found` and `reference` list the same values (at least one) within `rel`."""
    assert reference and [name for name, _ in found] == [name for name, _ in reference]
    for (name, ours), (_, expected) in zip(found, reference):
        assert ours == pytest.approx(expected, rel=rel), (name, ours, expected)


def assert_layout(save, tp, world_size, pp=1):
    """The run saving to `save` ran on that layout: its checkpoint's metadata records the parallel
    state the ranks actually built (not the flags)."""
    metadata = json.loads(Path(find_checkpoint(str(save)), "metadata.json").read_text())
    parallel = dict(metadata["parallel"])
    stage_layers = parallel.pop("stage_layers", None)          # recorded with pipeline stages
    assert parallel == {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
                        "world_size": world_size}, metadata["parallel"]
    assert (stage_layers is None) == (pp == 1) and (pp == 1 or len(stage_layers) == pp), stage_layers


def parameters_on_rank_0(log):
    """The parameters rank 0 holds, as it counted them in its model."""
    return int(re.search(r"number of parameters on \(tensor, pipeline\) model parallel rank \(0, 0\): (\d+)",
                         log).group(1))


def assert_same_run(found, reference):
    """Every value within 1e-5 relative; a printed grad norm ("grad norm", 3 decimals) within its
    rounding (both lists must take the norms from the same source: the names differ)."""
    assert reference, "the reference run printed no value to compare with"
    assert [name for name, _ in found] == [name for name, _ in reference]
    for (name, ours), (_, expected) in zip(found, reference):
        printed = 1.5e-3 if name == "grad norm" else 0.0
        assert ours == pytest.approx(expected, rel=1e-5, abs=printed), (name, ours, expected)


# The runs of the `runs` fixture (tests/conftest.py) this module's tests ask for (tests/test_zero.py
# declares its own). TP=2 runs with --sequence-parallel: it changes no number (checked against the
# single process), so the TP=2 checkpoint tests use that run too.
SP = ("--sequence-parallel",)
# TP=2 x DP=2 runs with ZeRO-2 (tests/test_zero.py checks that run against the single process).
ZERO2 = ("--zero-2-memory-optimization",)
TINY_RUNS = [(1, 1, *STATISTICS), (2, 2, *SP, *STATISTICS), (2, 1, *STATISTICS), (4, 2, *ZERO2, *STATISTICS),
             (2, 2, *SP, "--recompute-activations", *STATISTICS)]


def tiny_run(nproc, tp, *flags):
    """`(nproc, argv)` of the TINY run on `nproc` processes at TP=`tp` with `flags`, saving every 6
    iterations (the `runs` fixture adds --save)."""
    return nproc, TINY + ["--save-interval", "6", *flags] + (["--tensor-model-parallel-size", str(tp)] if nproc > 1
                                                              else [])


def skipped(log):
    """{iteration: loss scale} of the iterations a run skipped (overflow)."""
    return {int(i): scale for i, scale, count in SCALES.findall(log) if count != "0"}


def single(args, env):
    """Run the CLI in one process: (exit status, its output)."""
    out = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + args, env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    return out.returncode, out.stdout + out.stderr


def checkpoint_of(save, iteration, folder):
    """A --load folder holding only checkpoint `iteration` of `save`."""
    name = f"iter_{iteration:07d}"
    shutil.copytree(Path(save, name), Path(folder, name))
    Path(folder, "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return str(folder)


def assert_same_statistics(save, reference_save, tp, vocab_size, num_layers=2, iterations=12):
    """--log-params-norm's TensorBoard scalar within 1e-5 of the single process's at every
    iteration; --log-num-zeros-in-grad's the same once the zero gradients of the padded vocabulary
    rows are taken off (TP=2 pads to a multiple of 2 x --make-vocab-size-divisible-by: more rows),
    give or take the key biases: their gradient is zero in exact arithmetic (see
    assert_same_weights), so whether one comes out exactly 0.0 depends on the summation order
    (measured: one in one process at iteration 11, none at TP=2). A parameter counted twice, or
    not at all, moves the count by thousands."""
    hidden = int(TINY[TINY.index("--hidden-size") + 1])

    def statistics(save, tp):
        padding = (padded_vocab_size(vocab_size, int(TINY[TINY.index("--make-vocab-size-divisible-by") + 1]), tp)
                   - vocab_size) * hidden
        zeros = {i: count - padding for i, count in scalars(tensorboard_of(save), "num-zeros").items()}
        return scalars(tensorboard_of(save), "params-norm"), zeros
    norms, zeros = statistics(save, tp)
    expected_norms, expected_zeros = statistics(reference_save, 1)
    assert sorted(norms) == sorted(expected_norms) == list(range(1, iterations + 1))
    assert sorted(zeros) == sorted(expected_zeros)
    key_biases = num_layers * hidden
    for i, count in zeros.items():
        assert abs(count - expected_zeros[i]) <= key_biases, (i, count, expected_zeros[i])
    for i, norm in norms.items():
        assert norm == pytest.approx(expected_norms[i], rel=1e-5), (i, norm, expected_norms[i])


def assert_same_weights(tensors, reference, vocab_size):
    """Every model weight equal within 1e-5 and every optimizer tensor within 1e-5 of its largest
    magnitude; vocabulary-padded tensors (their padding differs between TP sizes) compared on the
    true vocabulary, the padding all zeros.

    Why weights in absolute terms (init std 0.02): AdamW moves a weight by about lr * m / sqrt(v)
    per step whatever its gradient's size, so an element whose gradient is a cancellation near
    zero carries the float rounding of another summation order into its steps. Measured: PP=2 x
    TP=2, word embedding (2671, 28), gradient moment 6.3e-6 (the largest: 0.07) with a relative
    rounding difference of 3.5e-5, ends 8.7e-7 from one process after 12 steps at lr 1e-3. The key
    bias is the extreme case (Megatron's qkv bias layout `[heads, 3, head_dim]`, key = 1): its
    gradient is zero in exact arithmetic (q.(k + b) shifts all of a query's scores equally), so its
    value is rounding noise in steps of lr * g / eps, and it changes no output."""
    assert sorted(tensors) == sorted(reference)
    for name, expected in reference.items():
        ours = tensors[name]
        if ours.shape != expected.shape:
            assert not ours[vocab_size:].any() and not expected[vocab_size:].any(), name
            ours, expected = ours[:vocab_size], expected[:vocab_size]
        atol = 1e-5 * np.abs(expected).max() if name.startswith("adam_") else 1e-5
        np.testing.assert_allclose(ours, expected, rtol=0, atol=atol, err_msg=name)


@pytest.mark.ranks
def test_collectives_on_subgroups_match_numpy(env, tmp_path):
    status, log = msrun(4, ["tests/distributed/comm_worker.py"], tmp_path, env)
    assert status == 0 and "rank 0: comm ok" in log, log[-3000:]


@pytest.mark.parametrize("nproc,tp,flags", [(2, 1, ()), (2, 2, SP)], ids=["dp2", "tp2-sequence-parallel"])
def test_parallel_run_reproduces_the_single_process_run(runs, nproc, tp, flags):
    """Also with Megatron's sequence parallelism (learned positions, LayerNorms and the output
    projections' biases on parts of the sequence, their gradients summed over TP)."""
    found, save, log = runs(nproc, tp, *flags, *STATISTICS)
    reference, single_save, reference_log = runs(1, 1, *STATISTICS)
    assert_layout(save, tp=tp, world_size=nproc)
    assert_layout(single_save, tp=1, world_size=1)
    assert parameters_on_rank_0(log) < parameters_on_rank_0(reference_log) if tp > 1 else \
        parameters_on_rank_0(log) == parameters_on_rank_0(reference_log)
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)
    assert_same_statistics(save, single_save, tp, vocab_size)


# fp16 on several ranks: tests/test_zero.py (DP=2 with fp32 gradients, TP=2 x DP=2 ZeRO-3 and Rapidformer's
# 8-rank set, the last two with overflows).


def test_selective_recompute_on_tp2_with_sequence_parallelism_prints_exactly_the_run_without_it(runs):
    """(Full recompute: tests/test_zero.py's PP=2 x DP=2 run and Rapidformer's set, against the
    single process.)"""
    found, _, log = runs(2, 2, *SP, "--recompute-activations", *STATISTICS)
    reference, _, reference_log = runs(2, 2, *SP, *STATISTICS)
    assert "activation recompute: selective (core attention) (2 cells marked)" in log    # the 2 core attentions
    assert "activation recompute" not in reference_log
    assert found == reference


def test_tp2_x_dp2_checkpoint_resumes_in_one_process(runs, env, tmp_path):
    _, save, _ = runs(4, 2, *ZERO2, *STATISTICS)
    reference, _, _ = runs(1, 1, *STATISTICS)
    status, log = single(TINY + ["--load", checkpoint_of(save, 6, tmp_path / "load"),
                                 "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert "resharded checkpoint" in log and "saved at tensor-parallel size 2, resharded to 1" in log
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])    # iterations 7..12, the last 2 validations


def test_tp2_checkpoint_evaluated_in_one_process_gives_the_tp2_validation_loss(runs, env):
    found, save, _ = runs(2, 2, *SP, *STATISTICS)
    status, log = single(TINY + ["--load", str(save), "--skip-train"], env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log), found[-1:])           # "validation loss at the end of training"


def convert_checkpoint(env, load, save, *flags):
    """data_tools/convert_checkpoint.py --load LOAD --save SAVE FLAGS: its stdout (it must succeed)."""
    out = subprocess.run([sys.executable, "data_tools/convert_checkpoint.py", "--load", str(load), "--save", str(save),
                          *flags], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def assert_same_pieces(save, again, rank_dirs, iteration="iter_0000012"):
    """The checkpoint pieces `rank_dirs` of two --save folders hold the same tensors, bit for bit."""
    for rank in rank_dirs:
        original = ms.load_checkpoint(str(Path(save, iteration, rank, "model_optim_rng.ckpt")))
        converted = ms.load_checkpoint(str(Path(again, iteration, rank, "model_optim_rng.ckpt")))
        assert sorted(original) == sorted(converted)
        for name, value in original.items():
            np.testing.assert_array_equal(converted[name].asnumpy(), value.asnumpy(), err_msg=name)


def test_convert_checkpoint_changes_the_tensor_parallel_size(runs, env, tmp_path):
    found, save, _ = runs(2, 2, *SP, *STATISTICS)
    out = convert_checkpoint(env, save, tmp_path / "tp1", "--target-tensor-parallel-size", "1")
    assert "tensor-parallel size 2 -> 1" in out
    assert sorted(os.listdir(tmp_path / "tp1" / "iter_0000012")) == ["merges.txt", "metadata.json", "mp_rank_00",
                                                                     "vocab.json"]
    status, log = single(TINY + ["--load", str(tmp_path / "tp1"), "--skip-train"], env)
    assert status == 0 and "resharded" not in log, log[-3000:]
    assert_same_run(values(log), found[-1:])
    convert_checkpoint(env, tmp_path / "tp1", tmp_path / "tp2", "--target-tensor-parallel-size", "2")
    assert_same_pieces(save, tmp_path / "tp2", ("mp_rank_00", "mp_rank_01"))     # TP 2 -> 1 -> 2


MLP = ["--user-script", "tests/distributed/mlp_finetuner.py", "--micro-batch-size", "8", "--global-batch-size", "16",
       "--epochs", "2", "--lr", "1e-2", "--log-interval", "1", "--no-progress-bar"]
NO_GATHER = ("--no-gather-metrics",)


@pytest.fixture(scope="module")
def mlp_runs(env, tmp_path_factory):
    """A Finetuner's own nn.Cell (tests/distributed/mlp_finetuner.py) in one process and on DP=2
    (with --no-gather-metrics, and gathered with ZeRO-2), the two DP=2 runs in one job:
    `mlp_runs(nproc, *flags) -> (log, its values and accuracies, its --save folder)`."""
    batched = BatchedRuns(env, tmp_path_factory.mktemp("mlp_runs"),
                          [(2, MLP + list(NO_GATHER)), (2, MLP + ["--zero-2-memory-optimization"])])

    def run(nproc, *flags):
        status, log, save = batched(nproc, MLP + list(flags))
        assert status == 0, log[-3000:]
        return log, values(log) + [("accuracy", float(a)) for a in ACCURACY.findall(log)], save
    return run


def test_any_model_gets_data_parallelism_and_tensor_parallelism_needs_its_layers(mlp_runs, env, tmp_path):
    """The user's cell on DP=2, plain and with ZeRO-2 (its gradients and Adam state sharded), prints
    the single-process losses and accuracies; tensor parallelism, which needs RapidGPT's layers,
    refuses it (as ZeRO-3 does: tests/test_zero.py). (The reference does not gather its metrics:
    in one process that changes nothing.)"""
    _, reference, _ = mlp_runs(1, *NO_GATHER)
    assert len(reference) == 2 * 16 + 2
    log, found, _ = mlp_runs(2, "--zero-2-memory-optimization")
    assert "ZeRO stage 2" in log
    assert_same_run(found, reference)
    log, found, _ = mlp_runs(2, *NO_GATHER)
    assert "ZeRO stage 0" in log
    assert_same_run(found, reference)                 # its accuracies combined over the ranks: the next test
    status, log = single(MLP + ["--tensor-model-parallel-size", "2", "--nproc-per-node", "2",    # the launcher:
                                "--log-dir", str(tmp_path)], env)            # it stops the job when a rank fails
    assert status != 0
    assert "--tensor-model-parallel-size 2: the model (SequentialCell) has no tensor-parallel layers" in log


@pytest.mark.ranks
@pytest.mark.parametrize("target", ["launcher", "rank 1"])
def test_sigterm_makes_every_rank_save_at_the_same_step(env, tmp_path, target):
    """Stopping a TP=2 job. Ctrl-C (SIGINT) to the launcher: it passes the same signal on to every
    rank, which report SIGINT (or, the first to get it having stopped the others at the per-step
    agreement, that rank's stop). SIGTERM (pre-emption) to rank 1 alone: rank 0 learns of it through
    the per-step agreement. Either way both ranks save their piece at the same step, the checkpoint
    is published, and the job ends cleanly."""
    save = tmp_path / "ckpt"
    command = [sys.executable, "-m", "rapidgpt.cli"] + TINY + [
        "--train-iters", "100000", "--save", str(save), "--nproc-per-node", "2", "--tensor-model-parallel-size", "2",
        "--log-dir", str(tmp_path / "logs")]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if re.search(r"iteration\s+3/", line):
                break
        if target == "launcher":
            proc.send_signal(signal.SIGINT)
        else:
            # The oldest process with rank 1's environment: the rank itself (processes it starts, e.g.
            # MindSpore's kernel compiler, inherit its environment and were once found too).
            rank_1 = min((p for p in psutil.Process(proc.pid).children(recursive=True)
                          if p.environ().get("MS_ROLE") == "MS_WORKER" and p.environ().get("RANK_ID") == "1"),
                         key=lambda p: p.create_time())
            rank_1.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    # The launcher's SIGINT reaches the ranks at slightly different times: rank 0 (whose log this
    # is) reports it, or, when rank 1 got it before their per-step agreement, that rank's stop.
    reason = r"(?:received SIGINT|1 other rank\(s\) stopping)" if target == "launcher" else r"1 other rank\(s\) stopping"
    assert ("SIGINT passed on to the ranks" in err) == (target == "launcher")
    stopped = int(re.search(rf"exiting at iteration (\d+): {reason}", out).group(1))
    assert stopped >= 3 and (save / "latest_checkpointed_iteration.txt").read_text() == str(stopped)
    assert checkpoint_problem(str(save / f"iter_{stopped:07d}")) is None
    assert sorted(p.name for p in (save / f"iter_{stopped:07d}").iterdir()) == [
        "merges.txt", "metadata.json", "mp_rank_00", "mp_rank_01", "vocab.json"]


def test_a_missing_tensor_parallel_piece_makes_the_checkpoint_incomplete(runs, tmp_path):
    _, save, _ = runs(2, 2, *SP, *STATISTICS)
    load = tmp_path / "load"
    shutil.copytree(save, load)
    shutil.rmtree(load / "iter_0000012" / "mp_rank_01")
    assert checkpoint_problem(str(load / "iter_0000012")) == "mp_rank_01 missing (2 mp_rank_* directories expected)"
    assert find_checkpoint(str(load)) == str(load / "iter_0000006")


@pytest.mark.ranks
def test_finetuner_user_script_on_tp2_x_dp2_reproduces_the_single_process_run(env, tmp_path):
    code = ("from rapidgpt.data.demo_corpus import demo_corpus; p = demo_corpus(); "
            "print(p['vocab_file']); print(p['merge_file'])")
    vocab, merges = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout.split()[-2:]
    finetune = ["--user-script", "user_scripts/finetune_classification.py", "--num-layers", "2", "--hidden-size",
                "32", "--num-attention-heads", "4", "--seq-length", "32", "--no-progress-bar", "--tokenizer-type",
                "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges, "--num-classes", "3",
                "--train-size", "96", "--valid-size", "40", "--micro-batch-size", "8", "--global-batch-size", "16",
                "--epochs", "2", "--lr", "2e-3", "--log-interval", "1", "--hidden-dropout", "0.1",
                "--attention-dropout", "0.1"]
    status, log = single(finetune, env)
    assert status == 0, log[-2000:]
    reference = values(log) + [("accuracy", float(a)) for a in ACCURACY.findall(log)]
    assert len(reference) == 2 * 12 + 2
    status, log = msrun(4, ["rapidgpt/cli.py"] + finetune + ["--tensor-model-parallel-size", "2"], tmp_path, env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log) + [("accuracy", float(a)) for a in ACCURACY.findall(log)], reference)


def test_metrics_a_finetuner_forgot_to_gather_are_combined_over_data_parallel_ranks(mlp_runs):
    """run_compute_metrics without self.gather: on DP=2 each rank scores its own share of the 40
    validation samples (24 and 16). The run warns once, then reports, and keeps best/ by, the
    ranks' sample-weighted mean: for accuracy, the single-process run's value."""
    log, found, _ = mlp_runs(1, *NO_GATHER)
    assert "different values" not in log
    reference = [value for name, value in found if name == "accuracy"]
    assert len(reference) == 2
    log, found, save = mlp_runs(2, *NO_GATHER)
    warning = re.findall(r"WARNING: run_compute_metrics returned different values on the data-parallel ranks "
                         r"\((.*?); samples evaluated: rank 0 24, rank 1 16\)", log)
    assert len(warning) == 1 and "accuracy: rank 0 " in warning[0], log[-3000:]
    assert "gather predictions/labels with self.gather(...) before computing metrics" in log
    accuracies = [value for name, value in found if name == "accuracy"]
    assert accuracies == pytest.approx(reference, abs=1e-6)
    best = json.loads(Path(find_checkpoint(str(save / "best")), "metadata.json").read_text())["best"]
    assert best["value"] == pytest.approx(max(reference), abs=1e-6)
