"""MindSpore internals RapidGPT uses where no public API does the job, all of them here, each
checked against the MindSpore version it was written for (2.10). On another version the user is
told once which feature relies on them and what to install; a feature that has a public fallback
(compiling before the ranks meet) is then off, the others are tried as they are. Upgrading
MindSpore means re-checking the functions of this module, and nothing outside it.
"""
import contextlib
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


def graphs_compiled_in_this_process():
    """Whether this process has compiled a graph (a jitted function or cell) before now; True on
    another MindSpore version (it cannot tell, so a caller takes the safe side).

    Why private: MindSpore 2.10 records the compiled phases only in `mindspore.graph.api`'s
    module-level sets (`ms_compile_cache` for jitted functions and methods, `cells_compile_cache`
    for cells called in graph mode, `_trace_compile_cache` for traced ones). `ms.ms_memory_recycle()`
    and `ms.reset_auto_parallel_context()` empty them; RapidGPT calls neither."""
    if not written_for_this_version("the training step's compile cache"):
        return True
    from mindspore.graph import api, jit_trace
    return bool(api.ms_compile_cache or any(api.cells_compile_cache.values()) or jit_trace._trace_compile_cache)


def graph_cache_entry_script():
    """The entry script MindSpore's graph cache hashes (None when it found none, or on another
    MindSpore version).

    Why private: MindSpore 2.10 takes it from sys.argv[0] when `mindspore.graph.api` is imported,
    keeps it in that module's `entry_script_path`, and opens it at every cache-enabled compile: in a
    process started by `python -c` (a script given inline, pytest-xdist's workers) that is the file
    "-c", and the compile fails with FileNotFoundError."""
    if not written_for_this_version("the training step's compile cache"):
        return None
    from mindspore.graph import api
    return api.entry_script_path


# ---- devices --------------------------------------------------------------------------------------

def device_supported(device_name):
    """Whether this MindSpore package can run on `device_name` ("GPU", "Ascend") here, asked
    without the warnings `ms.set_device` would print for a missing device."""
    written_for_this_version("detecting the accelerator")
    from mindspore._c_expression import MSContext
    return bool(MSContext.get_instance().is_pkg_support_device(device_name))


def device_selected():
    """Whether a device is already selected in this process (MindSpore refuses a second
    `ms.set_device` once a kernel has run)."""
    written_for_this_version("selecting the device")
    from mindspore._c_expression import DeviceManagerConf
    return bool(DeviceManagerConf.get_instance().is_device_enable())


def synchronize():
    """Wait until every device has finished its queued work. Why not ms.runtime.synchronize():
    in MindSpore 2.10 its first call on the CPU logs "[ERROR] CPU device is not supported" and
    returns without waiting (later calls do wait); the function behind it waits on every device,
    without the false error."""
    written_for_this_version("waiting for the device between pipeline micro-batches")
    from mindspore._c_expression import synchronize as synchronize_all
    synchronize_all()


# ---- autograd by hand (pipeline stages: rapidgpt/training/pipeline_schedules.py says why) ----------

@contextlib.contextmanager
def autograd_recording():
    """PyNative autograd recording on inside the block: each output keeps the graph its backward
    needs, so `backward_of` can start it later, in any order."""
    written_for_this_version("the pipeline schedule's autograd")
    from mindspore.graph.api import _pynative_executor
    previous = _pynative_executor.grad_flag()
    _pynative_executor.set_grad_flag(True)
    try:
        yield
    finally:
        _pynative_executor.set_grad_flag(previous)


def backward_of(output, output_grad, inputs):
    """Gradients of `output` (recorded under `autograd_recording`), seeded with `output_grad`,
    with respect to `inputs` (tensors or Parameters): a tuple with None for an input the output
    does not reach; nothing is accumulated into the Parameters."""
    from mindspore._c_expression import run_backward
    return run_backward((output,), (output_grad,), False, False, tuple(inputs), True, accumulate_grad=False)


# ---- point-to-point (HCCL/NCCL; rapidgpt/parallel/comm.py emulates them on the CPU) ---------------

def isend_irecv():
    """MindSpore's asynchronous point-to-point ops (isend(tensor, peer, group, tag) and
    irecv(buffer, tag, peer, group), each returning (tensor, handle) to `.wait()` on), those behind
    `mindspore.mint.distributed.isend/irecv`: those check the destination against this process's
    rank in the group "hccl_world_group", which does not exist on the CPU (comm.PairExchange)."""
    written_for_this_version("point-to-point sends between pipeline stages")
    from mindspore.ops.auto_generate.gen_ops_prim import dist_comm_irecv_op, dist_comm_isend_op
    return dist_comm_isend_op, dist_comm_irecv_op
