"""Per-element work over the tuples of tensors a compiled step handles (one per parameter), in
compile time linear in their length.

Why not a comprehension: inside a MindSpore 2.10 graph, `tuple(f(g) for g in grads)`, a list
comprehension or a loop growing a tuple compiles in time quadratic in the tuple's length. Measured
on CPU (a jitted function scaling 64x64 tensors): 100 tensors 2.3-3.3 s, 200 tensors 6.7-9.5 s;
the same map through `ops.HyperMap` 0.09 and 0.17 s. A GPT has ~12 parameters per layer, and the
step maps over them several times (accumulate, unscale, norm, clip), so this was much of the first
step's compile time: benchmarks/compile_profile.py's base row (bench model) 8.8 s before, 5.6 s
after.

`fn` may take Python constants as well as tensors: a tuple of Python values (e.g. whether each
gradient counts in the norm) is mapped element by element like a tuple of tensors, and `fn`
branches on them at compile time.

In-place updates are mapped only where nothing in the same graph reads the parameters after them
(AdamW's `update_mapped`, rapidgpt/optim/adamw.py: fp32 runs without ZeRO-1/2): an AdamW update
mapped under ZeRO-1 ran, but the gathered parameters were read before it had written them
(measured, MindSpore 2.10). Elsewhere the updates stay loops.
"""
import mindspore as ms
from mindspore import ops

_hyper_map = ops.HyperMap()


def map_tensors(fn, *tuples):
    """`tuple(fn(*items) for items in zip(*tuples))`, in a compiled graph or eagerly; `fn` may be
    an `ops.partial` binding leading arguments (scalars shared by every element)."""
    return _hyper_map(fn, *tuples)


# Element functions the step maps (bound arguments first, as ops.partial binds them).

def to_fp32(tensor):
    return ops.cast(tensor, ms.float32)


def times(factor, tensor):
    return tensor * factor


def after(done, tensor):
    """`tensor`, read once `done` has been computed (e.g. a parameter after its update)."""
    return ops.depend(tensor, done)


def assign_cast(done, target, value):
    """`target = value` in `target`'s dtype, once `done` has been computed."""
    return ops.assign(target, ops.cast(ops.depend(value, done), target.dtype))
