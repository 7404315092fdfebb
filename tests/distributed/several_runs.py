"""Several `rapidgpt` command lines, one after another in this process:

    python tests/distributed/several_runs.py RUNS.json        (a JSON list of argument lists)

Under msrun every rank runs the same list, so a batch of test runs pays msrun's start-up (its
scheduler, building the cluster, every rank importing MindSpore) once instead of once per run.
Each run is the CLI's own `main(argv)`, as `python -m rapidgpt.cli ARGV` runs it; its output is
framed by the lines `<<< run K` and `>>> run K status S seconds T` (S: its exit status on this rank,
T: its wall time, which tells where a batch's time went), read by tests/batched_runs.py. Each marker is one write, so another thread's log line cannot split it.

In one process a failed run does not stop the list. Under msrun the first run that fails on this
rank ends the process with its status: the other ranks would otherwise wait for this one in that
run's collectives, or pair its next run's collectives with them, and msrun then stops the job.
It leaves at once (os._exit): an ordinary exit runs MindSpore's finalization, which waits for the
other ranks to finalize too, and they wait in the failed run (measured: 10 min, the collective
time-out, before the job ended).
"""
import json
import os
import sys
import time
import traceback

from rapidgpt.cli import main
from rapidgpt.msrun_env import is_msrun_scheduler, launched_by_msrun


def marker(line):
    sys.stdout.write(f"\n{line}\n")
    sys.stdout.flush()


with open(sys.argv[1]) as f:
    command_lines = json.load(f)
if is_msrun_scheduler():                 # serves the job until every worker has left
    sys.exit(main(command_lines[0]))
for k, argv in enumerate(command_lines):
    marker(f"<<< run {k}")
    started = time.perf_counter()
    try:
        status = main(argv)
    except SystemExit as e:              # a flag error: exit status 2, as from a terminal
        status = e.code if isinstance(e.code, int) else 1
    except Exception:                    # reported as the interpreter would report it
        traceback.print_exc()
        status = 1
    sys.stderr.flush()
    marker(f">>> run {k} status {status} seconds {time.perf_counter() - started:.1f}")
    if status and launched_by_msrun():
        sys.stdout.flush()
        os._exit(status)
