"""The Llama family in the built-in decoder (rapidgpt/config/transformer.py's flags): the model's
logits and per-token losses against a float64 numpy port of the Hugging Face / Megatron-core
definitions (written here from those definitions, not from RapidGPT's code), with every weight,
norm and bias random, at many positions (RoPE is the identity at position 0), with query heads per
group != groups (6 heads in 2 groups), Llama 3.1's scaling with an original context far below the
tested positions, Qwen3's head_dim != hidden / heads, partial, interleaved rotation, and DeepSeek's
multi-latent attention (YaRN or RoPE on its rotary channels)."""
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

LLAMA = ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--group-query-attention",
         "--num-query-groups", "2", "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
MLA = ["--multi-latent-attention", "--q-lora-rank", "20", "--kv-lora-rank", "12", "--qk-head-dim", "6",
       "--qk-pos-emb-head-dim", "8", "--v-head-dim", "5", "--qk-layernorm", "--rotary-scaling-factor", "40", "--mscale",
       "1.0", "--mscale-all-dim", "0.8"]
KINDS = {
    "llama": LLAMA,
    "llama3.1": [*LLAMA, "--rotary-base", "500000", "--use-rope-scaling", "--rope-scaling-factor", "4",
                 "--rope-scaling-original-max-position-embeddings", "64"],
    "qwen2": [*LLAMA[:-1], "--add-qkv-bias", "--norm-epsilon", "1e-6"],
    "qwen3": [*LLAMA, "--qk-layernorm", "--kv-channels", "12"],
    "neox": ["--position-embedding-type", "rope", "--rotary-percent", "0.5", "--rotary-interleaved",
             "--apply-layernorm-1p", "--group-query-attention", "--num-query-groups", "3"],
    # Megatron's fp16 device: the same function (its fp16 behaviour: tests/test_mixed_precision.py)
    "qk-layer-scaling": [*LLAMA, "--apply-query-key-layer-scaling"],
    # Nemotron's MLP: relu(x)^2, not gated, with the GPT's learned positions and biases
    "squared-relu": ["--squared-relu", "--normalization", "RMSNorm"],
    # muP (width multiplier 3): the embeddings x2.5, scores x sqrt(4) / 8, logits x1/3
    "mup": [*LLAMA, "--use-mup", "--mup-base-hidden-size", "16", "--mup-embedding-mult", "2.5",
            "--mup-base-head-dim", "4"],
    # muP on GPT-2's model (tied, learned positions): scores / 8^0.75, logits x0.7
    "mup-gpt": ["--use-mup", "--mup-base-hidden-size", "24", "--mup-output-mult", "0.7",
                "--mup-attn-scale-power", "0.75"],
    # DeepSeek's multi-latent attention on GPT-2's model (learned positions kept, as Megatron's functional
    # test): both latents with their norms, YaRN at factor 40 with mscale != mscale_all_dim (the rotary
    # factor and the scores' scale both matter), its ramp across the 8 rotary channels
    "mla": MLA,
    # ... on a Llama-style model: queries projected directly (the key latent's norm alone), RoPE on half
    # of the rotary channels
    "mla-rope": ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                 "--position-embedding-type", "rope", "--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim",
                 "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8", "--qk-layernorm", "--rope-type", "rope",
                 "--rotary-percent", "0.5", "--rotary-base", "500"],
}
BASE = ["--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "6", "--ffn-hidden-size", "40",
        "--seq-length", "24", "--max-position-embeddings", "128", "--vocab-size", "100",
        "--make-vocab-size-divisible-by", "64", "--train-iters", "1"]


def flag(flags, name, default):
    return type(default)(flags[flags.index(name) + 1]) if name in flags else default


# ---- the reference, from the published definitions (float64) ------------------------------------

def ref_norm(x, p, prefix, flags, eps):
    one_p = "--apply-layernorm-1p" in flags
    if flag(flags, "--normalization", "LayerNorm") == "RMSNorm":
        scale = p[prefix + ".weight"] + one_p
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale
    scale = p[prefix + ".gamma"] + one_p
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps) * scale + p[prefix + ".beta"]


def ref_inv_freq(flags, dim):
    """transformers' default and 'llama3' rope_init_fn."""
    base = flag(flags, "--rotary-base", 10000)
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    if "--use-rope-scaling" not in flags:
        return inv_freq
    factor, old = flag(flags, "--rope-scaling-factor", 8.0), flag(flags, "--rope-scaling-original-max-position-embeddings", 8192)
    low_wavelen, high_wavelen = old / 1.0, old / 4.0
    out = []
    for f in inv_freq:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - 1.0) / (4.0 - 1.0)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def exact(x):
    return x


