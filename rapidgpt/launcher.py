"""Multi-process runs: `rapidgpt` starts the ranks through MindSpore's launcher msrun and watches them.

    rapidgpt --user-script s.py --nproc-per-node 2 ...
        -> msrun --worker_num 2 ... python -m rapidgpt.cli --user-script s.py --nproc-per-node 2 ...

msrun is the process manager: it starts a scheduler and this node's workers, each running this same
command line (`rapidgpt.cli` knows its role from msrun's environment: the scheduler only serves the
rendezvous, a worker joins the job and runs the task or script), writes each worker's output to
LOG_DIR/worker_N.log and kills the other workers when one exits non-zero. `rapidgpt` only watches:

- rank 0's output is echoed to the terminal as it is written; MindSpore's own log records go to
  LOG_DIR/mindspore/rank_N/logs/ (rapidgpt/mindspore_logs.py), and any INFO/WARNING record still
  written to a rank's output (a user's GLOG_* settings) stays in worker_N.log; the other ranks are
  not echoed;
- msrun reports a worker's non-zero exit within a second ("Worker process PID exit with exception.
  Error code: C", C < 0 for a signal); rapidgpt then names the rank, prints the tail of its
  traceback, stops msrun, its scheduler and every worker, and exits with status 1, instead of
  msrun's wait for the scheduler's ~30 s time-out followed by a generic message;
- Ctrl-C or SIGTERM (pre-emption) is passed on to the workers, which save (with --save) and stop
  together at the next step boundary; a second one stops the whole job at once, the way a failure
  does. If rapidgpt itself dies msrun gets SIGINT, on which it kills its workers and scheduler: no
  process of the job outlives rapidgpt.
"""
import codecs
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import time

import psutil

from rapidgpt.arguments import parse_args
from rapidgpt.mindspore_logs import records_environment
from rapidgpt.msrun_env import STOP_SIGNAL_VARIABLE
from rapidgpt.device import select_device

POLL_SECONDS = 0.2
STOP_GRACE_SECONDS = 3.0
TRACEBACK_LINES = 15
# msrun's own line when a worker ends with a non-zero status (negative: killed by that signal).
WORKER_FAILED = re.compile(r"Worker process (\d+) exit with exception\. Error code: (-?\d+)")
# MindSpore's log records below ERROR (one line each, possibly after a progress bar's text): kept in
# the logs, not echoed to the terminal.
MINDSPORE_CHATTER = re.compile(r"\[(DEBUG|INFO|WARNING)\] [A-Z_]+\(\d+[,:][^\r\n]*\n?")
PR_SET_PDEATHSIG = 1


def launch(argv, prepare=None):
    """Validate the flags for nproc-per-node x nnodes processes, run them through msrun, watch them
    and return the exit status: 0 (also after a Ctrl-C/SIGTERM passed on to ranks that saved and
    stopped), 1 when a rank or msrun failed, 128 + signal when the job was stopped at once.
    `prepare(args)`: work done once on this node before its ranks start (e.g. the demo corpus)."""
    args = parse_args(argv=argv, launcher=True, user_script=True)    # cli.py checked a task's flags strictly
    try:
        select_device(args.device)          # fail here, not once per rank
    except ValueError as e:
        print(f"rapidgpt: error: {e}", file=sys.stderr)
        return 2
    on_master_node = args.node_rank == 0
    if args.master_port is not None and on_master_node and _port_in_use(args.master_port):
        print(f"rapidgpt: error: --master-port (or MASTER_PORT) {args.master_port} is in use on this machine; "
              f"choose another, or leave it out to get a free one", file=sys.stderr)
        return 2
    log_dir = os.path.abspath(args.log_dir or os.path.join("rapidgpt_logs", time.strftime("%Y%m%d-%H%M%S")))
    os.makedirs(log_dir, exist_ok=True)
    first = args.node_rank * args.nproc_per_node
    ranks = range(first, first + args.nproc_per_node)
    here = f"rank {first}" if len(ranks) == 1 else f"ranks {first}-{ranks[-1]}"
    print(f"rapidgpt: {args.world_size} processes (tensor parallel {args.tensor_model_parallel_size} x pipeline "
          f"{args.pipeline_model_parallel_size} x data parallel {args.data_parallel_size}) through msrun; this "
          f"node runs {here}{'' if on_master_node else ', rank 0 prints on node 0'}; every rank's log is "
          f"under {log_dir}", file=sys.stderr)
    if prepare is not None:
        prepare(args)
    msrun_log = os.path.join(log_dir, f"msrun_node{args.node_rank}.log")
    job = Job(msrun_command(args, argv, log_dir), log_dir, ranks, msrun_log, echo_rank=0 if on_master_node else None)
    return job.run()


