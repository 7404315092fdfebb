"""The one place a model is transformed for a run: precision, ZeRO-3's parameter sharding,
activation recompute, and (pipeline stages) one compiled graph per layer.

The trainers (`Trainer.build_model`) and `RapidGPTEngine.compose` call `prepare_model` once, after
the seeded initialisation and before anything is compiled.

Precision (16-bit runs, rapidgpt/config/precision.py): every parameter is cast to fp16/bf16 in
place (the fp32 main copies live in the optimizer wrapper, rapidgpt/optim/mixed_precision.py);
emulated bf16 (the CPU backend) rounds them instead and has RapidGPT's cells round their results
(rapidgpt/emulated_bf16.py).
RapidGPT's own layers handle their dtypes themselves (LayerNorm and the loss in fp32, the
attention softmax as --attention-softmax-in-fp32 says). Any other leaf cell (a user's nn.Dense,
nn.LayerNorm, ...) gets MindSpore's amp treatment, `Cell.to_float`: it casts the cell's inputs to
16-bit, except for the cells of amp's black list (LayerNorm, BatchNorm), which run in fp32 -- the
O2 level of `mindspore.amp.auto_mixed_precision`, applied per cell so that RapidGPT's layers
inside a user's model keep their own rules and the model object stays the user's (no wrapper).

ZeRO-3 (rapidgpt/config/zero.py): each RapidGPT layer's parameters replaced by this data-parallel
rank's pieces, gathered in the layer's forward (rapidgpt/parallel/fully_sharded.py); after the
cast, so the pieces are in the model's dtype.

Recompute (rapidgpt/config/recompute.py): RapidGPT's transformer layers, or the `layers` list of a
user's model (an nn.CellList/SequentialCell whose cells the model runs in order), see
`apply_recompute`.

Kernel fusion (rapidgpt/config/kernel_fusion.py): where it is on on the CPU, RapidGPT's fp32
LayerNorms are written as the ops fusion fuses (`use_composite_layer_norm`).
"""
import mindspore as ms
from mindspore import nn

from rapidgpt.config.kernel_fusion import fuses_on_cpu
from rapidgpt.emulated_bf16 import emulate_bf16
from rapidgpt.errors import UserError
from rapidgpt.models.gpt import LanguageModelHead
from rapidgpt.models.norms import LayerNorm
from rapidgpt.models.attention import CoreAttention
from rapidgpt.models.transformer import TransformerLayers
from rapidgpt.parallel.fully_sharded import FullyShardedModelError, regather_in_backward, shard_model_parameters
from rapidgpt.parallel.random import Dropout

_HALF = {"float16": ms.float16, "bfloat16": ms.bfloat16}


def prepare_model(model, precision, recompute, logger=None, jit=True, compile_layers=False, zero=None):
    """Transform `model` in place for `precision` (a PrecisionConfig), `zero` (a ZeroConfig: stage 3
    shards the parameters) and `recompute` (a RecomputeConfig), and with `compile_layers` (pipeline stages, which run their forward in
    PyNative: rapidgpt/training/pipeline_schedules.py) compile its layers and tensor-parallel
    cells (compile_pipeline_stage); with a `logger`, say what was done in one start-up line (and warn where
    recompute cannot save memory). Returns the ZeRO-3 units (the ShardedWeights of the sharded
    layers, in model order; empty without ZeRO-3), which the optimizer wrapper updates."""
    foreign = []
    if precision.emulated_bf16:
        foreign = emulate_bf16(model)
    elif precision.half:
        cast_to_half(model, _HALF[precision.params_dtype])
    if fuses_on_cpu():
        use_composite_layer_norm(model)
    sharded = []
    if zero is not None and zero.stage == 3:
        gather_in_fp32 = precision.half and precision.accumulate_allreduce_grads_in_fp32
        try:
            sharded = shard_model_parameters(model, ms.float32 if gather_in_fp32 else None)
        except FullyShardedModelError as error:
            raise ModelTransformError(str(error)) from None
    recomputed = apply_recompute(model, recompute) if recompute.granularity is not None else 0
    compiled = compile_pipeline_stage(model, recompute) if compile_layers else None
    for cell, unit in sharded:
        if compiled is None or id(cell) in compiled:      # a pipeline stage runs the rest op by op
            regather_in_backward(unit)
    if logger is not None and (precision.half or recompute.granularity):
        marked = f" ({recomputed} cells marked)" if recompute.granularity else ""
        logger.info(f" > precision: {precision.describe()} | activation recompute: {recompute.describe()}{marked}")
        if foreign:
            logger.info(f" > emulated bf16: cells not of RapidGPT compute in fp32 on bf16 values, their results "
                        f"not rounded: {', '.join(foreign)}")
        if recompute.granularity and jit and ms.get_context("device_target") == "CPU":
            logger.warning(CPU_COMPILED_RECOMPUTE)
    return [unit for _, unit in sharded]


