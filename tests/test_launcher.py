"""`rapidgpt --nproc-per-node 2 ...` starts the ranks through msrun and watches them (rapidgpt/launcher.py).

A tiny user script stands in for training (each msrun job costs ~15 s here): rank 0's output
reaches the terminal and rank 1's does not, both logs are kept; a rank that raises or is killed is
named with the end of its traceback within seconds and nothing of the job survives; Ctrl-C/SIGTERM
stops everything; bad numbers are refused before anything starts.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rapidgpt.cli import main

SCRIPT = """\
import os, signal, sys, time
rank = int(os.environ["RANK_ID"])
print(f"hello from rank {rank} of {os.environ['MS_WORKER_NUM']}", flush=True)
# as MindSpore's C++ code writes its multi-line records, and as Python code writes to stderr
os.write(2, f"[WARNING] SESSION({os.getpid()}) a native record from rank {rank}, old: \\nAbstractTuple{{\\n}}\\n".encode())
print(f"python's stderr on rank {rank}", file=sys.stderr, flush=True)
fail = sys.argv[sys.argv.index("--fail") + 1] if "--fail" in sys.argv else "no"   # the script's own flag
if fail == "slow-peer":                # rank 1 reaches the collective 8 s after rank 0
    import mindspore as ms, numpy as np
    from mindspore import ops
    time.sleep(8 * rank)
    start = time.time()
    try:
        ops.AllReduce()(ms.Tensor(np.ones(2, np.float32))).asnumpy()
        print(f"rank {rank}: reduced after {time.time() - start:.0f} s", flush=True)
    except RuntimeError:
        print(f"rank {rank}: the collective gave up after {time.time() - start:.0f} s", flush=True)
if rank == 1 and fail in ("raise", "kill"):
    time.sleep(1)
    with open("failed_at", "w") as f:
        f.write(repr(time.time()))
    if fail == "raise":
        raise ValueError("rank 1 cannot go on")
    os.kill(os.getpid(), signal.SIGKILL)
if fail not in ("no", "slow-peer"):
    time.sleep(300)                   # as a rank blocked in a collective whose peer is gone
"""
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK")


@pytest.fixture
def job(tmp_path):
    """(command, env) running the test script on 2 ranks from tmp_path."""
    (tmp_path / "s.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARIABLES}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return [sys.executable, "-m", "rapidgpt.cli", "--user-script", "s.py", "--nproc-per-node", "2"], env


def survivors(tmp_path):
    """Processes still running the test script (msrun, its scheduler, workers)."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and p.info["cwd"] == str(tmp_path) \
                and "s.py" in (p.info["cmdline"] or []):
            found.append(p.info["cmdline"])
    return found


def test_rank_0_is_shown_every_rank_is_logged(job, tmp_path):
    command, env = job
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "hello from rank 0 of 2" in out.stdout and "python's stderr on rank 0" in out.stdout
    assert "rank 1" not in out.stdout and "WARNING" not in out.stdout and "AbstractTuple" not in out.stdout
    (log_dir,) = (tmp_path / "rapidgpt_logs").iterdir()              # the default --log-dir
    assert "hello from rank 1 of 2" in (log_dir / "worker_1.log").read_text()
    logs = {p.name for p in log_dir.iterdir()}
    assert {"worker_0.log", "worker_1.log", "scheduler.log", "msrun_node0.log", "mindspore"} <= logs
    for rank in (0, 1):      # native stderr (MindSpore's C++ records) kept per rank, out of the worker log
        assert "AbstractTuple" not in (log_dir / f"worker_{rank}.log").read_text()
        native = (log_dir / "mindspore" / f"rank_{rank}" / "stderr.log").read_text()
        assert f"a native record from rank {rank}, old: \nAbstractTuple{{\n}}\n" in native


