"""Small helpers shared across packages."""
import os
from collections import deque


def cache_root():
    """RapidGPT's user cache directory (the demo corpus, compiled kernels): `$RAPIDGPT_CACHE_DIR`,
    else `$XDG_CACHE_HOME/rapidgpt`, else `~/.cache/rapidgpt`."""
    root = os.environ.get("RAPIDGPT_CACHE_DIR")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rapidgpt")
    return root


def flag_value(argv, flag):
    """The value a command line gives `flag` (`--flag v` or `--flag=v`), or None: for the settings
    that must be made before MindSpore loads, ahead of the flags' parsing."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def bounded_imap(pool, fn, items, max_in_flight):
    """`pool.imap(fn, items)` in order, but with at most `max_in_flight` tasks submitted.

    `Pool.imap` drains its whole input into the task queue at once, so on a corpus larger than
    RAM it would hold the corpus in memory; this keeps memory flat and the output order fixed.
    """
    in_flight = deque()
    for item in items:
        in_flight.append(pool.apply_async(fn, (item,)))
        if len(in_flight) >= max_in_flight:
            yield in_flight.popleft().get()
    while in_flight:
        yield in_flight.popleft().get()