def bf16(x):
    """x rounded to bf16 values (to float32, then to nearest even in the upper 16 bits), as float64."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def ref_rope(x, positions, flags, rnd=exact):
    """x [b, s, n, d]: Llama's rotate_half on the first rot channels, or Megatron's interleaved pairs."""
    d = x.shape[-1]
    rot = int(d * flag(flags, "--rotary-percent", 1.0)) // 2 * 2
    freqs = np.outer(positions, ref_inv_freq(flags, rot))                     # [s, rot/2]
    cos, sin = rnd(np.cos(freqs)[None, :, None]), rnd(np.sin(freqs)[None, :, None])
    out = x.copy()
    if "--rotary-interleaved" in flags:
        even, odd = x[..., 0:rot:2], x[..., 1:rot:2]
        out[..., 0:rot:2] = even * cos - odd * sin
        out[..., 1:rot:2] = odd * cos + even * sin
    else:
        half = rot // 2
        first, second = x[..., :half], x[..., half:rot]
        out[..., :half] = first * cos - second * sin
        out[..., half:rot] = second * cos + first * sin
    return rnd(out)


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def ref_mla_inv_freq(flags, dim):
    """DeepSeek-V2's DeepseekV2YarnRotaryEmbedding (Megatron-core's YarnRotaryEmbedding): its
    frequencies, original context 4096, beta_fast 32, beta_slow 1; RoPE's with --rope-type rope."""
    base = flag(flags, "--rotary-base", 10000)
    extrapolated = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    if flag(flags, "--rope-type", "yarn") == "rope":
        return extrapolated
    factor = flag(flags, "--rotary-scaling-factor", 1.0)

    def correction_dim(rotations):
        return dim * math.log(4096 / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(correction_dim(32)), 0), min(math.ceil(correction_dim(1)), dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / ((high - low) if high != low else 0.001), 0, 1)
    extrapolation_share = 1 - ramp
    return extrapolated / factor * (1 - extrapolation_share) + extrapolated * extrapolation_share