# Measured with benchmarks/bench_memory.py (MindSpore 2.10, CPU): under mindspore.jit the step's
# peak memory is not made of the kept activations (it grows ~9x faster with depth than they do),
# and every recompute variant RAISED it; eagerly, recompute lowers it as expected.
CPU_COMPILED_RECOMPUTE = (
    "WARNING: activation recompute does not lower memory in MindSpore's compiled step on the CPU "
    "backend (peak RSS rises, see benchmarks/bench_memory.py); the layers are recomputed as asked "
    "(the same results). For less memory on CPU run the step eagerly with --no-jit: about half the "
    "peak RSS, and recompute then lowers it further")


class ModelTransformError(UserError, ValueError):
    """The model cannot be transformed as the flags ask; the message says what it needs."""


def _is_rapidgpt_cell(cell):
    return type(cell).__module__.startswith("rapidgpt.")


def cast_to_half(model, dtype):
    """Parameters to `dtype` (fp16/bf16); amp's per-cell input casts for cells not of RapidGPT."""
    for param in model.get_parameters():
        param.set_dtype(dtype)
    keep_fp32 = tuple(ms.amp.get_black_list())
    for _, cell in model.cells_and_names():
        if _is_rapidgpt_cell(cell) or cell.name_cells():
            continue            # RapidGPT's own rules; a container's leaves are treated one by one
        cell.to_float(ms.float32 if isinstance(cell, keep_fp32) else dtype)


def use_composite_layer_norm(model):
    """RapidGPT's LayerNorms over the last axis compute as composite ops, which graph kernel fusion
    fuses (rapidgpt.models.norms.composite_layer_norm: why). Others keep MindSpore's kernel."""
    for _, cell in model.cells_and_names():
        if isinstance(cell, LayerNorm) and cell.begin_norm_axis == -1 and cell.begin_params_axis == -1:
            cell.composite = True


