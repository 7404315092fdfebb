"""Distributed runs (msrun, CPU backend) against the single-process run.

Every collective of rapidgpt.parallel.comm on sub-groups of 4 ranks against numpy; then the tiny
GPT trained with TP=2, DP=2 and TP=2 x DP=2 must print the single-process run's loss and grad
norm at every iteration, and its validation loss (dropout on: the masks do not depend on the
layout), within 1e-5 relative.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = str(Path(sys.executable).parent)
TINY = ["--task", "pretraining", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
        "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--lr", "1e-3",
        "--lr-warmup-iters", "2", "--log-interval", "1", "--eval-interval", "6", "--eval-iters", "2",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--no-progress-bar", "--max-new-tokens", "0",
        "--train-iters", "12", "--seed", "3", "--make-vocab-size-divisible-by", "96"]
VALUES = re.compile(r"(lm loss(?: value)?|grad norm): ([\d.E+-]+)")
ACCURACY = re.compile(r"validation at epoch \d+ \(iteration \d+\) \| accuracy: ([0-9.]+)")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return dict(os.environ, RAPIDGPT_CACHE_DIR=str(tmp_path_factory.mktemp("cache")), PYTHONUNBUFFERED="1",
                PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


def msrun(nproc, script_and_args, log_dir, env, timeout=300):
    """Run `python script args` on `nproc` ranks; returns (exit status, rank 0's log)."""
    port = 20000 + os.getpid() % 20000
    command = ["msrun", "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_port", str(port),
               "--log_dir", str(log_dir), "--join", "True", "--cluster_time_out", "240"] + script_and_args
    proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    log = Path(log_dir, "worker_0.log")
    return proc.returncode, log.read_text() if log.exists() else proc.stdout + proc.stderr


def values(text):
    return [(name, float(v)) for name, v in VALUES.findall(text)]


def assert_same_run(found, reference):
    assert [name for name, _ in found] == [name for name, _ in reference]
    for (name, ours), (_, expected) in zip(found, reference):
        printed = 1.5e-3 if name == "grad norm" else 0.0    # the log prints 3 decimals: rounding
        assert ours == pytest.approx(expected, rel=1e-5, abs=printed), (name, ours, expected)


@pytest.fixture(scope="module")
def single_process(env):
    out = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + TINY, env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = values(out.stdout)
    assert len(found) == 2 * 12 + 3, out.stdout[-2000:]          # 12 x (loss, norm) + 3 validations
    return found


def test_collectives_on_subgroups_match_numpy(env, tmp_path):
    status, log = msrun(4, ["tests/distributed/comm_worker.py"], tmp_path, env)
    assert status == 0 and "rank 0: comm ok" in log, log[-3000:]


@pytest.mark.parametrize("nproc,tp", [(2, 2), (2, 1), (4, 2)], ids=["tp2", "dp2", "tp2xdp2"])
def test_parallel_run_reproduces_the_single_process_run(env, tmp_path, single_process, nproc, tp):
    status, log = msrun(nproc, ["rapidgpt/cli.py"] + TINY + ["--tensor-model-parallel-size", str(tp)], tmp_path, env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log), single_process)


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
    single = subprocess.run([sys.executable, "-m", "rapidgpt.cli"] + finetune, env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-2000:]
    reference = values(single.stdout) + [("accuracy", float(a)) for a in ACCURACY.findall(single.stdout)]
    assert len(reference) == 2 * 12 + 2
    status, log = msrun(4, ["rapidgpt/cli.py"] + finetune + ["--tensor-model-parallel-size", "2"], tmp_path, env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log) + [("accuracy", float(a)) for a in ACCURACY.findall(log)], reference)