def ref_mla_rope(x, positions, flags, rnd=exact):
    """x [b, s, n, P]: DeepSeek's apply_rotary_pos_emb, its pairs (2i, 2i+1) viewed as halves first,
    cos and sin times YaRN's mscale(F, mscale) / mscale(F, mscale_all_dim)."""
    pos_dim = x.shape[-1]
    rope = flag(flags, "--rope-type", "yarn") == "rope"
    rot = int(pos_dim * flag(flags, "--rotary-percent", 1.0)) // 2 * 2 if rope else pos_dim
    factor = flag(flags, "--rotary-scaling-factor", 1.0)
    attention_factor = 1.0 if rope else (yarn_get_mscale(factor, flag(flags, "--mscale", 1.0))
                                          / yarn_get_mscale(factor, flag(flags, "--mscale-all-dim", 0.0)))
    freqs = np.outer(positions, ref_mla_inv_freq(flags, rot))
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = rnd((np.cos(emb) * attention_factor)[None, :, None]), rnd((np.sin(emb) * attention_factor)[None, :, None])
    head = x[..., :rot].reshape(*x.shape[:-1], rot // 2, 2).swapaxes(-1, -2).reshape(*x.shape[:-1], rot)
    rotated = np.concatenate([-head[..., rot // 2:], head[..., :rot // 2]], axis=-1)
    return rnd(np.concatenate([head * cos + rotated * sin, x[..., rot:]], axis=-1))


def ref_mla(a, p, pre, flags, positions, linear, norm, rnd):
    """Multi-latent attention's q, k `[b, s, n, D + P]`, v `[b, s, n, V]` and the scores' scale
    (Megatron-core's MLASelfAttention; DeepSeek-V2's DeepseekV2Attention)."""
    b, s, _ = a.shape
    heads = flag(flags, "--num-attention-heads", 0)
    d, pos_dim, v_dim = (flag(flags, f"--{name}", default) for name, default in
                         (("qk-head-dim", 128), ("qk-pos-emb-head-dim", 64), ("v-head-dim", 128)))
    rank, qk_norm = flag(flags, "--kv-lora-rank", 32), "--qk-layernorm" in flags
    att = pre + "self_attention."
    if "--q-lora-rank" in flags:
        latent = linear(a, p[att + "linear_q_down_proj.weight"])
        q = linear(norm(latent, att + "q_layernorm") if qk_norm else latent, p[att + "linear_q_up_proj.weight"])
    else:
        q = linear(a, p[att + "linear_q_proj.weight"])
    q = q.reshape(b, s, heads, d + pos_dim)
    compressed = linear(a, p[att + "linear_kv_down_proj.weight"])
    latent, k_pos = compressed[..., :rank], compressed[..., rank:]
    kv = linear(norm(latent, att + "kv_layernorm") if qk_norm else latent, p[att + "linear_kv_up_proj.weight"])
    kv = kv.reshape(b, s, heads, d + v_dim)
    q_pos = ref_mla_rope(q[..., d:], positions, flags, rnd)
    k_pos = np.broadcast_to(ref_mla_rope(k_pos[:, :, None, :], positions, flags, rnd), (b, s, heads, pos_dim))
    q, k = np.concatenate([q[..., :d], q_pos], -1), np.concatenate([kv[..., :d], k_pos], -1)
    factor = flag(flags, "--rotary-scaling-factor", 1.0)
    scale = yarn_get_mscale(factor, flag(flags, "--mscale-all-dim", 0.0)) ** 2 / math.sqrt(d + pos_dim)
    return q, k, kv[..., d:], scale


def ref_logits(p, tokens, positions, flags, vocab, rnd=exact):
    """The logits `[b, s, vocab]`; `rnd` rounds each op's result (bf16: as a bf16 run holds it)."""
    h, heads = flag(flags, "--hidden-size", 0), flag(flags, "--num-attention-heads", 0)
    groups = flag(flags, "--num-query-groups", heads)
    d = flag(flags, "--kv-channels", h // heads)
    r, eps = heads // groups, flag(flags, "--norm-epsilon", 1e-5)
    b, s = tokens.shape
    x = p["word_embeddings.weight"][tokens]
    if flag(flags, "--position-embedding-type", "learned_absolute") == "learned_absolute":
        x = rnd(x + p["position_embeddings.weight"][positions])
    # muP as Megatron-core's TransformerConfig derives it: multipliers, and the scores' scale
    mup = "--use-mup" in flags
    width_mult = h / flag(flags, "--mup-base-hidden-size", h) if mup else 1.0
    output_mult = flag(flags, "--mup-output-mult", 1.0)
    output_mult = 1 / width_mult if mup and output_mult == 1.0 else output_mult
    scale = (math.sqrt(flag(flags, "--mup-base-head-dim", 1.0)) / d ** flag(flags, "--mup-attn-scale-power", 1.0)
             if mup else 1 / math.sqrt(d))
    if mup:
        x = rnd(x * flag(flags, "--mup-embedding-mult", 1.0))

    def linear(a, weight, bias=None):
        y = rnd(a @ weight.T)
        return y if bias is None else rnd(y + bias)

    def attention(q, k, v, scale):
        """Causal softmax attention of q, k `[b, s, n, d]`, v `[b, s, n, d_v]` -> `[b, s, n * d_v]`."""
        scores = rnd(np.einsum("bqnd,bknd->bnqk", q, k) * scale)
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -np.inf, scores)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs = rnd(probs / probs.sum(-1, keepdims=True))
        return rnd(np.einsum("bnqk,bknd->bqnd", probs, v)).reshape(b, s, -1)

    def mlp(x, pre):
        """The layer's second half: x + mlp(norm(x))."""
        a = rnd(ref_norm(x, p, pre + "post_attention_layernorm", flags, eps))
        fc1 = p[pre + "mlp.dense_h_to_4h.weight"]
        if "--swiglu" in flags:
            gate, up = linear(a, fc1[0]), linear(a, fc1[1])
            hidden = rnd(gate / (1 + np.exp(-gate)) * up)
        elif "--squared-relu" in flags:
            hidden = rnd(np.maximum(linear(a, fc1, p.get(pre + "mlp.dense_h_to_4h.bias")), 0) ** 2)
        else:
            u = linear(a, fc1, p[pre + "mlp.dense_h_to_4h.bias"])
            hidden = rnd(0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3))))
        return rnd(x + linear(hidden, p[pre + "mlp.dense_4h_to_h.weight"], p.get(pre + "mlp.dense_4h_to_h.bias")))

    def standard_heads(a, pre):
        """q, k, v `[b, s, n, d]` of the multi-head (grouped-query) attention, k and v repeated."""
        w = p[pre + "self_attention.query_key_value.weight"].reshape(groups, r + 2, d, h)
        bias = p.get(pre + "self_attention.query_key_value.bias")
        bias = None if bias is None else bias.reshape(groups, r + 2, d)
        q, k, v = (linear(a, w[:, j].reshape(-1, h), None if bias is None else bias[:, j].reshape(-1))
                   for j in (slice(0, r), r, r + 1))
        q, k, v = q.reshape(b, s, heads, d), k.reshape(b, s, groups, d), v.reshape(b, s, groups, d)
        if "--qk-layernorm" in flags:
            q = rnd(ref_norm(q, p, pre + "self_attention.q_layernorm", flags, eps))
            k = rnd(ref_norm(k, p, pre + "self_attention.k_layernorm", flags, eps))
        if "rope" in flags:
            q, k = ref_rope(q, positions, flags, rnd), ref_rope(k, positions, flags, rnd)
        return q, np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)              # transformers' repeat_kv

    for i in range(flag(flags, "--num-layers", 0)):
        pre = f"layers.{i}."
        a = rnd(ref_norm(x, p, pre + "input_layernorm", flags, eps))
        if "--multi-latent-attention" in flags:
            q, k, v, layer_scale = ref_mla(a, p, pre, flags, positions, linear,
                                           lambda y, name: rnd(ref_norm(y, p, name, flags, eps)), rnd)
        else:
            q, k, v = standard_heads(a, pre)
            layer_scale = scale
        x = rnd(x + linear(attention(q, k, v, layer_scale), p[pre + "self_attention.dense.weight"],
                           p.get(pre + "self_attention.dense.bias")))
        x = mlp(x, pre)
    x = rnd(ref_norm(x, p, "final_layernorm", flags, eps))
    out = p.get("output_layer.weight", p["word_embeddings.weight"])
    return rnd(linear(x, out) * output_mult)[..., :vocab]


