"""ZeRO stage 3 (--zero-3-memory-optimization, Rapidformer's --fsdp-memory-optimization): the
model's parameters themselves are sharded over the data-parallel ranks, and a layer's are gathered
whole only for the layer that computes with them.

Units. A unit is one RapidGPT layer that owns parameters: a `ShardableLayer` (below), which names
its parameters in `weight_names` and reads them only through `whole_weights()`. That is all a
layer does for ZeRO-3: `shard_model_parameters` (called once by
rapidgpt/training/model_transforms.py, after the seeded initialisation) replaces the named
Parameters by this rank's pieces and sets the layer's `fully_sharded` cell (a ShardedWeights),
which `whole_weights()` then calls to gather them. Composite cells (attention, MLP, a decoder
layer, a model) hold no ZeRO-3 code: each leaf gathers its own weights where it computes with them
(one all-gather per leaf layer: Megatron-FSDP's and PyTorch FSDP's unit is a module the user
chooses; here it is the leaf, so a new layer kind needs nothing but `weight_names`). A trainable
parameter of any other cell cannot be sharded this way (a MindSpore graph reads a Parameter at its
full, fixed size and has no Parameter that is a view of another, so the cell must take its weights
as tensors): the transform then stops with an error naming it.

Layout per unit (EvenShardPlan): each parameter flattened and cut into N equal ranges, the last
padded with zeros; data-parallel rank r stores range r of every parameter of the unit, one 1-D piece
Parameter each, named as that parameter and carrying its tensor/pipeline-parallel marks (so the
gradient norm counts each element once, as without ZeRO). The whole values are dropped. Not
Megatron's flat layout (ShardPlan, which ZeRO-1/2 use: the unit's parameters end to end, cut into N
ranges), because there the ranks hold different numbers and lengths of pieces, so their step graphs
differ, and MindSpore runs a group's collectives in the order of a topological sort of each rank's
own graph: two independent branches of a model (BERT's masked-LM and sentence-order heads) then
re-gathered their weights in the backward in different orders on different ranks, and the ring
all-reduces of two gathers met ("Memcpy error, dest size is 68, src size is 8192", BERT at DP=4,
MindSpore 2.10). With even pieces every data-parallel rank compiles the same graph.

Forward: `ShardedWeights()` concatenates this rank's pieces, all-gathers the [N x S] vector over the
data-parallel group (rapidgpt.parallel.comm: native on HCCL/NCCL, exact on CPU) and cuts each
parameter's N ranges out of it. Backward: the all-gather's backward is a reduce-scatter, so each
piece's gradient comes out summed over the data-parallel ranks; the schedule does not reduce them
again (data_parallel.REDUCED_IN_BACKWARD). Released after use: the gather cell is marked for
MindSpore's recompute with its output (`Cell.recompute(output_recompute=True)`), so the whole
weights are not kept from the forward for the backward: the backward gathers them again (checked
on the compiled graph of the tiny test GPT when a decoder layer was one unit: 16 collectives
instead of 12). Without the mark the graph keeps each layer's whole weights from its forward to
its backward, so the step's peak would hold them all. Measured on the CPU (benchmarks/
bench_parallel.py --only zero, GPT 4 x 256, DP=2, one run each, decoder layers as units): 2566
tokens/s and 2055 MiB peak RSS with the mark, 2854 and 2047 without: the regather costs
throughput and, as activation recompute in MindSpore's compiled CPU step, saves no RSS there (the
step's peak is not made of these tensors); it is kept because it is what frees a large model's
weights between its forward and backward.
Leaf units against decoder-layer units (the same GPT, ZeRO-3 at DP=2, 13 iterations, three
alternating pairs on a busy 2-core host): first iteration 19.5 s vs 22.4 s (median), steady
1001 vs 1086 ms per iteration, both within the host's noise; +4.5% CPU time and +39 MiB peak RSS
(more, smaller collectives).
The mark needs a graph: a unit that runs op by op (outside the compiled layers of a pipeline
stage) keeps its weights for its backward instead.

Precision: pieces are in the model's dtype; in 16-bit runs with
--accumulate-allreduce-grads-in-fp32 (bf16 always) the gather runs in fp32, so the gradients'
reduce-scatter sums the ranks' gradients in fp32; each micro-batch's sum is then rounded once to
the pieces' 16-bit gradient (MindSpore differentiates a parameter in its own dtype) before the
micro-batches are accumulated in fp32. Without ZeRO-3 the data-parallel sum stays in fp32 until
the optimizer; the fp32 gather also moves, and briefly holds, twice the bytes of a 16-bit one.
"""
import math

import mindspore as ms
import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops

from rapidgpt.parallel import comm
from rapidgpt.parallel.data_parallel import ShardedKind, ShardedState, padded_cat
from rapidgpt.parallel.state import get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size
from rapidgpt.tensor_tuples import map_tensors

