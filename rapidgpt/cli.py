"""The `rapidgpt` console script: `--task NAME` runs a black-box task, `--user-script FILE` runs
your trainer file with all the flags (it builds its RapidGPTEngine, which parses them).

With --nproc-per-node x --nnodes > 1 it starts that many ranks through msrun instead
(rapidgpt/launcher.py), each running this same command line: in those processes msrun's
environment says the role, and the scheduler only serves the job while a worker joins it first."""
import argparse
import importlib
import os
import runpy
import sys

from rapidgpt import __version__


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = argparse.ArgumentParser(prog="rapidgpt", add_help=False, allow_abbrev=False)
    launcher.add_argument("--task")
    launcher.add_argument("--user-script")
    launcher.add_argument("--version", action="store_true")
    launcher.add_argument("-h", "--help", action="store_true")
    known, _ = launcher.parse_known_args(argv)
    if known.version:
        print(f"rapidgpt {__version__}")
        return 0
    if known.help and known.user_script and os.path.isfile(known.user_script):
        known.help = False         # the script's engine prints the help, with the script's own flags
    if known.help or not (known.task or known.user_script):
        from rapidgpt.arguments import build_parser
        build_parser().print_help()
        if not known.help:
            print("\nrapidgpt: error: give --task pretraining or --user-script FILE", file=sys.stderr)
            return 2
        return 0
    if known.task and known.user_script:
        print("rapidgpt: error: give either --task or --user-script, not both", file=sys.stderr)
        return 2
    if known.task:
        from rapidgpt.arguments import TASKS
        if known.task not in TASKS:
            print(f"rapidgpt: error: --task {known.task}: choose one of {', '.join(TASKS)}", file=sys.stderr)
            return 2
        task = importlib.import_module(f"rapidgpt.tasks.{known.task}")
        return _run_or_launch(argv, lambda: task.main(argv), getattr(task, "before_launch", None))
    if not os.path.isfile(known.user_script):
        print(f"rapidgpt: error: --user-script {known.user_script}: no such file", file=sys.stderr)
        return 2
    sys.argv = [known.user_script] + argv
    return _run_or_launch(argv, lambda: runpy.run_path(known.user_script, run_name="__main__"))


def _run_or_launch(argv, run, before_launch=None):
    """`run()` here, or start the ranks when the flags ask for several processes (after
    `before_launch(args)`, the task's work to do once per node). In a process msrun started: the
    scheduler only serves the job (and ends there); a worker sets its device and joins the job
    before `run` does anything (MindSpore wants both before the first tensor; the engine then
    finds them done)."""
    from rapidgpt.parallel import comm
    if comm.is_msrun_scheduler():
        comm.serve_as_scheduler()
        return 0
    from rapidgpt.arguments import build_parser
    flags = build_parser().parse_known_args(argv)[0]            # validated by the engine, or by launch()
    if comm.launched_by_msrun():
        import mindspore as ms

        from rapidgpt.engine import MINDSPORE_DEVICE, select_device
        device = select_device(flags.device)
        ms.set_device(MINDSPORE_DEVICE[device])
        comm.init_distributed(device)
    elif flags.nproc_per_node * flags.nnodes != 1:
        from rapidgpt.launcher import launch
        return launch(argv, before_launch)
    return _reported(run)


def _reported(run, *args, **kwargs):
    """Run; a RapidGPT error (bad checkpoint or data) becomes one line and exit status 1."""
    from rapidgpt.data.classification import ClassificationDataError
    from rapidgpt.data.indexed_dataset import IndexedDatasetError
    from rapidgpt.training.checkpointing import CheckpointError
    try:
        result = run(*args, **kwargs)
        return result if isinstance(result, int) else 0
    except (CheckpointError, ClassificationDataError, IndexedDatasetError) as e:
        print(f"rapidgpt: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