def random_model(flags, rng):
    """(the built-in GPT of `flags` with every weight random, {name: float64 value}), in eval mode."""
    import mindspore as ms
    from mindspore import Tensor

    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model

    model = build_gpt_model(parse_args(argv=flags), 100)
    params = {}
    for name, param in model.parameters_and_names():
        value = rng.standard_normal(param.shape) * (0.3 if param.ndim == 1 else 0.15)
        if name.endswith(("gamma", "layernorm.weight")) and "--apply-layernorm-1p" not in flags:
            value = 1.0 + value                          # norm scales around 1, biases around 0
        param.set_data(Tensor(value, ms.float32))
        params[name] = value.astype(np.float32).astype(np.float64)
    model.set_train(False)
    return model, params


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_and_losses_equal_the_reference_at_many_positions(kind):
    from mindspore import Tensor

    flags = [*BASE, *KINDS[kind]]
    rng = np.random.default_rng(7)
    model, params = random_model(flags, rng)
    tokens = rng.integers(0, 100, (2, 24))
    for start in (0, 97):                                # positions 97..120: far past the original 64
        positions = np.arange(start, start + 24)
        expected = ref_logits(params, tokens, positions, flags, 100)
        position_ids = Tensor(np.tile(positions, (2, 1)).astype(np.int32))
        found = model(Tensor(tokens.astype(np.int32)), position_ids).asnumpy()
        np.testing.assert_allclose(found, expected, rtol=1e-4, atol=2e-5, err_msg=f"{kind} from position {start}")
        labels = rng.integers(0, 100, (2, 24))
        losses = model(Tensor(tokens.astype(np.int32)), position_ids, None, Tensor(labels.astype(np.int32))).asnumpy()
        log_probs = expected - expected.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        reference = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
        np.testing.assert_allclose(losses, reference, rtol=0, atol=1e-5, err_msg=f"{kind} losses from {start}")


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "neox", "mla"])
def test_emulated_bf16_rounds_where_a_bf16_run_holds_bf16(kind):
    """--bf16 on the CPU (rapidgpt/emulated_bf16.py): the logits equal the reference with every op's
    result rounded to bf16 (`ref_logits(..., rnd=bf16)`), far closer than to the exact one. A value
    that the model and the float64 reference round to either side of a bf16 midpoint differs by
    one bf16 step (1/128 relative), so a few do; a missing rounding anywhere moves most of them."""
    from mindspore import Tensor

    from rapidgpt.emulated_bf16 import emulate_bf16

    flags = [*BASE, *KINDS[kind]]
    rng = np.random.default_rng(11)
    model, params = random_model(flags, rng)
    assert emulate_bf16(model) == []
    params = {name: bf16(value) for name, value in params.items()}
    for name, param in model.parameters_and_names():
        np.testing.assert_array_equal(param.asnumpy(), params[name], err_msg=name)
    tokens = rng.integers(0, 100, (2, 24))
    positions = np.arange(5, 29)
    found = model(Tensor(tokens.astype(np.int32)), Tensor(np.tile(positions, (2, 1)).astype(np.int32))).asnumpy()
    rounded, unrounded = (ref_logits(params, tokens, positions, flags, 100, rnd) for rnd in (bf16, exact))
    np.testing.assert_array_equal(found, bf16(found))                       # bf16 values
    scale = np.abs(rounded).max()
    off_rounded, off_exact = np.abs(found - rounded) / scale, np.abs(found - unrounded) / scale
    assert np.mean(off_rounded < 1e-6) > 0.9, (np.mean(off_rounded < 1e-6), off_rounded.max())
    assert off_rounded.mean() < 0.1 * off_exact.mean(), (off_rounded.mean(), off_exact.mean())


# ---- every layout prints the single process's run ------------------------------------------------
# One Llama-style model with every feature whose layout could go wrong: RoPE, RMSNorm, SwiGLU, 6 heads
# in 2 query groups (TP=2: one group of 3 heads per rank), q/k/v biases, q/k norms (their gradients
# summed over TP), an untied output layer; with --sequence-parallel also the norms' gradients summed
# over TP (were they not, the TP ranks' copies would drift apart and the end weights differ); the
# loss per token (--calculate-per-token-loss: gradients divided by the tokens of every data-parallel
# rank, counted on the last pipeline stage); the input embedding and the output layer on their own
# learning-rate curve (--decoupled-lr, a ratio to the other rate that changes along the run); muP at
# width multiplier 2 (the hidden matrices on a third curve and with their own Adam eps, which ZeRO's
# pieces must inherit from the matrices they are cut from; an --adam-eps large enough to show). Run
# by tests/conftest.py's `llama_runs` fixture (the TINY GPT's data, batch and schedule).
LAYOUT_MODEL = ("--hidden-size", "48", "--num-attention-heads", "6", "--ffn-hidden-size", "40", *LLAMA,
                "--add-qkv-bias", "--qk-layernorm", "--calculate-per-token-loss", "--decoupled-lr", "2e-4",
                "--decoupled-min-lr", "1e-4", "--use-mup", "--mup-base-hidden-size", "24", "--adam-eps", "1e-4")