@pytest.mark.parametrize("fail,reported,last_line", [
    ("raise", "rank 1 failed (exit code 1)", "ValueError: rank 1 cannot go on"),
    ("kill", "rank 1 failed (killed by signal SIGKILL)", "python's stderr on rank 1"),
])
def test_a_failed_rank_is_named_and_the_job_stopped(job, tmp_path, fail, reported, last_line):
    command, env = job
    out = subprocess.run(command + ["--log-dir", "logs", "--fail", fail], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    ended = time.time()
    assert out.returncode == 1, out.stderr[-3000:]
    assert ended - float((tmp_path / "failed_at").read_text()) < 8       # not msrun's ~30 s time-out
    native = tmp_path / "logs" / "mindspore" / "rank_1" / "stderr.log"
    assert f"rapidgpt: {reported}; stopped the other ranks (MindSpore's native output of the rank: {native})" \
        in out.stderr
    assert out.stderr.rstrip().endswith(last_line), out.stderr[-2000:]
    assert "rank 1" not in out.stdout
    assert survivors(tmp_path) == []


def test_distributed_timeout_minutes_is_how_long_a_collective_waits(job, tmp_path):
    """--distributed-timeout-minutes reaches MindSpore's CPU collectives (MS_CPU_COMM_OP_TIMEOUT,
    whose default gives up after 30 s): at 0.05 minutes rank 0's all-reduce gives up after 3 s
    instead of 30. (The default, 10 minutes, lets a rank still compiling keep the others waiting:
    an all-reduce whose peer came 40 s late passed with the variable at 120 s.)"""
    command, env = job
    out = subprocess.run(command + ["--fail", "slow-peer", "--distributed-timeout-minutes", "0.05"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0: the collective gave up after 3 s" in out.stdout, out.stdout[-2000:]


def test_sigterm_stops_every_rank(job, tmp_path):
    command, env = job
    proc = subprocess.Popen(command + ["--fail", "wait"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "hello from rank 0 of 2\n"            # live, while the job runs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "rapidgpt: SIGTERM: stopped every rank" in err
    assert survivors(tmp_path) == []


@pytest.mark.parametrize("flags,environment,message", [
    (["--nproc-per-node", "3", "--tensor-model-parallel-size", "2"], {},
     "--tensor-model-parallel-size: 3 processes cannot be split into groups of 2 (TP) x 1 (PP)"),
    (["--nproc-per-node", "2", "--nnodes", "2"], {}, "--master-addr: --nnodes 2 needs node 0's address"),
    (["--nproc-per-node", "2"], {"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
     "--node-rank: 2 (or NODE_RANK) is out of range for --nnodes 2"),
    (["--nproc_per_node", "0"], {}, "--nproc-per-node: must be >= 1"),
], ids=["tp", "master", "node-rank", "nproc"])
def test_bad_numbers_are_refused_before_anything_starts(tmp_path, monkeypatch, capsys, flags, environment,
                                                        message):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(SCRIPT)
    with pytest.raises(SystemExit) as exit_:
        main(["--user-script", "s.py", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert any(line.startswith(f"rapidgpt: error: {message}") for line in err), err
    assert err[-1] == "rapidgpt: see 'rapidgpt --help' for every flag"
    assert not (tmp_path / "rapidgpt_logs").exists()


def test_an_unavailable_device_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text(SCRIPT)
    assert main(["--user-script", "s.py", "--nproc-per-node", "2", "--device", "ascend"]) == 2
    assert "rapidgpt: error: --device ascend: this MindSpore installation has no" in capsys.readouterr().err
    assert not (tmp_path / "rapidgpt_logs").exists()


def test_a_log_of_only_mindspore_records_is_not_said_to_be_empty(tmp_path, capsys):
    """A rank killed before it printed anything of its own: its log holds MindSpore's INFO/WARNING
    records only (not echoed, not a traceback). The failure line says so, with the log's size and
    path and its last records, instead of "it printed nothing"; an empty log still printed nothing."""
    from rapidgpt.launcher import _tell
    from rapidgpt.theoretical_memory import format_bytes
    log = tmp_path / "worker_1.log"
    record = ("[WARNING] ME(4242:139872,MainProcess):2025-01-01-00:00:00.000.000 [mindspore/context.py:1] "
              "a setting is deprecated\n")
    last = ("[INFO] ME(4242:139872,MainProcess):2025-01-01-00:00:01.000.000 [mindspore/common/api.py:2] "
            "the last one")
    log.write_text(record * 80 + last + "\n")
    _tell("rank 1 failed (killed by signal SIGKILL); stopped the other ranks", str(log))
    err = capsys.readouterr().err
    assert "printed nothing" not in err
    assert err.startswith(f"rapidgpt: rank 1 failed (killed by signal SIGKILL); stopped the other ranks; its log "
                          f"{log} ({format_bytes(log.stat().st_size)}) holds no output of its own, only MindSpore's "
                          f"records; the last of them:\n"), err
    assert err.splitlines()[-3:] == [record.rstrip("\n"), record.rstrip("\n"), last]
    empty = tmp_path / "worker_0.log"
    empty.write_text("")
    _tell("rank 0 failed (exit code 1); stopped the other ranks", str(empty))
    assert capsys.readouterr().err == \
        f"rapidgpt: rank 0 failed (exit code 1); stopped the other ranks; it printed nothing ({empty})\n"


@pytest.mark.parametrize("flags,environment,directory", [
    (["--log-dir", "runs/logs"], {}, "runs/logs/mindspore"),
    ([], {"RAPIDGPT_CACHE_DIR": "cache"}, "cache/mindspore_logs"),
    (["--log-dir", "runs/logs"], {"GLOG_log_dir": "/mine"}, "/mine"),          # the user's own setting
])
def test_import_rapidgpt_sends_mindspores_records_to_files(tmp_path, flags, environment, directory):
    """Before MindSpore loads, `import rapidgpt` points MindSpore's logger at files: --log-dir's
    mindspore/ (or the cache), records below ERROR off the terminal; a user's GLOG_* is kept."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GLOG_") and k not in ("MS_ROLE", "RAPIDGPT_SET_GLOG")}
    env.update(environment)
    code = "import os, rapidgpt; print(*(os.environ.get(k) for k in ('GLOG_logtostderr', 'GLOG_log_dir', " \
           "'GLOG_stderrthreshold')))"
    out = subprocess.run([sys.executable, "-c", code] + flags, cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["0", str(tmp_path / directory), "3"]
