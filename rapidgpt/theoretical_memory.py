"""What a run holds per rank, computed from its flags without allocating anything (Megatron prints
its "theoretical memory footprints" at start-up; `data_tools/estimate_memory.py` prints this for
any flags, and every training run prints one line of it). Pure Python: it works for models far
larger than the machine.

Parameters of the built-in GPT (rapidgpt/models/gpt.py), h hidden, f FFN, a query heads in g
query groups of d channels (--kv-channels), V_pad the padded vocabulary, s_max the position
embeddings, t the tensor-parallel size, n(x) a norm's parameters over x channels (LayerNorm 2x,
RMSNorm x):

    a layer        QKV h (a + 2g) d (+ (a + 2g) d bias with biases or --add-qkv-bias), projection
                   a d h (+ h), MLP h f + f h (--swiglu: 2 h f + f h; + f or 2f and h biases), two
                   norms 2 n(h), --qk-layernorm 2 n(d). GPT-2 (g = a, d = h / a, f = 4h, biases,
                   LayerNorm): 12h^2 + 13h. Per TP rank the matrices and the QKV/fc1 biases are
                   split by t, the other biases and the norms replicated. Multi-latent attention
                   (rapidgpt/models/mla.py) instead of QKV and projection: up projections
                   R_q a (D + P) (h a (D + P) without R_q) + R_kv a (D + V), projection a V h,
                   split by t; down projections h R_q + h (R_kv + P) and, with --qk-layernorm,
                   n(R_q) + n(R_kv), replicated
    first stage    word embeddings V_pad*h (split by t), learned position embeddings s_max*h
    last stage     final norm n(h); the output layer: a copy of the word embeddings (tied, kept
                   in step with the first stage's, not a parameter of its own) or V_pad*h (untied)

For GPT-2 the total is the Megatron-LM paper's P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
(Narayanan et al. 2021, which counts the position embeddings as s = --seq-length) plus the final
LayerNorm's 2h, which the formula leaves out. Llama 3 8B's flags give 8,030,261,248,
Qwen2.5-0.5B's 494,032,768 (tests/test_theoretical_memory.py).

Model states per rank (Psi = the parameters this rank's stage holds per TP rank, N = the
data-parallel size), the ZeRO paper's accounting (Rajbhandari et al. 2020) for what RapidGPT keeps:

    weights      Psi x 2 bytes (fp16/bf16) or 4 (fp32);                     ZeRO-3: / N
    gradients    Psi x 4 bytes when accumulated in fp32 (fp32, bf16, fp16 with
                 --accumulate-allreduce-grads-in-fp32), else 2;               ZeRO-2, 3: / N
    optimizer    Adam m and v 8 bytes, SGD momentum 4 (none without momentum), plus the fp32 main
                 parameters 4 bytes in 16-bit runs and, as copies, in fp32 runs
                 under ZeRO-1/2;                                              ZeRO-1, 2, 3: / N

so 16 Psi bytes for mixed-precision Adam without ZeRO, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N and
16 Psi/N for stages 1, 2, 3 (a shard is rounded up to whole elements; ZeRO-3 shards each layer,
and each embedding and LayerNorm outside the layers, on its own and rounds each up, so a rank holds
up to one element per such unit more than this). ZeRO-3 also needs, while a layer computes, its
whole gathered weights (the largest: the word embeddings, V_pad h / t): not in these terms.

Activations per rank, after Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"), for a micro-batch b, sequence s, a heads, e bytes per activation element (2
in 16-bit runs, 4 in fp32) and 1 byte per dropout-mask element:

    a layer        s b h (4e + 2) replicated over TP (norm inputs and outputs, the two
                   hidden-dropout masks) + s b e ((a + 2g) d + a d + 2f) / t (Q, K, V, the
                   projection's input, the MLP's GeLU input and output; --swiglu: 4f, the gate and
                   up outputs, the gate's SiLU and the product) + a s^2 b (e + 1 + e) / t (softmax
                   output, attention-dropout mask and output); for GPT-2 with e = 2:
                   s b h (10 + 24/t) + 5 a s^2 b / t, the paper's formula; with
                   --sequence-parallel the replicated part is split too: s b h 34/t + 5 a s^2 b / t;
                   multi-latent attention: Q and K a (D + P), V and the projection's input a V per
                   token split by t, the latents and their norms' outputs 2 R_q + 2 R_kv + P
                   replicated (split with --sequence-parallel)
    selective      the attention core is recomputed: no a s^2 b term
    full           each recomputed chunk keeps only its input s b h e; one chunk's activations are
                   rebuilt at a time during the backward
    first stage    the embeddings' output and dropout mask: s b h (e + 1) (/ t with --sequence-parallel)
    last stage     the final norm's input s b h e (/ t with --sequence-parallel) and the fp32 logits
                   s b V_pad/t x 4

times the micro-batches a stage holds at once: min(P - stage, m) under 1F1B (P pipeline stages,
m micro-batches per step), one without pipelining. Dropout masks are left out when the dropout
probability is 0. Memory of the framework itself (workspace, compiled graphs, fragmentation) is not
included.
"""
import math
from dataclasses import asdict, dataclass, field
from typing import List, Optional