# The fp16 pair below runs the model without muP. Its overflows come from the fp16 sum of the
# per-token losses at scales 4096-8192, decided by that sum's rounding: with muP the TP=2 x DP=2 run
# skipped iteration 12 where one process skipped 10 (measured), the other values alike.
FP16_MODEL = LAYOUT_MODEL[:LAYOUT_MODEL.index("--use-mup")]
PP2 = ("--pipeline-model-parallel-size", "2")
ZERO3 = ("--zero-3-memory-optimization",)
SP = ("--sequence-parallel",)
# Megatron's replica checks, which change no number: each rank's copies of the q/k norms and weights.
CHECKS = ("--test-mode", "--check-weight-hash-across-dp-replicas-interval", "1")
# PP=2 alone is in both PP=2 layouts below. TP=2 runs with --sequence-parallel (TP=2 alone: the GPT's
# layouts, the fp16 run below); ZeRO-2, and ZeRO-3 at DP=2 alone, do the same for any model (the
# GPT's layouts, tests/test_zero.py), ZeRO-3 here at PP=2 x DP=2.
LAYOUTS = {"tp2-sp": (2, 2, *SP, *CHECKS[:1]), "dp2-zero1": (2, 1, "--zero-1-memory-optimization", *CHECKS),
           "pp2xtp2-sp": (4, 2, *PP2, *SP),
           "pp2xdp2-zero3": (4, 1, *PP2, *ZERO3)}
# Multi-latent attention (DeepSeek's MLA) at TP=2 with --sequence-parallel, the layout where its gradients
# take another way than the other attention's: the down projections and latent norms, whole on each rank,
# computed on its part of the sequence (their gradients summed over TP, their copies compared after every
# iteration by --test-mode), the shared rotary key gathered from every part; both latents with their
# norms and YaRN (factor 40, mscale != mscale_all_dim) on the learned-positions model of Megatron's MLA
# functional test, with the Llama-style MLP and norms and the loss per token.
MLA_MODEL = ("--hidden-size", "48", "--num-attention-heads", "6", "--ffn-hidden-size", "40", "--normalization", "RMSNorm",
             "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights", *MLA,
             "--calculate-per-token-loss")
MLA_LAYOUTS = {"mla-tp2-sp": (2, 2, *SP, *CHECKS[:1])}
# Selective recompute (full recompute does the same for any model: tests/test_zero.py's PP=2 run).
SELECTIVE = ("--recompute-granularity", "selective")
FP16 = ("--fp16", "--initial-loss-scale", "65536", "--loss-scale-window", "3")
LLAMA_RUNS = ([(1, 1, *LAYOUT_MODEL)] + [(nproc, tp, *LAYOUT_MODEL, *flags) for nproc, tp, *flags in LAYOUTS.values()]
              + [(2, 2, *LAYOUT_MODEL, *LAYOUTS["tp2-sp"][2:], *SELECTIVE)]
              + [(1, 1, *FP16_MODEL, *FP16), (4, 2, *FP16_MODEL, *FP16)]
              + [(1, 1, *MLA_MODEL)] + [(nproc, tp, *MLA_MODEL, *flags) for nproc, tp, *flags in MLA_LAYOUTS.values()])


@pytest.mark.parametrize("model, layout", [(LAYOUT_MODEL, name) for name in LAYOUTS] +
                         [(MLA_MODEL, name) for name in MLA_LAYOUTS], ids=[*LAYOUTS, *MLA_LAYOUTS])
def test_llama_layouts_print_the_single_process_run(llama_runs, model, layout):
    """lm loss, grad norm (TensorBoard's, unrounded) and validation loss of 12 iterations within 1e-5,
    and the same weights at the end (gathered whole from the checkpoint)."""
    import json
    from pathlib import Path

    from rapidgpt.training.checkpointing import gathered_tensors
    from test_parallel import assert_same_run, assert_same_weights

    nproc, tp, *flags = {**LAYOUTS, **MLA_LAYOUTS}[layout]
    found, save, log = llama_runs(nproc, tp, *model, *flags)
    reference, single_save, _ = llama_runs(1, 1, *model)
    if "--test-mode" in flags:      # the checks ran (a mismatch would have stopped the run)
        compared = ("4 q/k norm weights" if model is LAYOUT_MODEL else
                    "8 q/k norm weights and multi-latent attention's latent weights")
        assert f" > --test-mode: after every iteration, the {compared} of this rank are compared" in log
    if CHECKS[1] in flags:
        assert " > every 1 iterations, every model weight is compared with each data-parallel rank's" in log
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)


