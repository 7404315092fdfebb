"""What msrun's environment says about this process (no MindSpore import: the flags are checked
before MindSpore is loaded, and they depend on the job's world size)."""
import os

# The file in which the rapidgpt launcher writes the signal the user sent (SIGINT, SIGTERM) before
# it passes it on to the ranks as SIGTERM, so that they report what the user did.
STOP_SIGNAL_VARIABLE = "RAPIDGPT_STOP_SIGNAL_FILE"


def launched_by_msrun():
    """True in a process that msrun started (a worker or the scheduler)."""
    return "MS_ROLE" in os.environ


def is_msrun_scheduler():
    """True in the scheduler process msrun starts beside the workers, with the same command line."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"


def passed_on_signal(received):
    """The name of the signal behind `received` (a signal name): in a rank, a SIGTERM the launcher
    passed on is reported as the signal the user sent it."""
    path = os.environ.get(STOP_SIGNAL_VARIABLE)
    if received == "SIGTERM" and path and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip() or received
    return received


def launched_world_size():
    """The job's number of processes as msrun announces it to its workers (1 outside msrun)."""
    return int(os.environ.get("MS_WORKER_NUM", "1")) if launched_by_msrun() else 1