@dataclass(frozen=True)
class GPTShape:
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    seq_length: int
    max_position_embeddings: int
    padded_vocab_size: int
    tied_embeddings: bool = True
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    num_query_groups: Optional[int] = None        # default: one per head
    kv_channels: Optional[int] = None             # default: hidden / heads
    swiglu: bool = False
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    normalization: str = "LayerNorm"
    qk_layernorm: bool = False
    learned_positions: bool = True
    mla: Optional[object] = None                  # multi-latent attention's MlaConfig (rapidgpt/config/mla.py)

    @property
    def groups(self):
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self):
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def norm(self, size):
        """A norm's parameters over `size` channels."""
        return size if self.normalization == "RMSNorm" else 2 * size


@dataclass(frozen=True)
class RunLayout:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    data_parallel: int = 1
    zero_stage: int = 0
    micro_batch_size: int = 1
    num_micro_batches: int = 1         # per step and data-parallel rank
    params_bytes: int = 4              # 2: fp16/bf16
    grad_bytes: int = 4
    optimizer_bytes: int = 8           # per parameter, without ZeRO (main copies included)
    recompute_granularity: Optional[str] = None     # None, "selective", "full"
    recompute_method: Optional[str] = None          # "uniform", "block"
    recompute_num_layers: int = 1
    sequence_parallel: bool = False                 # --sequence-parallel (with TP)
    stage_layers: Optional[tuple] = None            # layers per pipeline stage (None: even)
    virtual_pipeline: int = 1                       # model chunks per rank (the interleaved schedule)
    microbatch_group: Optional[int] = None          # its micro-batch group (None: the pipeline size)

    def layers_of(self, shape, stage):
        """The decoder layers pipeline stage `stage` holds."""
        if self.stage_layers is not None:
            return self.stage_layers[stage]
        return shape.num_layers // self.pipeline_parallel

    def chunk_forwards_held(self, stage):
        """How many (model chunk, micro-batch) forwards stage `stage` holds at most: Megatron's
        warm-up plus one (min(P - stage, m) without the interleaved schedule)."""
        pp, m, v = self.pipeline_parallel, self.num_micro_batches, self.virtual_pipeline
        if pp == 1:
            return 1
        if v == 1:
            return min(pp - stage, m)
        return min(2 * (pp - stage - 1) + (v - 1) * (self.microbatch_group or pp) + 1, m * v)