# The marks a parameter carries for the gradient norm and the pipeline's tied embeddings.
_MARKS = ("tensor_model_parallel", "pipeline_shared", "pipeline_shared_copy", "emulated_bf16")


class FullyShardedModelError(ValueError):
    """The model holds a trainable parameter ZeRO-3 cannot shard; the message names it."""


class ShardableLayer:
    """Mixin for a layer that owns parameters (an nn.Cell of RapidGPT or a user's): it lists the
    attribute names of its parameters in `weight_names` and computes with `whole_weights()` (a tuple
    in that order) instead of reading the attributes. Whole Parameters without ZeRO-3; under ZeRO-3
    gathered from every data-parallel rank's pieces (module docstring)."""

    weight_names = ()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fully_sharded = None        # the layer's ShardedWeights under ZeRO-3 (an instance
        # attribute: MindSpore registers a sub-cell by name and refuses one a class already has)

    def whole_weights(self):
        if self.fully_sharded is None:
            return tuple(getattr(self, name) for name in self.weight_names)
        return self.fully_sharded()


class EvenShardPlan:
    """Which elements of a unit's parameters (of `shapes`) data-parallel rank `rank` of `size`
    holds: each parameter flattened and cut into `size` ranges of `widths[i]` = ceil(n_i / size)
    elements; rank r holds range r of every one (the module docstring says why). Interface of
    data_parallel.ShardPlan: `pieces`, one (parameter index, first, end) per parameter over its real
    elements (fewer than widths[i] in a piece that ends in zeros, none in one of zeros only),
    `padding` (0: the zeros are inside the pieces), `split`."""

    def __init__(self, shapes, size, rank):
        self.shapes = tuple(tuple(shape) for shape in shapes)
        self.size = size
        counts = tuple(math.prod(shape) for shape in self.shapes)
        self.counts = counts
        self.widths = tuple(math.ceil(n / size) for n in counts)
        self.columns = tuple(sum(self.widths[:i]) for i in range(len(self.widths)))
        self.shard = sum(self.widths)                   # one rank's elements, zeros included
        self.pieces = tuple((i, min(rank * w, n), min((rank + 1) * w, n))
                            for i, (n, w) in enumerate(zip(counts, self.widths)))
        self.padding = 0

    def split(self, flat):
        """Every rank's pieces end to end (`[size * shard]`, rank after rank) -> each parameter's
        whole tensor, in order."""
        rows = flat.reshape(self.size, self.shard)
        return map_tensors(ops.partial(_ranges_of, rows), self.columns, self.widths, self.counts, self.shapes)


def _ranges_of(rows, column, width, count, shape):
    """The parameter of `shape` whose ranges are `rows[:, column:column + width]` (zeros after `count`)."""
    return rows[:, column:column + width].reshape(-1)[:count].reshape(shape)


class ShardedWeights(nn.Cell):
    """`()` -> the whole parameters of a unit (a tuple in `weight_names` order, in the model dtype),
    gathered from every data-parallel rank's pieces. See the module docstring.

    `names`, `shapes`, `ndims`: the parameters'; `plan`: this rank's EvenShardPlan; `pieces`: this
    rank's piece Parameters, in plan order."""

    def __init__(self, params, gather_dtype=None):
        super().__init__(auto_prefix=False)
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise FullyShardedModelError(f"ZeRO-3: the parameters of one layer ({params[0].name}, ...) have "
                                         f"different dtypes {sorted(map(str, dtypes))}")
        self.dtype = dtypes.pop()
        self.gather_dtype = gather_dtype or self.dtype
        self.names = tuple(p.name for p in params)
        self.shapes = tuple(tuple(p.shape) for p in params)
        self.ndims = tuple(len(shape) for shape in self.shapes)
        self.plan = EvenShardPlan(self.shapes, get_data_parallel_world_size(), get_data_parallel_rank())
        pieces = []
        for i, lo, hi in self.plan.pieces:
            # Through fp32 host values (exact for 16-bit ones): a slice of a device tensor is a
            # view, which the compiled step's in-place updates refuse.
            value = np.zeros(self.plan.widths[i], np.float32)
            value[:hi - lo] = params[i].value().astype(ms.float32).asnumpy().reshape(-1)[lo:hi]
            piece = Parameter(Tensor(value).astype(self.dtype), name=params[i].name)
            for mark in _MARKS:
                if hasattr(params[i], mark):
                    setattr(piece, mark, getattr(params[i], mark))
            pieces.append(piece)
        self.pieces = ParameterTuple(pieces)
        self.all_gather = comm.AllGather(get_data_parallel_group(), axis=0)

    def construct(self):
        if self.gather_dtype == self.dtype:
            return self.plan.split(self.all_gather(padded_cat(self.pieces, self.plan.padding, self.dtype)))
        pieces = [ops.cast(p, self.gather_dtype) for p in self.pieces]
        whole = self.plan.split(self.all_gather(padded_cat(pieces, self.plan.padding, self.gather_dtype)))
        return tuple(ops.cast(w, self.dtype) for w in whole)

    def gather_pieces(self, pieces):
        """The whole fp32 values (in parameter order) from this rank's `pieces` (fp32 tensors of
        one kind, e.g. Adam's m, in plan order) and the other data-parallel ranks': for checkpoints."""
        return self.plan.split(self.all_gather(padded_cat(pieces, self.plan.padding, ms.float32)))

    def whole_states(self, pieces=None, prefix=""):
        """{prefix + parameter name: ShardedState} of `pieces` (this rank's, in plan order; default:
        the weights themselves): what a checkpoint saves of them, whole."""
        kind = ShardedKind(self, tuple(self.pieces if pieces is None else pieces))
        return {prefix + name: ShardedState(kind, i, shape)
                for i, (name, shape) in enumerate(zip(self.names, self.shapes))}