def test_llama_checkpoint_resumes_and_converts_across_layouts(llama_runs, env, tmp_path):
    """The PP=2 x TP=2 (sequence-parallel) run's checkpoint at iteration 6 resumes in one process
    with the single-process run's iterations 7..12 (and their decoupled learning rates); its
    iteration-12 checkpoint converted offline to TP=1, PP=1 holds the same tensors."""
    from rapidgpt.training.checkpointing import gathered_tensors
    from test_parallel import TINY, assert_same_run, checkpoint_of, convert_checkpoint, single, values
    _, save, _ = llama_runs(4, 2, *LAYOUT_MODEL, *PP2, *SP)
    reference, _, reference_log = llama_runs(1, 1, *LAYOUT_MODEL)
    status, log = single(TINY + [*LAYOUT_MODEL, "--load", checkpoint_of(save, 6, tmp_path / "load"),
                                 "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert "resharded to 1" in log
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])    # iterations 7..12, the last 2 validations
    def decoupled_rates(text):
        return [line.split("decoupled learning rate: ")[1].split(" |")[0] for line in text.splitlines()
                if line.startswith(" iteration ")]
    assert len(decoupled_rates(log)) == 6 and decoupled_rates(log) == decoupled_rates(reference_log)[6:]
    convert_checkpoint(env, save, tmp_path / "tp1", "--target-tensor-parallel-size", "1",
                       "--target-pipeline-parallel-size", "1")
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    original, converted = gathered_tensors(save), gathered_tensors(tmp_path / "tp1")
    assert sorted(converted) == sorted(original)
    for name, value in original.items():
        ours = converted[name]
        if ours.shape != value.shape:                  # the vocabulary padding depends on the TP size
            ours, value = ours[:vocab_size], value[:vocab_size]
        np.testing.assert_array_equal(ours, value, err_msg=name)


@pytest.mark.parametrize("kind, constant_mask", [("llama", True), ("qwen3", True), ("mla", True), ("llama", False)],
                         ids=["llama", "qwen3", "mla", "llama-computed-mask"])
def test_cached_decoding_gives_the_full_forward_logits(kind, constant_mask, monkeypatch):
    """Generation's key/value cache (of the query groups' heads) with rotary positions: a prompt,
    then one token at a time, gives the logits of the whole sequence's forward at each position;
    also with the causal mask computed per forward (contexts longer than
    CONSTANT_CAUSAL_MASK_POSITIONS), which gives the constant mask's logits."""
    import rapidgpt.models.attention as attention
    if not constant_mask:
        monkeypatch.setattr(attention, "CONSTANT_CAUSAL_MASK_POSITIONS", 8)
    from mindspore import Tensor

    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.parallel.random import initialize_parameters

    model = build_gpt_model(parse_args(argv=[*BASE, *KINDS[kind]]), 100)
    initialize_parameters(model, 5)
    model.set_train(False)
    tokens = np.random.default_rng(3).integers(0, 100, (1, 14)).astype(np.int32)
    full = model(Tensor(tokens), Tensor(np.arange(14, dtype=np.int32)[None])).asnumpy()
    logits, past = model.decode(Tensor(tokens[:, :10]), Tensor(np.arange(10, dtype=np.int32)[None]))
    steps = [logits.asnumpy()]
    heads_and_dim = {"llama": (2, 8), "qwen3": (2, 12), "mla": (6, 14)}[kind]    # groups, or MLA's heads
    assert past[0][0].shape == (1, heads_and_dim[0], 10, heads_and_dim[1])      # [b, heads, s, head_dim]
    for i in range(10, 14):
        logits, past = model.decode(Tensor(tokens[:, i:i + 1]), Tensor(np.array([[i]], np.int32)), past)
        steps.append(logits.asnumpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)


def test_llama_selective_recompute_with_sequence_parallelism_prints_exactly_the_run_without_it(llama_runs):
    """Selective recompute at TP=2 with --sequence-parallel: the very values of the run without it."""
    found, _, log = llama_runs(2, 2, *LAYOUT_MODEL, *LAYOUTS["tp2-sp"][2:], *SELECTIVE)
    assert "activation recompute: selective (core attention) (2 cells marked)" in log
    assert found == llama_runs(2, 2, *LAYOUT_MODEL, *LAYOUTS["tp2-sp"][2:])[0]


def test_llama_fp16_on_tp2_x_dp2_follows_the_single_process_fp16_run(llama_runs):
    """fp16 (a loss scale that grows and overflows within the run) at TP=2 x DP=2: losses, grad
    norms and validation losses within 5e-3 of one process's fp16 run, the same iterations skipped
    at the same loss scales."""
    from test_parallel import SCALES, assert_close_run, skipped
    found, _, log = llama_runs(4, 2, *FP16_MODEL, *FP16)
    reference, _, reference_log = llama_runs(1, 1, *FP16_MODEL, *FP16)
    assert 0 < len(skipped(reference_log)) < 12 and skipped(log) == skipped(reference_log)
    assert SCALES.findall(log) == SCALES.findall(reference_log)
    assert_close_run(found, reference, 5e-3)