def compile_pipeline_stage(model, recompute):
    """For a pipeline stage, whose forward runs in PyNative with autograd recording
    (rapidgpt/training/pipeline_schedules.py), compile the bulk of its work:
    - its layers: a RapidGPT TransformerLayers as one graph, another `layers` list layer by layer.
      Activation recompute marks are honoured inside a graph only (MindSpore 2.10 cannot run a
      recomputed cell called from PyNative), so full recompute (`recompute`, a RecomputeConfig),
      which marks whole layers, needs the layers in one TransformerLayers;
    - each other cell that holds a cell with a custom backward (the tensor-parallel boundaries of
      rapidgpt/parallel/mappings.py): MindSpore 2.10 runs a custom backward recorded in PyNative
      only under its own differentiation API ("The pointer[top_cell_] is null"); inside a graph
      it is differentiated with the graph;
    - for speed, the RapidGPT cells that are slow op by op (measured on one core, a micro-batch
      of 4 x 128 tokens, hidden 256, V = 4096): the output layer and loss (LanguageModelHead;
      forward and backward 183 ms in PyNative, 49 ms compiled, more than the four layers of the
      benchmark GPT together) and the dropouts outside the layers (the embedding dropout's mask:
      63 ms in PyNative, 1.5 ms compiled). The other small cells (embeddings, final LayerNorm)
      measured no faster compiled.
    Returns the ids of the cells that now run inside a compiled graph.
    """
    units = []
    for layers in layer_lists(model):
        if isinstance(layers, TransformerLayers):
            units.append(layers)
        elif recompute.granularity == "full":
            raise ModelTransformError(
                f"--recompute-granularity full with --pipeline-model-parallel-size: the model "
                f"({type(model).__name__}) keeps its layers in a {type(layers).__name__}; keep them in a "
                f"rapidgpt.models.transformer.TransformerLayers (called once as self.layers(x, mask)), or "
                f"use --recompute-activations (selective) or no recompute")
        else:
            units.extend(layers)
    inside = {id(cell) for unit in units for _, cell in unit.cells_and_names()}
    for name, cell in model.cells_and_names():
        if id(cell) in inside or not any(hasattr(child, "bprop") for child in cell.cells()):
            continue
        if cell is model:
            raise ModelTransformError(
                f"--pipeline-model-parallel-size: the model ({type(model).__name__}) calls a cell with a custom "
                f"backward ({', '.join(type(c).__name__ for c in cell.cells() if hasattr(c, 'bprop'))}) in its "
                f"own construct; move that call into a sub-cell, which the pipeline stage can compile")
        units.append(cell)
        inside.update(id(c) for _, c in cell.cells_and_names())
    units.extend(cell for _, cell in model.cells_and_names()
                 if isinstance(cell, (LanguageModelHead, Dropout)) and id(cell) not in inside)
    for unit in units:
        unit.construct = ms.jit(unit.construct)
    return {id(cell) for unit in units for _, cell in unit.cells_and_names()}


def layer_lists(model):
    """The model's lists of layers recompute works on: each nn.CellList/SequentialCell attribute
    named `layers` (the built-in GPT's decoder layers; a user's model may expose one)."""
    return [cell for name, cell in model.cells_and_names()
            if name.rsplit(".", 1)[-1] == "layers" and isinstance(cell, (nn.CellList, nn.SequentialCell))]


def apply_recompute(model, config):
    """Mark what the backward recomputes instead of keeping (MindSpore's `Cell.recompute`) -> the
    number of cells marked.

    selective: each RapidGPT CoreAttention. full/uniform: the layers in chunks of N consecutive
    ones, only each chunk's input kept; full/block: the first N layers of each layer list.
    """
    name = type(model).__name__
    if config.granularity == "selective":
        cores = [cell for _, cell in model.cells_and_names() if isinstance(cell, CoreAttention)]
        if not cores:
            raise ModelTransformError(f"--recompute-granularity selective: the model ({name}) has no RapidGPT "
                             f"attention (rapidgpt.models.transformer.ParallelAttention) whose core to "
                             f"recompute; use --recompute-granularity full with a `layers` list, or no recompute")
        for core in cores:
            core.recompute()
        return len(cores)
    lists = layer_lists(model)
    if not lists:
        raise ModelTransformError(f"--recompute-granularity full: the model ({name}) has no `layers` list to recompute; "
                         f"keep its transformer layers in `self.layers = nn.CellList([...])` and run them in "
                         f"order in construct, or drop the recompute flags")
    marked = 0
    for layers in lists:
        cells = list(layers)
        n = config.num_layers
        if config.method == "block":
            for layer in cells[:n]:
                layer.recompute()
            marked += len(cells[:n])
            continue
        for start in range(0, len(cells), n):
            chunk = cells[start:start + n]
            # Inside a chunk the layers' outputs are recomputed too; the chunk's last output is
            # kept, as it is the next chunk's input.
            for layer in chunk[:-1]:
                layer.recompute(output_recompute=True)
            chunk[-1].recompute()
        marked += len(cells)
    return marked
