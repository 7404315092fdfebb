"""Process-wide singletons, Megatron style: get_args, get_tokenizer, get_timers, get_logger,
get_tensorboard_writer. The engine sets them once; user scripts and the library read them."""
import logging
import os
import sys
import time

from tqdm import tqdm

_ARGS = None
_TOKENIZER = None
_TIMERS = None
_LOGGER = None
_TENSORBOARD_WRITER = None
_RANK = 0


def _ensure(value, name):
    if value is None:
        raise RuntimeError(f"{name} is not initialized: create a RapidGPTEngine first")
    return value


def get_args():
    return _ensure(_ARGS, "args")


def get_tokenizer():
    """The tokenizer from --tokenizer-type/--vocab-file/--merge-file (None when none was given)."""
    _ensure(_ARGS, "args")
    return _TOKENIZER


def get_timers():
    return _ensure(_TIMERS, "timers")


def get_logger():
    return _ensure(_LOGGER, "logger")


def get_tensorboard_writer():
    """tensorboardX SummaryWriter under --tensorboard-dir (None without the flag or off rank 0)."""
    return _TENSORBOARD_WRITER


class Timer:
    def __init__(self):
        self.elapsed_ = 0.0
        self._started = None

    def start(self):
        self._started = time.perf_counter()

    def stop(self):
        self.elapsed_ += time.perf_counter() - self._started
        self._started = None

    def elapsed(self, reset=True):
        """Seconds accumulated between start/stop calls (a running timer counts up to now)."""
        value = self.elapsed_
        if self._started is not None:
            value += time.perf_counter() - self._started
        if reset:
            self.elapsed_ = 0.0
            if self._started is not None:
                self._started = time.perf_counter()
        return value


class Timers:
    """`timers("name").start()/.stop()`, `timers("name").elapsed()`, as Megatron's."""

    def __init__(self):
        self._timers = {}

    def __call__(self, name):
        if name not in self._timers:
            self._timers[name] = Timer()
        return self._timers[name]


def is_console_rank():
    """Rank 0 owns the terminal (log lines, progress bars)."""
    return _RANK == 0


class _ConsoleHandler(logging.Handler):
    """Prints through tqdm, so log lines appear above a progress bar instead of breaking it."""

    def emit(self, record):
        tqdm.write(self.format(record), file=sys.stdout)


def _build_logger(log_dir, rank):
    logger = logging.getLogger("rapidgpt")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    # Only rank 0 talks to the terminal; every rank keeps its own file under --log-dir.
    if rank == 0:
        logger.addHandler(_ConsoleHandler())
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        logger.addHandler(logging.FileHandler(os.path.join(log_dir, f"rank_{rank}.log")))
    return logger


def set_global_variables(args, tokenizer, rank=0):
    global _ARGS, _TOKENIZER, _TIMERS, _LOGGER, _TENSORBOARD_WRITER, _RANK
    _ARGS, _TOKENIZER, _TIMERS, _RANK = args, tokenizer, Timers(), rank
    _LOGGER = _build_logger(args.log_dir, rank)
    _TENSORBOARD_WRITER = None
    if args.tensorboard_dir and rank == 0:
        from tensorboardX import SummaryWriter
        _TENSORBOARD_WRITER = SummaryWriter(log_dir=args.tensorboard_dir)