@pytest.mark.parametrize("mup", [False, True], ids=["", "mup"])
def test_init_is_megatron_cores_with_embedding_std_and_mup(mup):
    """--embedding-init-method-std 0.03, with and without --use-mup at width multiplier 4:
    Megatron-core's init (TransformerConfig.__post_init__, LanguageModelEmbedding, GPTModel): the
    layers' matrices N(0, std / sqrt(m)), their output projections N(0, std / (sqrt(2 L) sqrt(m))),
    the embeddings N(0, 0.03), the untied output layer N(0, std), with muP N(0, 0.03); measured on
    16k-64k draws."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.parallel.random import initialize_parameters
    std, embedding_std, layers, width_mult = 0.05, 0.03, 3, 4 if mup else 1
    args = parse_args(argv=["--num-layers", str(layers), "--hidden-size", "128", "--num-attention-heads", "4",
                            "--seq-length", "16", "--max-position-embeddings", "128", "--vocab-size", "256",
                            "--train-iters", "1", "--init-method-std", str(std), "--untie-embeddings-and-output-weights",
                            "--embedding-init-method-std", str(embedding_std)]
                      + (["--use-mup", "--mup-base-hidden-size", "32"] if mup else []))
    model = build_gpt_model(args, 256)
    initialize_parameters(model, seed=1234)
    expected = {"word_embeddings.weight": embedding_std, "position_embeddings.weight": embedding_std,
                "output_layer.weight": embedding_std if mup else std,
                "query_key_value.weight": std / math.sqrt(width_mult),
                "dense_h_to_4h.weight": std / math.sqrt(width_mult),
                "self_attention.dense.weight": std / math.sqrt(2 * layers) / math.sqrt(width_mult),
                "dense_4h_to_h.weight": std / math.sqrt(2 * layers) / math.sqrt(width_mult)}
    seen = set()
    for name, param in model.parameters_and_names():
        for suffix, wanted in expected.items():
            if name.endswith(suffix):
                assert np.std(param.asnumpy()) == pytest.approx(wanted, rel=0.03), name
                seen.add(suffix)
    assert seen == set(expected)


@pytest.mark.parametrize("flags, message", [
    (("--tensor-model-parallel-size", "2", "--seq-length", "15", "--max-position-embeddings", "16"),
     "--sequence-parallel: --seq-length 15 is not divisible by --tensor-model-parallel-size 2"),
    (("--tensor-model-parallel-size", "2", "--model-type", "bert"),
     "--sequence-parallel: the built-in BERT does not split the sequence"),
    (("--tensor-model-parallel-size", "2", "--task", "text_generation"),
     "--sequence-parallel: generation runs the whole sequence on every TP rank"),
    (("--num-query-groups", "3", "--group-query-attention", "--tensor-model-parallel-size", "2"),
     "--num-query-groups: 3 is not divisible by --tensor-model-parallel-size 2"),
    (("--num-query-groups", "4", "--group-query-attention"), "--num-query-groups: 4 must divide --num-attention-heads 6"),
    (("--use-rope-scaling",), "--use-rope-scaling: scales rotary embeddings; add --position-embedding-type rope"),
    (("--tensor-model-parallel-size", "2", "--zero-3-memory-optimization"), "--sequence-parallel: not with ZeRO-3"),
    (("--squared-relu", "--swiglu"), "--squared-relu: not with --swiglu (the gated MLP's activation is SiLU)"),
    (("--mup-base-hidden-size", "16", "--mup-output-mult", "2"),
     "--mup-base-hidden-size, --mup-output-mult: muP's settings; add --use-mup"),
    (("--use-mup", "--mup-base-hidden-size", "0"), "--mup-base-hidden-size: must be positive, got 0"),
    (("--use-mup", "--mup-base-hidden-size", "16", "--mup-width-mult", "2"),
     "--mup-width-mult: 2 contradicts --hidden-size 48 / --mup-base-hidden-size 16; drop it"),
    (("--use-mup", "--model-type", "bert"), "--use-mup: built for GPT models"),
    (("--embedding-init-method-std", "0"), "--embedding-init-method-std: must be positive, got 0.0"),
    (("--use-mup", "--pretrained-model-name-or-path", str(Path(__file__).parent / "fixtures" / "hf_llama_tiny")),
     "--use-mup: changes the attention scale and the logits of a Hugging Face model"),
])
def test_architecture_flags_are_checked_with_one_line_each(flags, message):
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    argv = ["--num-attention-heads", "6", "--hidden-size", "48", "--sequence-parallel", "--train-iters", "1", *flags]
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(argv), world_size=2)
    assert any(problem.startswith(message) for problem in error.value.problems), error.value.problems


def test_sequence_parallel_is_off_without_tensor_parallelism():
    """Megatron's rule: at TP=1 there is nothing to split."""
    from rapidgpt.arguments import parse_args
    assert parse_args(argv=["--sequence-parallel", "--train-iters", "1"]).sequence_parallel is False


