"""The tests' `rapidgpt` runs, started in batches.

A test asks for a run (`runs(nproc, argv)`: the CLI with `argv` on `nproc` processes) and gets its
exit status, its output (rank 0's) and its --save folder. The first time it asks for a run of some
size, every run of that size the collected test modules declare (`declared_runs`) and that has not
run yet starts with it, one after another in the same processes (tests/distributed/several_runs.py):
a batch pays once for what every run would pay again, msrun's start-up (its scheduler, building the
cluster, every rank importing MindSpore) and MindSpore's first compilations. Measured on 2 CPU
cores: a 2-rank run of the tiny GPT took 47 s alone, of which ~18 s was msrun's start-up and
shut-down.

Each run is still the CLI's own `main(argv)` with a fresh engine, model and optimizer (as the
in-process tests run it several times); what its processes keep between runs is what MindSpore
keeps (the device, the communication groups, the compiled kernels).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SEVERAL_RUNS = "tests/distributed/several_runs.py"
FRAME = re.compile(r"^<<< run (\d+)\n(.*?)^>>> run \1 status (-?\d+|None)\n", re.S | re.M)


def msrun(nproc, script_and_args, log_dir, env, timeout=300):
    """Run `python script args` on `nproc` ranks; returns (exit status, rank 0's log)."""
    port = 20000 + os.getpid() % 20000
    command = ["msrun", "--worker_num", str(nproc), "--local_worker_num", str(nproc), "--master_port", str(port),
               "--log_dir", str(log_dir), "--join", "True", "--cluster_time_out", "240"] + script_and_args
    proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    log = Path(log_dir, "worker_0.log")
    return proc.returncode, log.read_text() if log.exists() else proc.stdout + proc.stderr


def declared_runs(request, attribute):
    """The runs that the modules of the collected tests declare in their list `attribute`, in the
    terms of the fixture that runs them (e.g. test_parallel.py's `runs` fixture: (nproc, tp, *flags))."""
    modules = sorted({item.module for item in request.session.items}, key=lambda m: m.__name__)
    return [key for module in modules for key in getattr(module, attribute, ())]


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
        command_lines = [list(key[1]) + ["--save", str(self.save_folder(key))] for key in batch]
        self.folder.mkdir(parents=True, exist_ok=True)
        runs_file = self.folder / f"{name}.json"
        runs_file.write_text(json.dumps(command_lines))
        timeout = 120 + self.seconds_per_run * len(batch)
        if nproc == 1:
            proc = subprocess.run([sys.executable, SEVERAL_RUNS, str(runs_file)], env=self.env, cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
            status, output = proc.returncode, proc.stdout
        else:
            status, output = msrun(nproc, [SEVERAL_RUNS, str(runs_file)], self.folder / f"{name}_logs", self.env,
                                   timeout)
        framed = {int(k): (text, int(s) if s != "None" else 0) for k, text, s in FRAME.findall(output)}
        for k, key in enumerate(batch):
            # A run that did not finish (its processes died): the job's status and all of its output.
            text, run_status = framed.get(k, (output, status or 1))
            self.done[key] = run_status, text
