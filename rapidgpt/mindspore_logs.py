"""Where MindSpore's own log records go: into files, not onto the terminal.

MindSpore (its C++ core, its Python modules, the graph compiler) writes INFO/WARNING records to
stderr by default; some span several lines (a graph pass's abstract values), so they cannot be
filtered out of a rank's output line by line. RapidGPT points MindSpore's logger (the GLOG_*
variables, read once when MindSpore loads) at files instead:

    <dir>/rank_<N>/logs/mindspore.log.<pid>      MindSpore's layout under GLOG_log_dir

with `<dir>` = `--log-dir`/mindspore (several processes: the job's log directory, default
./rapidgpt_logs/DATE-TIME, beside every rank's worker_N.log), or, for one process without
--log-dir, `mindspore_logs/` in RapidGPT's cache (~/.cache/rapidgpt or $RAPIDGPT_CACHE_DIR).
Records of ERROR and above still reach stderr too: they are real problems. A GLOG_* variable the
user set is kept, and nothing changes once MindSpore is loaded (a user script that imports
MindSpore before RapidGPT keeps MindSpore's defaults).

In a rank msrun started that is not enough: MindSpore's C++ modules there (the cluster's
DISTRIBUTED records, a graph pass's SESSION warnings) still write WARNING records to the process's
stderr (measured with MindSpore 2.10, the GLOG_* variables set as above). So a rank also moves its
native stderr (file descriptor 2, where MindSpore's C++ code writes) to
`<dir>/rank_<N>/stderr.log` and keeps Python's `sys.stderr` (RapidGPT's lines, tqdm, tracebacks,
which msrun writes to worker_N.log and rank 0 echoes) on the original stream.
"""
import contextlib
import io
import os
import sys

from rapidgpt.msrun_env import launched_by_msrun
from rapidgpt.utils import cache_root, flag_value

LOGGER_VARIABLES = ("GLOG_logtostderr", "GLOG_log_dir", "GLOG_stderrthreshold")
ERROR = "3"                # GLOG_stderrthreshold: 0 DEBUG, 1 INFO, 2 WARNING, 3 ERROR
# Which GLOG_* variables RapidGPT set (inherited by the processes it starts, which then know they
# are not the user's), and those the user set (taken at `import rapidgpt`).
SET_BY_RAPIDGPT = "RAPIDGPT_SET_GLOG"
_USER_SET = frozenset(name for name in LOGGER_VARIABLES
                      if name in os.environ and name not in os.environ.get(SET_BY_RAPIDGPT, "").split(","))
_DIVERTED = False


def records_environment(directory):
    """The GLOG_* settings that send MindSpore's records below ERROR to files under `directory`,
    without those the user set."""
    wanted = {"GLOG_logtostderr": "0", "GLOG_log_dir": directory, "GLOG_stderrthreshold": ERROR}
    settings = {name: value for name, value in wanted.items() if name not in _USER_SET}
    return {**settings, SET_BY_RAPIDGPT: ",".join(settings)}


def route_records_of_this_process(argv=None):
    """Called by `import rapidgpt`, before MindSpore loads: this process's records to `--log-dir`
    (from the command line, `argv`, default sys.argv)/mindspore, or to the cache. A rank msrun
    started inherits the launcher's settings."""
    if "mindspore" in sys.modules or launched_by_msrun():
        return
    log_dir = flag_value(sys.argv if argv is None else argv, "--log-dir")
    directory = os.path.join(log_dir, "mindspore") if log_dir else os.path.join(cache_root(), "mindspore_logs")
    os.environ.update(records_environment(os.path.abspath(directory)))


def records_line(rank):
    """The start-up line saying where this rank's MindSpore records are (None: on the terminal)."""
    directory = os.environ.get("GLOG_log_dir")
    if os.environ.get("GLOG_logtostderr", "1") != "0" or not directory:
        return None
    return f" > MindSpore's own log records: {os.path.join(directory, f'rank_{rank}')}"


def divert_native_stderr(rank):
    """In a rank msrun started: file descriptor 2 into `<GLOG_log_dir>/rank_<rank>/stderr.log`,
    `sys.stderr` kept on the stream msrun gave the rank (module docstring). Nothing when MindSpore's
    records are meant for the terminal (GLOG_logtostderr not 0, a user's choice)."""
    global _DIVERTED
    path = _native_stderr_file(rank)
    if _DIVERTED or path is None:
        return        # a process may run several command lines (the tests' batched runs): once
    _DIVERTED = True
    python_stream = _point_native_stderr_at(path)
    sys.stderr = io.TextIOWrapper(io.FileIO(python_stream, "w"), encoding=sys.stderr.encoding,
                                  errors="backslashreplace", line_buffering=True, write_through=True)


def _native_stderr_file(rank):
    """`<GLOG_log_dir>/rank_<rank>/stderr.log` (its folder created), or None when MindSpore's records
    are meant for the terminal (GLOG_logtostderr not 0, a user's choice)."""
    directory = os.environ.get("GLOG_log_dir")
    if os.environ.get("GLOG_logtostderr", "1") != "0" or not directory:
        return None
    path = os.path.join(directory, f"rank_{rank}", "stderr.log")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def _point_native_stderr_at(path):
    """File descriptor 2 appended to `path`; returns a duplicate of the previous descriptor 2."""
    sys.stderr.flush()
    previous = os.dup(2)
    native = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(native, 2)
    os.close(native)
    return previous


@contextlib.contextmanager
def native_stderr_in_records(rank):
    """File descriptor 2 into the rank's stderr.log for a `with` block (a no-op where
    `divert_native_stderr` did it already, or records go to the terminal). For MindSpore work that
    writes records to stderr whatever GLOG_stderrthreshold says: its graph cache writes WARNING
    records on saving and loading a graph and, loading some graphs, ERROR records of a graph it
    then runs correctly (measured with MindSpore 2.10)."""
    path = None if _DIVERTED else _native_stderr_file(rank)
    if path is None:
        yield
        return
    previous = _point_native_stderr_at(path)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(previous, 2)
        os.close(previous)
