"""The `rapidgpt` console script: `--task NAME` runs a black-box task, `--user-script FILE` runs
your trainer file with all the flags (it builds its RapidGPTEngine, which parses them).

The command line is checked before MindSpore is imported: every problem is reported at once, one
line each, in a fraction of a second. With a user script, flags the engine does not know may be
the script's own: the script's engine checks those.

With --nproc-per-node x --nnodes > 1 it starts that many ranks through msrun instead
(rapidgpt/launcher.py), each running this same command line: in those processes msrun's
environment says the role, and the scheduler only serves the job while a worker joins it first."""
import argparse
import difflib
import importlib
import os
import runpy
import sys

from rapidgpt import __version__
from rapidgpt.arguments import TASKS
from rapidgpt.errors import UserError
from rapidgpt.flag_parser import PROG, report_and_exit
from rapidgpt.mindspore_logs import divert_native_stderr
from rapidgpt.msrun_env import is_msrun_scheduler, launched_by_msrun

USAGE = f"""usage: {PROG} --task {{{','.join(TASKS)}}} [flags]
       {PROG} --user-script FILE [flags]        your Pretrainer/Finetuner file
       {PROG} --help                            every flag, by group (Megatron-LM's names)"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    launcher.add_argument("--task")
    launcher.add_argument("--user-script")
    launcher.add_argument("--version", action="store_true")
    launcher.add_argument("-h", "--help", action="store_true")
    known, _ = launcher.parse_known_args(argv)
    if known.version:
        print(f"{PROG} {__version__}")
        return 0
    if known.help and known.user_script and os.path.isfile(known.user_script):
        known.help = False         # the script's engine prints the help, with the script's own flags
    if known.help:
        from rapidgpt.arguments import build_parser
        build_parser().print_help()
        return 0
    if not (known.task or known.user_script):
        print(USAGE, file=sys.stderr)
        print(f"{PROG}: error: give --task NAME or --user-script FILE", file=sys.stderr)
        return 2
    if is_msrun_scheduler():       # msrun runs this command line in its scheduler too: it only serves
        from rapidgpt.parallel import comm
        comm.serve_as_scheduler()
        return 0
    if known.task and not known.user_script:      # with a script, --task is the script's (args.task)
        if known.task not in TASKS:
            close = difflib.get_close_matches(known.task, TASKS, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            report_and_exit([f"--task: {known.task} is not a task; {hint}choose one of {', '.join(TASKS)}"])
        from rapidgpt.arguments import parse_args
        args = parse_args(argv=argv, launcher=True)      # exits 2 on any problem, MindSpore not loaded
        task = importlib.import_module(f"rapidgpt.tasks.{known.task}")
        return _run_or_launch(argv, args, lambda: task.main(args=args), getattr(task, "before_launch", None))
    script = known.user_script
    if not os.path.isfile(script):
        report_and_exit([f"--user-script: {script}: no such file; check the path"])
    _check_syntax(script)
    sys.argv = [script] + argv
    run = lambda: runpy.run_path(script, run_name="__main__")      # noqa: E731
    if {"-h", "--help"} & set(argv):
        return _reported(run)          # the script's engine prints the help, with the script's own flags
    from rapidgpt.arguments import parse_args
    args = parse_args(argv=argv, launcher=True, user_script=True)     # the script's own flags pass here
    return _run_or_launch(argv, args, run)


def _check_syntax(script):
    """A user script that does not compile: its file:line and the error, not the engine's frames."""
    with open(script, "rb") as f:
        source = f.read()
    try:
        compile(source, script, "exec")
    except SyntaxError as e:
        where = f"{e.filename}:{e.lineno}" + (f":{e.offset}" if e.offset else "")
        line = (e.text or "").rstrip("\n")
        caret = f"\n    {line}\n    {' ' * max((e.offset or 1) - 1, 0)}^" if line else ""
        print(f"{PROG}: error: --user-script: {where}: {e.msg}{caret}", file=sys.stderr)
        sys.exit(2)


def _run_or_launch(argv, args, run, before_launch=None):
    """`run()` here, or start the ranks when the flags ask for several processes (after
    `before_launch(args)`, the task's work to do once per node). A worker msrun started sets its
    device and joins the job before `run` does anything (MindSpore wants both before the first
    tensor; the engine then finds them done), once per process: a process may run several command
    lines one after another (`main(argv)` again), and MindSpore sets a device only once."""
    if launched_by_msrun():
        divert_native_stderr(os.environ.get("RANK_ID", "0"))
        from rapidgpt.device import ensure_device, select_device
        from rapidgpt.parallel import comm
        device = select_device(args.device)
        ensure_device(device)
        comm.set_collective_timeout(args.distributed_timeout_minutes)
        comm.init_distributed(device)
    elif args.nproc_per_node * args.nnodes != 1:
        from rapidgpt.launcher import launch
        return launch(argv, before_launch)
    return _reported(run)


def _reported(run, *args, **kwargs):
    """Run; an error of the user's input (bad checkpoint, data, hook, flag) becomes one line and
    exit status 1."""
    try:
        result = run(*args, **kwargs)
        return result if isinstance(result, int) else 0
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
