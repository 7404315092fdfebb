"""Several `rapidgpt` command lines, one after another in this process:

    python tests/distributed/several_runs.py RUNS.json        (a JSON list of argument lists)

Under msrun every rank runs the same list, so a batch of test runs pays msrun's start-up (its
scheduler, building the cluster, every rank importing MindSpore) once instead of once per run.
Each run is the CLI's own `main(argv)`, as `python -m rapidgpt.cli ARGV` runs it; its output is
framed by the lines `<<< run K` and `>>> run K status S` (S: its exit status), read by
tests/batched_runs.py.
"""
import json
import sys
import traceback

from rapidgpt.cli import main
from rapidgpt.msrun_env import is_msrun_scheduler

with open(sys.argv[1]) as f:
    command_lines = json.load(f)
if is_msrun_scheduler():                 # serves the job until every worker has left
    sys.exit(main(command_lines[0]))
for k, argv in enumerate(command_lines):
    print(f"<<< run {k}", flush=True)
    try:
        status = main(argv)
    except SystemExit as e:              # a flag error: exit status 2, as from a terminal
        status = e.code
    except Exception:                    # as the interpreter would report it, then the next run
        traceback.print_exc()
        status = 1
    sys.stderr.flush()
    print(f">>> run {k} status {status}", flush=True)