def _units_of(model):
    """[(layer, its parameters in `weight_names` order)] of the model's ShardableLayers that train.
    Checks that no parameter belongs to two layers, that a layer trains all or none of its
    parameters, and that every trainable parameter belongs to one."""
    units, claimed = [], {}                       # claimed: parameter id -> its layer's name
    for name, cell in model.cells_and_names():
        if not isinstance(cell, ShardableLayer):
            continue
        params = [getattr(cell, attribute) for attribute in cell.weight_names]
        shared = next((p for p in params if id(p) in claimed), None)
        if shared is not None:
            raise FullyShardedModelError(
                f"--zero-3-memory-optimization: {shared.name} is a parameter of both {claimed[id(shared)]} and "
                f"{name}; ZeRO-3 shards each layer's parameters on their own, so give each layer its own "
                f"(or pass the weight from one layer to the other, as the GPT's output layer does)")
        claimed.update((id(p), name) for p in params)
        trainable = [p.requires_grad for p in params]
        if not any(trainable):
            continue                                    # frozen: kept whole, never updated
        if not all(trainable):
            frozen = next(p.name for p in params if not p.requires_grad)
            raise FullyShardedModelError(
                f"--zero-3-memory-optimization: {frozen} is frozen while the rest of its layer trains; a layer is "
                f"sharded as a whole, so freeze all of its parameters or none")
        units.append((cell, params))
    unshardable = [p.name for p in model.trainable_params() if id(p) not in claimed]
    if unshardable:
        raise FullyShardedModelError(
            f"--zero-3-memory-optimization: the model ({type(model).__name__}) has trainable parameters outside "
            f"RapidGPT's layers ({', '.join(unshardable[:3])}{', ...' if len(unshardable) > 3 else ''}); ZeRO-3 "
            f"shards the layers of rapidgpt.parallel / rapidgpt.models.transformer and layers built on "
            f"rapidgpt.parallel.fully_sharded.ShardableLayer. Build those parts from them, or use "
            f"--zero-2-memory-optimization, which works with any model")
    return units


def shard_model_parameters(model, gather_dtype=None):
    """ZeRO-3's transform: every unit's whole parameters replaced by this rank's pieces (see the
    module docstring). Checks the whole model before changing anything. Returns [(unit's layer,
    its ShardedWeights)] in model order; `regather_in_backward` then marks those that run in a graph."""
    sharded = []
    for cell, params in _units_of(model):
        unit = ShardedWeights(params, gather_dtype)
        for attribute, name in zip(cell.weight_names, unit.names):
            setattr(cell, attribute, None)
        cell.zero3_names = dict(zip(cell.weight_names, unit.names))
        cell.fully_sharded = unit
        for piece, (i, _, _) in zip(unit.pieces, unit.plan.pieces):
            piece.name = unit.names[i]           # attaching the cell prefixed them
        sharded.append((cell, unit))
    return sharded


def regather_in_backward(unit):
    """Have the backward gather `unit`'s weights again rather than keep them from the forward (the
    cell must run inside a compiled graph; see the module docstring)."""
    unit.recompute(output_recompute=True)


def fully_sharded_units(model):
    """The ShardedWeights of a model transformed by `shard_model_parameters`, in model order."""
    return [cell.fully_sharded for _, cell in model.cells_and_names()
            if isinstance(getattr(cell, "fully_sharded", None), ShardedWeights)]


def slot_name(cell, attribute):
    """The name of `cell`'s parameter `attribute`, also once ZeRO-3 has replaced it by pieces."""
    param = getattr(cell, attribute, None)
    return param.name if param is not None else getattr(cell, "zero3_names", {}).get(attribute)


def whole_parameters(model):
    """{name: Parameter or ShardedState}: the model's parameters as an unsharded run names and
    shapes them; under ZeRO-3 each unit's as ShardedStates of this rank's pieces (whole when a
    checkpoint is saved, cut to the pieces when one is loaded)."""
    tensors = {p.name: p for p in model.get_parameters()}
    for unit in fully_sharded_units(model):
        tensors.update(unit.whole_states())
    return tensors
