"""MindSpore internals RapidGPT uses where no public API does the job, each checked against the
MindSpore version it was written for (2.10). On another version the caller is told and falls back
to public behaviour; upgrading MindSpore means re-checking the functions here.

(Older uses of private APIs, in rapidgpt/engine.py, rapidgpt/parallel/comm.py and
rapidgpt/training/pipeline_schedules.py, move here with the layer-base rework.)
"""
import inspect
import logging

import mindspore as ms

WRITTEN_FOR = "2.10."
_WARNED = set()


def written_for_this_version(feature):
    """Whether this MindSpore is the one the internals were written for; if not, says once that
    `feature` is off and why."""
    if ms.__version__.startswith(WRITTEN_FOR):
        return True
    if feature not in _WARNED:
        _WARNED.add(feature)
        logging.getLogger("rapidgpt").warning(
            f" > {feature}: off with MindSpore {ms.__version__} (written against MindSpore {WRITTEN_FOR}x's "
            f"internals, rapidgpt/mindspore_private.py); install mindspore=={WRITTEN_FOR}0 to have it")
    return False


def compile_without_running(jitted, *args):
    """Compile the graph of `jitted` (`mindspore.jit(fn)` of a function or of a cell's method) for
    `args` without running it; the next `jitted(*args)` with inputs of the same types and shapes
    runs it without compiling.
    Returns False when it could not (another MindSpore version): the call then compiles.

    Why private: MindSpore 2.10 has no public compile-only call for a jitted function
    (MS_DEV_PRECOMPILE_ONLY=1 compiles the frontend only, and the next call then fails with "Can't
    find run graph func"). Every call of a jitted method builds a `_JitExecutor` and runs its
    `compile` first, which finds a graph already compiled for the same cell and argument types;
    this runs that step alone (measured on the bench model: the call after it took one step's time).
    """
    if not written_for_this_version("compiling the step before the ranks meet"):
        return False

    from mindspore.graph.api import _JitExecutor
    # The executor the call would build: mindspore.jit's wrapper keeps its settings in its closure.
    wrapper, owner = (jitted.__func__, jitted.__self__) if inspect.ismethod(jitted) else (jitted, None)
    kept = dict(zip(wrapper.__code__.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))
    executor = _JitExecutor(kept["func"], kept["hash_obj"], None, owner, kept["jit_config"],
                            kept["dynamic"], wrapper.__jit_graph_name__)
    executor.compile(kept["func"].__name__, *args)
    return True