@dataclass
class StageMemory:
    stage: int
    parameters_per_rank: int            # what a rank holds: under ZeRO-3 its 1/DP shard
    parameters_per_model_parallel_rank: int     # the stage's on one TP rank, before ZeRO-3 sharding
    weight_bytes_per_rank: int
    gradient_bytes_per_rank: int
    optimizer_bytes_per_rank: int
    activation_bytes_per_rank: int
    micro_batches_in_flight: int

    @property
    def total_bytes(self):
        return (self.weight_bytes_per_rank + self.gradient_bytes_per_rank + self.optimizer_bytes_per_rank
                + self.activation_bytes_per_rank)


@dataclass
class MemoryEstimate:
    """The JSON keys of data_tools/estimate_memory.py: the whole model's `parameters`, and per rank
    those of the stage whose ranks need the most memory (every stage in `stages`)."""
    parameters: int
    parameters_per_stage: List[int]
    parameters_per_rank: int
    parameters_per_model_parallel_rank: int
    weight_bytes_per_rank: int
    gradient_bytes_per_rank: int
    optimizer_bytes_per_rank: int
    activation_bytes_per_rank: int
    total_bytes_per_rank: int
    largest_stage: int
    stages: List[dict] = field(default_factory=list)

    def as_dict(self):
        return asdict(self)


def layer_parameters(shape, tp=1):
    """One transformer layer's parameters on one of `tp` tensor-parallel ranks."""
    h, f, d, a = shape.hidden_size, shape.ffn_hidden_size, shape.head_dim, shape.num_attention_heads
    fc1 = 2 * f if shape.swiglu else f
    bias = shape.add_bias_linear
    split = h * fc1 + (fc1 if bias else 0) + f * h              # fc1 (+ bias), fc2: split by t
    replicated = 2 * h * bias + 2 * shape.norm(h)               # projection and fc2 biases, the norms
    if shape.mla is None:
        qkv = (a + 2 * shape.groups) * d
        split += h * qkv + (qkv if bias or shape.add_qkv_bias else 0) + a * d * h   # QKV (+ bias), projection
        replicated += 2 * shape.norm(d) if shape.qk_layernorm else 0
    else:
        up, down, norms = mla_matrices(shape)
        split += up
        replicated += down + (norms if shape.qk_layernorm else 0)
    return split // tp + replicated


def mla_matrices(shape):
    """Multi-latent attention's (up-projection and output parameters, split by t; down-projection
    parameters and latent norms' parameters, whole on every TP rank)."""
    m, h, a = shape.mla, shape.hidden_size, shape.num_attention_heads
    q_up = (m.q_lora_rank or h) * a * m.q_head_dim
    up = q_up + m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim) + a * m.v_head_dim * h
    down = (h * m.q_lora_rank if m.q_lora_rank else 0) + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)
    norms = (shape.norm(m.q_lora_rank) if m.q_lora_rank else 0) + shape.norm(m.kv_lora_rank)
    return up, down, norms


