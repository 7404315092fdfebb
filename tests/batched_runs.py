"""The tests' `rapidgpt` runs, started in batches.

`BatchedRuns(...)(nproc, argv)` runs the CLI with `argv` on `nproc` processes and returns its exit
status, its output (rank 0's) and its --save folder (its --tensorboard-dir: `tensorboard_of(save)`).
The first time a run of some size is asked for, every run of that size in `planned` (what the
collected test modules declare: `declared_runs`) that has not run yet starts with it, one after
another in the same processes (tests/distributed/several_runs.py): a batch pays once for what
every run would pay again, msrun's start-up (its scheduler, building the cluster, every rank
importing MindSpore). Measured on 2 CPU cores: a 2-rank run of the tiny GPT took 47 s alone, of
which ~18 s was msrun's start-up and shut-down. (Selecting one test with -k still starts every planned run of its size.)

Each run is still the CLI's own `main(argv)` with a fresh engine, model, optimizer, logger and
parallel state, as the in-process tests run it several times. What a process keeps between runs:
MindSpore's device and compiled kernels, rapidgpt.parallel.comm's joined job and communication
groups (keyed by ranks: one batch has one world size), the CPU thread count set by its first run
(the same for every run of one size), the tokenizer files read (by path) and the checkpoint files
verified (by modification time).

A run's status is the first non-zero one of its ranks; its output is rank 0's, followed by the end
of a failed rank's. A run the batch did not reach (an earlier one failed or the job timed out) is
reported as failed, saying which.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
SEVERAL_RUNS = "tests/distributed/several_runs.py"
START = re.compile(r"^<<< run (\d+)$", re.M)
END = re.compile(r"^>>> run (\d+) status (-?\d+) seconds [\d.]+$", re.M)


def run_to_end(command, env, timeout, **kwargs):
    """`subprocess.run(command)` that, on time-out, kills every process it started (msrun starts
    its scheduler and workers in their own sessions) -> (exit status or None on time-out, stdout)."""
    proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True, **kwargs)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        started = psutil.Process(proc.pid).children(recursive=True)
        for p in [proc, *started]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        out, _ = proc.communicate()
        return None, out


def msrun(nproc, script_and_args, log_dir, env, timeout=300):
    """Run `python script args` on `nproc` ranks; returns (exit status, rank 0's log) (status None:
    timed out, every process killed)."""
    port = 20000 + os.getpid() % 20000
    command = ["msrun", "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_port", str(port),
               "--log_dir", str(log_dir), "--join", "True", "--cluster_time_out", "240"] + script_and_args
    status, out = run_to_end(command, env, timeout, stderr=subprocess.STDOUT)
    log = Path(log_dir, "worker_0.log")
    return status, log.read_text() if log.exists() else out


def tensorboard_of(save):
    """The --tensorboard-dir BatchedRuns gives the run saving to `save`."""
    return Path(save).parent / "tensorboard"


def declared_runs(request, attribute):
    """The runs that the modules of the collected tests declare in their list `attribute`, in the
    terms of the fixture that runs them (e.g. the `runs` fixture of tests/conftest.py: (nproc, tp,
    *flags))."""
    modules = sorted({item.module for item in request.session.items}, key=lambda m: m.__name__)
    return [key for module in modules for key in getattr(module, attribute, ())]


def frames(output):
    """{run: (its output, its status, or None when it did not end)} of one process's output."""
    starts = list(START.finditer(output))
    ends = {int(m.group(1)): m for m in END.finditer(output)}
    found = {}
    for i, start in enumerate(starts):
        k = int(start.group(1))
        stop = starts[i + 1].start() if i + 1 < len(starts) else len(output)
        end = ends.get(k)
        if end is not None and start.end() <= end.start() <= stop:
            found[k] = output[start.end():end.start()], int(end.group(2))
        else:
            found[k] = output[start.end():stop], None
    return found


class BatchedRuns:
    """`runs(nproc, argv) -> (exit status, output, --save folder)`, each run done once; `planned`:
    the `(nproc, argv)` runs to start together with the first one of their size that is asked for."""

    def __init__(self, env, folder, planned=(), seconds_per_run=240):
        self.env, self.folder, self.seconds_per_run = env, Path(folder), seconds_per_run
        self.planned = list(dict.fromkeys((nproc, tuple(argv)) for nproc, argv in planned))
        self.done, self.saves, self.batches = {}, {}, 0

    def save_folder(self, key):
        if key not in self.saves:
            self.saves[key] = self.folder / f"run_{len(self.saves)}" / "ckpt"
        return self.saves[key]

    def __call__(self, nproc, argv):
        key = (nproc, tuple(argv))
        if key not in self.done:
            batch = [key] + [k for k in self.planned if k[0] == nproc and k != key and k not in self.done]
            self._run(nproc, batch)
        status, log = self.done[key]
        return status, log, self.save_folder(key)

    def _run(self, nproc, batch):
        self.batches += 1
        name = f"batch_{self.batches}_{nproc}_ranks"
        command_lines = [list(key[1]) + ["--save", str(self.save_folder(key)),
                                         "--tensorboard-dir", str(tensorboard_of(self.save_folder(key)))]
                         for key in batch]
        self.folder.mkdir(parents=True, exist_ok=True)
        runs_file = self.folder / f"{name}.json"
        runs_file.write_text(json.dumps(command_lines))
        timeout = 120 + self.seconds_per_run * len(batch)
        if nproc == 1:
            status, output = run_to_end([sys.executable, SEVERAL_RUNS, str(runs_file)], self.env, timeout,
                                        stderr=subprocess.STDOUT)
            outputs = [output]
        else:
            logs = self.folder / f"{name}_logs"
            status, output = msrun(nproc, [SEVERAL_RUNS, str(runs_file)], logs, self.env, timeout)
            outputs = [Path(logs, f"worker_{rank}.log").read_text() if Path(logs, f"worker_{rank}.log").exists()
                       else "" for rank in range(nproc)]
        ranks = [frames(out) for out in outputs]
        why = "timed out" if status is None else f"exit status {status}"
        for k, key in enumerate(batch):
            if k not in ranks[0]:
                self.done[key] = 1, (f"not run: the batch's job ({nproc} processes, {runs_file}) ended "
                                     f"({why}) before it came to this run; its output ends:\n{output[-3000:]}")
                continue
            text = ranks[0][k][0]
            statuses = [found.get(k, ("", None))[1] for found in ranks]
            failed = [rank for rank, s in enumerate(statuses) if s != 0]
            if failed and failed[0] != 0:
                text += f"\n[rank {failed[0]}'s output of this run ends]\n" + ranks[failed[0]].get(k, ("", 0))[0][-3000:]
            run_status = next((s for s in statuses if s), 0) if all(s is not None for s in statuses) else 1
            self.done[key] = run_status, text