TOKENIZER_MODELS = {"HuggingFaceTokenizer": "hf_tokenizer_tiny", "Llama2Tokenizer": "sentencepiece_tiny/tokenizer.model"}


@pytest.mark.parametrize("kind", list(TOKENIZER_MODELS))
def test_tokenizer_model_from_preprocessing_to_generation(env, tmp_path, kind):
    """--tokenizer-type HuggingFaceTokenizer / Llama2Tokenizer --tokenizer-model PATH end to end with
    a Llama-style model: data_tools/preprocess_data.py tokenizes a corpus with the folder or
    SentencePiece model, pretraining reads it and saves a checkpoint that carries the tokenizer's
    files, text generation from that checkpoint needs no tokenizer or model flag, and --to-hf
    writes the tokenizer into the Hugging Face folder."""
    import argparse
    import subprocess
    import sys

    from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata
    from test_parallel import REPO, single
    model = str(REPO / "tests" / "fixtures" / TOKENIZER_MODELS[kind])
    folder = os.path.dirname(model) if os.path.isfile(model) else model
    texts = json.loads((Path(folder) / "reference.json").read_text())["texts"]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(texts[i:] + texts[:i])}) + "\n" for i in range(40)))
    tokenizer = ["--tokenizer-type", kind, "--tokenizer-model", model]
    out = subprocess.run([sys.executable, "data_tools/preprocess_data.py", "--input", str(corpus), "--output-prefix",
                          str(tmp_path / "corpus"), *tokenizer, "--append-eod", "--no-progress-bar"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    status, log = single(["--task", "pretraining", "--num-layers", "2", "--hidden-size", "48", "--num-attention-heads",
                          "6", "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "4", "--log-interval",
                          "2", "--eval-iters", "1", "--no-progress-bar", "--max-new-tokens", "0", *LLAMA,
                          "--data-path", str(tmp_path / "corpus_text_document"), *tokenizer,
                          "--save", str(tmp_path / "ckpt")], env)
    assert status == 0, log[-3000:]
    checkpoint = find_checkpoint(str(tmp_path / "ckpt"))
    recorded = read_metadata(checkpoint)["model"]["tokenizer_model"]
    assert recorded.startswith(checkpoint)
    if os.path.isdir(model):
        assert sorted(os.listdir(recorded)) == sorted(
            name for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
            if os.path.isfile(os.path.join(folder, name)))
    else:
        assert Path(recorded).read_bytes() == Path(model).read_bytes()
    status, log = single(["--task", "text_generation", "--load", str(tmp_path / "ckpt"), "--prompt", texts[1],
                          "--max-new-tokens", "4"], env)
    assert status == 0 and "continuation" in log, log[-3000:]

    # --to-hf writes the tokenizer as AutoTokenizer reads it (checked by hand with transformers
    # 4.57.6: its ids equal RapidGPT's on the fixtures' texts, but for "</s>" written as text, which
    # the slow LlamaTokenizer reads as EOS), and config.json its BOS/EOS ids.
    sys.path.insert(0, str(REPO / "data_tools"))
    import convert_hf
    from rapidgpt.models.hf_files import read_safetensors
    from rapidgpt.tokenizer import build_tokenizer
    ours = build_tokenizer(argparse.Namespace(tokenizer_type=kind, tokenizer_model=model))
    exported = tmp_path / "hf"
    assert convert_hf.main(["--to-hf", "--load", str(tmp_path / "ckpt"), "--hf-dir", str(exported)]) == 0
    config = json.loads((exported / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (ours.bos, ours.eod)
    assert config["vocab_size"] == ours.vocab_size          # the tokenizer's, not the run's padded rows
    embedding, _ = read_safetensors(str(exported / "model.safetensors"))
    assert embedding["model.embed_tokens.weight"].shape == (ours.vocab_size, 48)
    if os.path.isdir(model):
        for name in os.listdir(recorded):
            assert (exported / name).read_bytes() == Path(folder, name).read_bytes(), name
        # and back: the checkpoint made from the exported folder carries its tokenizer
        assert convert_hf.main(["--hf-dir", str(exported), "--save", str(tmp_path / "back")]) == 0
        back = read_metadata(find_checkpoint(str(tmp_path / "back")))["model"]
        assert back["tokenizer_type"] == kind and sorted(os.listdir(back["tokenizer_model"])) == sorted(os.listdir(recorded))
    else:
        assert (exported / "tokenizer.model").read_bytes() == Path(model).read_bytes()
        assert json.loads((exported / "tokenizer_config.json").read_text()) == {
            "tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": True,
            "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