def stage_parameters(shape, stage, pp=1, tp=1, layers=None):
    """Parameters of pipeline stage `stage` on one tensor-parallel rank (holding `layers` decoder
    layers; None: an even split)."""
    h = shape.hidden_size
    count = (shape.num_layers // pp if layers is None else layers) * layer_parameters(shape, tp)
    if stage == 0:
        count += shape.padded_vocab_size * h // tp + shape.max_position_embeddings * h * shape.learned_positions
    if stage == pp - 1:
        count += shape.norm(h)
        if pp > 1 or not shape.tied_embeddings:          # the output layer's own matrix or the copy
            count += shape.padded_vocab_size * h // tp
    return count


def training_flops(shape, batch_size):
    """Megatron's num_floating_point_operations for one iteration of `batch_size` sequences (forward
    and backward, matrix products only, recompute not counted), which --log-throughput divides
    by the time and the ranks:

        12 B s l h^2 ((1 + g/a + s/h) a d / h + f/h * (3/2 with --swiglu)) + 6 B s h V_pad

    (GPT-2: 72 B s l h^2 (1 + s/(6h)) + 6 B s h V, the Megatron-LM paper's). With multi-latent
    attention the attention's part is Megatron's MLA terms, 6 B s l (R_q (h + a (D + P) + 1)
    [h a (D + P) without R_q] + R_kv (h + a (D + V) + 1) + h P + a V h + s a (D + P + V))."""
    b, s, l, h = batch_size, shape.seq_length, shape.num_layers, shape.hidden_size
    a, g, d, f = shape.num_attention_heads, shape.groups, shape.head_dim, shape.ffn_hidden_size
    if shape.mla is None:
        attention = (1 + g / a + s / h) * a * d / h
    else:
        m = shape.mla
        q = h * a * m.q_head_dim if m.q_lora_rank is None else m.q_lora_rank * (h + a * m.q_head_dim + 1)
        matrices = (q + m.kv_lora_rank * (h + a * (m.qk_head_dim + m.v_head_dim) + 1) + h * m.qk_pos_emb_head_dim
                    + a * m.v_head_dim * h)
        attention = (matrices + s * a * (m.q_head_dim + m.v_head_dim)) / (2 * h * h)
    mlp = f / h * (1.5 if shape.swiglu else 1.0)
    return 12 * b * s * l * h * h * (attention + mlp) + 6 * b * s * h * shape.padded_vocab_size


def total_parameters(shape):
    """The model's parameters (each once; the tied output layer is the word embeddings)."""
    return stage_parameters(shape, 0, 1, 1)


def megatron_paper_parameters(num_layers, hidden_size, vocab_size, seq_length):
    """Narayanan et al. 2021, section 5.1: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    l, h = num_layers, hidden_size
    return 12 * l * h * h + 13 * l * h + (vocab_size + seq_length) * h


def model_state_bytes(psi, layout):
    """(weights, gradients, optimizer state) bytes of a rank holding `psi` parameters."""
    n, zero = layout.data_parallel, layout.zero_stage
    shard = math.ceil(psi / n)
    return ((shard if zero >= 3 else psi) * layout.params_bytes,
            (shard if zero >= 2 else psi) * layout.grad_bytes,
            (shard if zero >= 1 else psi) * layout.optimizer_bytes)


def layer_activation_bytes(shape, layout, e):
    """Activations one micro-batch leaves in one layer, without recompute, on one TP rank."""
    s, b, h, a = shape.seq_length, layout.micro_batch_size, shape.hidden_size, shape.num_attention_heads
    t, d, f = layout.tensor_parallel, shape.head_dim, shape.ffn_hidden_size
    hidden_mask = 1 if shape.hidden_dropout > 0 else 0
    attention_drop = shape.attention_dropout > 0
    replicated = s * b * h * (4 * e + 2 * hidden_mask) / (t if layout.sequence_parallel else 1)
    mlp = (4 if shape.swiglu else 2) * f
    if shape.mla is None:
        split = s * b * e * ((a + 2 * shape.groups) * d + a * d + mlp) / t
    else:       # Q and K a (D + P), V and the projection's input a V; the latents and norm outputs
        m = shape.mla
        split = s * b * e * (2 * a * m.q_head_dim + 2 * a * m.v_head_dim + mlp) / t
        latents = 2 * (m.q_lora_rank or 0) + 2 * m.kv_lora_rank + m.qk_pos_emb_head_dim
        replicated += s * b * e * latents / (t if layout.sequence_parallel else 1)
    scores = a * s * s * b * (e + (1 + e if attention_drop else 0)) / t
    if layout.recompute_granularity == "selective":
        scores = 0
    return replicated + split + scores


def stage_activation_bytes(shape, layout, stage, e):
    """Activations of one micro-batch on stage `stage`'s ranks (through all of its model chunks)."""
    s, b, h = shape.seq_length, layout.micro_batch_size, shape.hidden_size
    layers = layout.layers_of(shape, stage)
    per_layer = layer_activation_bytes(shape, layout, e)
    if layout.recompute_granularity == "full":
        n = min(layout.recompute_num_layers, layers)
        if layout.recompute_method == "block":
            kept = n * s * b * h * e + (layers - n) * per_layer + (per_layer if n else 0)
        else:
            kept = math.ceil(layers / n) * s * b * h * e + n * per_layer
    else:
        kept = layers * per_layer
    parts = layout.tensor_parallel if layout.sequence_parallel else 1
    if stage == 0:
        kept += s * b * h * (e + (1 if shape.hidden_dropout > 0 else 0)) / parts
    if stage == layout.pipeline_parallel - 1:
        kept += s * b * h * e / parts + s * b * shape.padded_vocab_size // layout.tensor_parallel * 4
    return kept


def estimate(shape, layout):
    """The MemoryEstimate of `shape` (a GPTShape) trained as `layout` (a RunLayout)."""
    pp, e = layout.pipeline_parallel, layout.params_bytes
    stages = []
    for stage in range(pp):
        psi = stage_parameters(shape, stage, pp, layout.tensor_parallel, layout.layers_of(shape, stage))
        # Micro-batches in flight through the whole stage: the held chunk forwards / chunks.
        in_flight = layout.chunk_forwards_held(stage) / layout.virtual_pipeline
        weights, gradients, optimizer = model_state_bytes(psi, layout)
        held = math.ceil(psi / layout.data_parallel) if layout.zero_stage >= 3 else psi
        stages.append(StageMemory(
            stage=stage, parameters_per_rank=held, parameters_per_model_parallel_rank=psi,
            weight_bytes_per_rank=weights,
            gradient_bytes_per_rank=gradients, optimizer_bytes_per_rank=optimizer,
            activation_bytes_per_rank=int(stage_activation_bytes(shape, layout, stage, e) * in_flight),
            micro_batches_in_flight=math.ceil(in_flight)))
    largest = max(stages, key=lambda st: st.total_bytes)
    return MemoryEstimate(
        parameters=total_parameters(shape),
        parameters_per_stage=[stage_parameters(shape, st, pp, 1, layout.layers_of(shape, st)) for st in range(pp)],
        parameters_per_rank=largest.parameters_per_rank,
        parameters_per_model_parallel_rank=largest.parameters_per_model_parallel_rank,
        weight_bytes_per_rank=largest.weight_bytes_per_rank,
        gradient_bytes_per_rank=largest.gradient_bytes_per_rank,
        optimizer_bytes_per_rank=largest.optimizer_bytes_per_rank,
        activation_bytes_per_rank=largest.activation_bytes_per_rank,
        total_bytes_per_rank=largest.total_bytes,
        largest_stage=largest.stage,
        stages=[dict(asdict(st), total_bytes_per_rank=st.total_bytes) for st in stages])


def optimizer_bytes_per_parameter(optimizer, sgd_momentum, half, main_copies=False):
    """Bytes of optimizer state per parameter (before sharding): Adam's m and v, SGD's momentum,
    and the fp32 main parameters in 16-bit runs, or with `main_copies` (ZeRO stages 1 and 2, whose
    fp32 pieces are copies of the whole fp32 parameters: rapidgpt/optim/distributed_optimizer.py;
    at stage 3 the model's fp32 pieces are the main parameters)."""
    state = 8 if optimizer == "adam" else (4 if sgd_momentum else 0)
    return state + (4 if half or main_copies else 0)


def layout_from_args(args):
    """The RunLayout of validated training flags (rapidgpt.arguments)."""
    precision, recompute = args.precision, args.recompute
    split = getattr(args, "pipeline_split", None)
    params_bytes = precision.param_bytes
    zero_stage = args.zero.stage
    return RunLayout(
        tensor_parallel=args.tensor_model_parallel_size, pipeline_parallel=args.pipeline_model_parallel_size,
        data_parallel=args.data_parallel_size, zero_stage=zero_stage,
        micro_batch_size=args.micro_batch_size, num_micro_batches=args.num_micro_batches,
        params_bytes=params_bytes,
        grad_bytes=4 if precision.accumulate_allreduce_grads_in_fp32 else params_bytes,
        optimizer_bytes=optimizer_bytes_per_parameter(args.optimizer, args.sgd_momentum, precision.half,
                                                      zero_stage in (1, 2)),
        recompute_granularity=recompute.granularity, recompute_method=recompute.method,
        recompute_num_layers=recompute.num_layers or 1, sequence_parallel=args.sequence_parallel,
        stage_layers=tuple(len(layers) for layers in split.stage_layers()) if split is not None else None,
        virtual_pipeline=split.virtual_size if split is not None else 1,
        microbatch_group=split.microbatch_group_size if split is not None else None)


def shape_from_args(args, vocab_size):
    """The GPTShape of the model flags, `vocab_size` the tokenizer's (or --vocab-size)."""
    from rapidgpt.tokenizer import padded_vocab_size
    return GPTShape(
        num_layers=args.num_layers, hidden_size=args.hidden_size, num_attention_heads=args.num_attention_heads,
        ffn_hidden_size=args.ffn_hidden_size, seq_length=args.seq_length,
        max_position_embeddings=args.max_position_embeddings,
        padded_vocab_size=padded_vocab_size(vocab_size, args.make_vocab_size_divisible_by,
                                            args.tensor_model_parallel_size),
        tied_embeddings=not args.untie_embeddings_and_output_weights,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        num_query_groups=args.num_query_groups, kv_channels=args.kv_channels, swiglu=args.swiglu,
        add_bias_linear=args.add_bias_linear, add_qkv_bias=args.add_qkv_bias, normalization=args.normalization,
        qk_layernorm=args.qk_layernorm, learned_positions=args.position_embedding_type == "learned_absolute",
        mla=args.mla if args.mla.enabled else None)


def format_bytes(n):
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _where(layout, stage):
    return (f"stage {stage} of {layout.pipeline_parallel}, TP={layout.tensor_parallel}, "
            f"DP={layout.data_parallel}, ZeRO stage {layout.zero_stage}")


def startup_line(args, gpt_vocab_size=None, parameters_on_rank=None):
    """Rank 0's start-up line (where Megatron prints its theoretical memory footprints): the
    built-in GPT's estimate when `gpt_vocab_size` is given, else the model states of a rank with
    `parameters_on_rank` parameters (activations depend on a model this module does not know)."""
    layout = layout_from_args(args)
    if gpt_vocab_size is None:
        weights, gradients, optimizer = model_state_bytes(parameters_on_rank, layout)
        return (f" > theoretical memory per rank ({_where(layout, 0)}): weights {format_bytes(weights)}, "
                f"gradients {format_bytes(gradients)}, optimizer {format_bytes(optimizer)} for its "
                f"{parameters_on_rank:,} parameters; activations not estimated (not the built-in GPT)")
    result = estimate(shape_from_args(args, gpt_vocab_size), layout)
    # Pipelined, the figures are the most loaded stage's (as Megatron's report_theoretical_memory
    # prints its most loaded shard's), said so, with rank 0's own stage's total beside them.
    pipelined = layout.pipeline_parallel > 1
    own = (f"this rank's stage 0: total {format_bytes(result.stages[0]['total_bytes_per_rank'])}; "
           if pipelined and result.largest_stage != 0 else "")
    return (f" > theoretical memory per rank{' of the most loaded pipeline stage' if pipelined else ''} "
            f"({_where(layout, result.largest_stage)}): "
            f"weights {format_bytes(result.weight_bytes_per_rank)}, gradients "
            f"{format_bytes(result.gradient_bytes_per_rank)}, optimizer {format_bytes(result.optimizer_bytes_per_rank)}, "
            f"activations {format_bytes(result.activation_bytes_per_rank)}, total "
            f"{format_bytes(result.total_bytes_per_rank)}; {own}parameters {result.parameters:,} "
            f"(per stage {', '.join(f'{p:,}' for p in result.parameters_per_stage)})")
