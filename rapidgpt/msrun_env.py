"""What msrun's environment says about this process (no MindSpore import: the flags are checked
before MindSpore is loaded, and they depend on the job's world size)."""
import os


def launched_by_msrun():
    """True in a process that msrun started (a worker or the scheduler)."""
    return "MS_ROLE" in os.environ


def is_msrun_scheduler():
    """True in the scheduler process msrun starts beside the workers, with the same command line."""
    return os.environ.get("MS_ROLE") == "MS_SCHED"


def launched_world_size():
    """The job's number of processes as msrun announces it to its workers (1 outside msrun)."""
    return int(os.environ.get("MS_WORKER_NUM", "1")) if launched_by_msrun() else 1