def msrun_command(args, argv, log_dir):
    """msrun (its module, so the same MindSpore installation) starting `python -m rapidgpt.cli ARGV` on
    this node's ranks. Without --master-port a one-node job takes a free port."""
    python = "python" if os.path.exists(os.path.join(os.path.dirname(sys.executable), "python")) else "python3"
    return [sys.executable, "-m", "mindspore.parallel.cluster.run",
            "--worker_num", str(args.world_size), "--local_worker_num", str(args.nproc_per_node),
            "--node_rank", str(args.node_rank), "--master_addr", args.master_addr or "127.0.0.1",
            "--master_port", str(args.master_port or _free_port()), "--log_dir", log_dir, "--join", "True",
            # a rank that does not exist: msrun tails no worker log (rapidgpt echoes rank 0 itself)
            "--tail_worker_log", str(args.world_size),
            python, "-m", "rapidgpt.cli", *argv]


def _free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _port_in_use(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


class _Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum, frame):
    raise _Interrupted(signum)


def _die_with_parent():
    """In msrun, before it starts: SIGINT when rapidgpt dies (msrun then kills its workers and scheduler)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGINT)


class Follow:
    """The new text of a file another process is writing, in whole lines (a carriage return ends a
    line too, so progress bars move)."""

    def __init__(self, path):
        self.path, self.file, self.partial = path, None, ""
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def lines(self, final=False):
        if self.file is None:
            if not os.path.exists(self.path):
                return []
            self.file = open(self.path, "rb")       # noqa: SIM115 (kept open while the job runs)
        pieces = re.split(r"(?<=[\r\n])", self.partial + self.decoder.decode(self.file.read(), final))
        self.partial = "" if final else pieces.pop()
        return [piece for piece in pieces if piece]


class Job:
    """msrun and what it started on this node, watched until the job ends, fails or is interrupted."""

    def __init__(self, command, log_dir, ranks, msrun_log, echo_rank):
        self.command, self.log_dir, self.local_ranks, self.msrun_log = command, log_dir, list(ranks), msrun_log
        self.echo_rank = echo_rank
        self.echo = Follow(self.worker_log(echo_rank)) if echo_rank is not None else None
        self.rank_of = {}                     # worker pid -> global rank
        self.passed_on = None                 # the signal passed on to the workers, once
        self.msrun = None

    @property
    def stop_signal_file(self):
        return os.path.join(self.log_dir, ".stop_signal")

    def worker_log(self, rank):
        return os.path.join(self.log_dir, f"worker_{rank}.log")

    def native_log(self, rank):
        """What MindSpore's C++ code wrote to the rank's stderr (rapidgpt/mindspore_logs.py)."""
        return os.path.join(self.log_dir, "mindspore", f"rank_{rank}", "stderr.log")

    def run(self):
        stop_signals = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.signal(s, _interrupt) for s in stop_signals}
        env = dict(os.environ, PYTHONUNBUFFERED="1",     # rank 0's lines reach the log, and the terminal, at once
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                   **{STOP_SIGNAL_VARIABLE: self.stop_signal_file},
                   **records_environment(os.path.join(self.log_dir, "mindspore")))
        if os.path.exists(self.stop_signal_file):       # left by an earlier job in the same --log-dir
            os.remove(self.stop_signal_file)
        try:
            with open(self.msrun_log, "w") as out:
                self.msrun = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                              start_new_session=True,
                                              preexec_fn=_die_with_parent)  # noqa: PLW1509 (no threads here)
            failure = self._watch()
        except _Interrupted as e:
            failure = e
        finally:
            for s in stop_signals:
                signal.signal(s, signal.SIG_IGN)
            if self.msrun is not None:
                self._stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
        self._echo(final=True)
        if isinstance(failure, _Interrupted):
            print(f"rapidgpt: {signal.Signals(failure.signum).name}: stopped every rank", file=sys.stderr)
            return 128 + failure.signum
        if failure is not None:
            pid, code = failure
            # a worker that died before it could be mapped is one of the ranks not mapped yet
            unmapped = set(self.local_ranks) - set(self.rank_of.values())
            rank = self.rank_of[pid] if pid in self.rank_of else min(unmapped)
            how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            _tell(f"rank {rank} failed ({how}); stopped the other ranks", self.worker_log(rank),
                  shown=rank == self.echo_rank, native=self.native_log(rank))
            return 1
        if self.msrun.returncode != 0:
            scheduler_log = os.path.join(self.log_dir, "scheduler.log")    # on the node that runs it
            _tell(f"msrun failed (status {self.msrun.returncode})",
                  scheduler_log if os.path.exists(scheduler_log) else self.msrun_log)
            return 1
        return 0

    def _watch(self):
        """Until msrun ends (None) or reports a failed worker ((pid, code)). The first Ctrl-C or
        SIGTERM is passed on to this node's workers as SIGTERM: in training they save (with --save)
        and stop at the next step boundary, every rank at the same one; a second signal, or one
        before every worker is known, stops the job at once (raises _Interrupted)."""
        msrun_lines = Follow(self.msrun_log)
        while self.msrun.poll() is None:
            try:
                self._find_workers()
                self._echo()
                for line in msrun_lines.lines():
                    failed = WORKER_FAILED.search(line)
                    if failed and self.passed_on and int(failed.group(2)) == -signal.SIGTERM:
                        raise _Interrupted(self.passed_on)     # a worker outside training just ends
                    if failed:
                        return int(failed.group(1)), int(failed.group(2))
                time.sleep(POLL_SECONDS)
            except _Interrupted as e:
                if self.passed_on is not None or len(self.rank_of) < len(self.local_ranks):
                    raise
                self.passed_on = e.signum
                name = signal.Signals(e.signum).name
                # Passed on as SIGTERM (MindSpore's workers do not all see a SIGINT), with the
                # signal the user sent written where the ranks read it to report it.
                with open(self.stop_signal_file, "w") as f:
                    f.write(name)
                for pid in self.rank_of:
                    try:
                        os.kill(pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
                print(f"rapidgpt: {name} passed on to the ranks: they save (with --save) and stop at the next "
                      f"step boundary; {name} again stops them at once", file=sys.stderr)
        return None

    def _find_workers(self):
        """Map msrun's worker processes to their ranks (from the environment msrun gave them)."""
        if len(self.rank_of) == len(self.local_ranks):
            return
        try:
            children = psutil.Process(self.msrun.pid).children()
        except psutil.Error:
            return
        for child in children:
            try:
                env = child.environ()
            except psutil.Error:
                continue
            if env.get("MS_ROLE") == "MS_WORKER":
                self.rank_of[child.pid] = int(env["RANK_ID"])

    def _echo(self, final=False):
        if self.echo is None:
            return
        sys.stdout.write(MINDSPORE_CHATTER.sub("", "".join(self.echo.lines(final))))
        sys.stdout.flush()

    def _stop(self):
        """SIGTERM, then after a grace period SIGKILL, to msrun's process group (msrun and the
        scheduler) and to each worker's (msrun starts every worker in a session of its own, whose
        group id is the worker's pid, so this also reaches what a worker started)."""
        groups = {self.msrun.pid, *self.rank_of}
        processes = []
        for pid in groups:
            try:
                root = psutil.Process(pid)
                processes += [root] + root.children(recursive=True)
            except psutil.Error:
                continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for group in groups | {_group_of(p) for p in processes} - {None}:
                try:
                    os.killpg(group, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + STOP_GRACE_SECONDS
            while time.monotonic() < deadline:
                self.msrun.poll()
                if not any(_running(p) for p in processes):
                    return
                time.sleep(0.1)
        self.msrun.wait()


def _group_of(process):
    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None


def _running(process):
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _tell(headline, log, shown=False, native=None):
    """Print what went wrong, then the end of `log` unless the terminal has just shown it, and
    where the rank's native stderr is (`native`: a crash in MindSpore's C++ code reports there)."""
    if shown:
        where = f"; its output is above and in {log}"
    else:
        tail = "".join(traceback_tail(log)).rstrip("\n")
        where = f". The end of {log}:\n{tail}" if tail else f"; it printed nothing ({log})"
        if not tail:                # nothing but MindSpore's own records, which traceback_tail leaves out?
            from rapidgpt.theoretical_memory import format_bytes
            with open(log, encoding="utf-8", errors="replace") as f:
                records = [line for line in f.read().splitlines() if line.strip()]
            if records:
                where = (f"; its log {log} ({format_bytes(os.path.getsize(log))}) holds no output of its own, "
                         f"only MindSpore's records; the last of them:\n" + "\n".join(records[-3:]))
    if native and os.path.isfile(native) and os.path.getsize(native):
        headline += f" (MindSpore's native output of the rank: {native})"
    print(f"rapidgpt: {headline}{where}", file=sys.stderr)


def traceback_tail(log):
    """The end of the last Python traceback in a log, or its last lines if it has none (a rank
    killed by a signal), without MindSpore's INFO/WARNING records."""
    with open(log, encoding="utf-8", errors="replace") as f:
        lines = [line for line in MINDSPORE_CHATTER.sub("", f.read()).splitlines(keepends=True) if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        return lines[starts[-1]:][-TRACEBACK_LINES:]
    return lines[-5:]
