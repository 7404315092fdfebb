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
_WANDB_RUN = None
_SCALAR_WRITER = None
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


def get_scalar_writer():
    """What RapidGPT logs its scalars to: `add_scalar(tag, value, step)` on the --tensorboard-dir
    writer and the --wandb-project run at once (None without either, or off rank 0)."""
    return _SCALAR_WRITER


class _ScalarWriters:
    def __init__(self, writers):
        self.writers = writers

    def add_scalar(self, tag, value, step):
        for writer in self.writers:
            writer.add_scalar(tag, value, step)

    def close(self):
        for writer in self.writers:
            writer.close()


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


class _NullTimer:
    """A timer above --timing-log-level: costs nothing, measures nothing."""

    def start(self):
        pass

    def stop(self):
        pass

    def elapsed(self, reset=True):
        return 0.0


class Timers:
    """Megatron's timers: `timers("name", log_level).start()/.stop()`; a timer whose level is above
    --timing-log-level is a no-op. `log(names)` gives Megatron's block of times across ranks
    (`--timing-log-option`: the slowest rank's, min and max, or every rank's)."""

    def __init__(self, log_level=0, log_option="minmax"):
        self._timers = {}
        self.log_level, self.log_option = log_level, log_option
        self._null = _NullTimer()

    def measuring(self, log_level):
        """Whether timers of `log_level` measure (callers then synchronise the device before
        stopping them, so asynchronous work is counted where it runs)."""
        return log_level <= self.log_level

    def __call__(self, name, log_level=0):
        if log_level > self.log_level:
            return self._null
        if name not in self._timers:
            self._timers[name] = Timer()
        return self._timers[name]

    def write(self, names, writer, iteration, normalizer=1.0):
        """Megatron's timers.write: each of `names` that ran as the TensorBoard scalar `<name>-time`,
        the slowest rank's seconds divided by `normalizer`, not reset (log() shows them next). A
        collective: every rank calls it (`writer` is None where there is none)."""
        from rapidgpt.parallel.comm import gather_over_ranks
        names = [name for name in names if name in self._timers]
        if not names:
            return
        times = gather_over_ranks([self._timers[n].elapsed(reset=False) / normalizer for n in names])
        if writer is not None:
            for i, name in enumerate(names):
                writer.add_scalar(f"{name}-time", float(times[:, i].max()), iteration)

    def log(self, names, normalizer=1.0, reset=True):
        """The text Megatron prints for timers `names` (ms, divided by `normalizer`), every rank's
        times gathered (a collective: every rank calls it); None if none of them ran."""
        from rapidgpt.parallel.comm import gather_over_ranks
        names = [name for name in names if name in self._timers]
        if not names:
            return None
        times = gather_over_ranks([self._timers[n].elapsed(reset) * 1000.0 / normalizer for n in names])
        if self.log_option == "max":
            lines = ["(max) time across ranks (ms):"]
            lines += [f"    {(n + ' ').ljust(48, '.')}: {times[:, i].max():.2f}" for i, n in enumerate(names)]
        elif self.log_option == "minmax":
            lines = ["(min, max) time across ranks (ms):"]
            lines += [f"    {(n + ' ').ljust(48, '.')}: ({times[:, i].min():.2f}, {times[:, i].max():.2f})"
                      for i, n in enumerate(names)]
        else:
            lines = ["times across ranks (ms):"]
            for i, n in enumerate(names):
                lines.append(f"  {n}:")
                lines += [f"     rank {r:2d}: {times[r, i]:.2f}" for r in range(len(times))]
        return "\n".join(lines)


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
    global _ARGS, _TOKENIZER, _TIMERS, _LOGGER, _TENSORBOARD_WRITER, _WANDB_RUN, _SCALAR_WRITER, _RANK
    _ARGS, _TOKENIZER, _RANK = args, tokenizer, rank
    _TIMERS = Timers(getattr(args, "timing_log_level", 0), getattr(args, "timing_log_option", "minmax"))
    _LOGGER = _build_logger(args.log_dir, rank)
    _TENSORBOARD_WRITER = None
    if args.tensorboard_dir and rank == 0:
        from tensorboardX import SummaryWriter
        _TENSORBOARD_WRITER = SummaryWriter(log_dir=args.tensorboard_dir)
    if _WANDB_RUN is not None:           # the previous run's, in this process
        _WANDB_RUN.finish()
    _WANDB_RUN = None
    if getattr(args, "wandb_project", None) and rank == 0:
        from rapidgpt.config.wandb_logging import open_wandb_run
        _WANDB_RUN = open_wandb_run(args)
    writers = [writer for writer in (_TENSORBOARD_WRITER, _WANDB_RUN) if writer is not None]
    _SCALAR_WRITER = _ScalarWriters(writers) if writers else None
