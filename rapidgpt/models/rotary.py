"""Rotary position embeddings (--position-embedding-type rope), Megatron-core's and Llama's.

For a head of `d` channels, the first `r` = int(d * --rotary-percent) (even) are rotated by the
token's position p: channel pair i turns by the angle p * inv_freq[i], inv_freq[i] = 1 / base^(2i/r)
(--rotary-base), optionally with Llama 3.1's frequency scaling (--use-rope-scaling); the rest pass
unchanged. Pairs are (i, i + r/2) by default (Llama's `rotate_half`, Megatron's default) or
(2i, 2i+1) with --rotary-interleaved.

Multi-latent attention (rapidgpt/config/mla.py) rotates its positional channels by its own
frequencies (YaRN's by default), whatever --position-embedding-type says.

`RotaryEmbedding(position_ids)` gives cos and sin stacked, `[2, b or 1, 1, s, r]` fp32, looked up
in tables computed once in float64 for every position up to --max-position-embeddings;
`apply_rotary(x, rotary)` rotates q or k `[b, n, s, d]`. The model computes them once per forward
and hands them to every layer (rapidgpt/models/gpt.py) as one tensor: a pipeline stage's compiled
layers, called from PyNative's autograd recording, returned their parameters' gradients out of
order when given the two as a tuple (MindSpore 2.10).
"""
import math

import numpy as np
from mindspore import Tensor, nn, ops


def inverse_frequencies(config):
    """inv_freq `[r / 2]` float64, with Llama 3.1's scaling when the config asks for it (the rule of
    Megatron-core's `_apply_scaling` and transformers' llama3 rope type)."""
    dim = config.rotary_dim
    inv_freq = 1.0 / config.rotary_base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    if not config.use_rope_scaling:
        return inv_freq
    factor, low, high = (config.rope_scaling_factor, config.rope_scaling_low_freq_factor,
                         config.rope_scaling_high_freq_factor)
    old_context = config.rope_scaling_original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    smooth = (old_context / wavelength - low) / (high - low)
    scaled = np.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
    medium = (wavelength <= old_context / low) & (wavelength >= old_context / high)
    return np.where(medium, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


def rotary_tables(config, positions):
    """(cos, sin) `[positions, r]` float32 in the layout `apply_rotary` expects; under multi-latent
    attention its positional channels' (rapidgpt/config/mla.py), times YaRN's attention factor."""
    mla = config.mla
    inv_freq = (mla.inverse_frequencies(config.rotary_base, config.rotary_percent) if mla.enabled
                else inverse_frequencies(config))
    angles = np.outer(np.arange(positions, dtype=np.float64), inv_freq)                     # [p, r/2]
    if config.rotary_interleaved:
        angles = np.repeat(angles, 2, axis=1)                       # f0 f0 f1 f1 ...
    else:
        angles = np.concatenate([angles, angles], axis=1)           # f0 f1 ... f0 f1 ...
    scale = mla.rotary_scale if mla.enabled else 1.0
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


class RotaryEmbedding(nn.Cell):
    """`position_ids` `[b, s]` or `[s]` -> cos and sin `[2, b or 1, 1, s, r]` fp32 (no parameters)."""

    def __init__(self, config):
        super().__init__()
        cos, sin = rotary_tables(config, config.max_position_embeddings)
        self.cos, self.sin = Tensor(cos), Tensor(sin)

    def construct(self, position_ids):
        cos, sin = ops.gather(self.cos, position_ids, 0), ops.gather(self.sin, position_ids, 0)
        if cos.ndim == 2:                                           # [s, r]
            cos, sin = ops.expand_dims(cos, 0), ops.expand_dims(sin, 0)
        return ops.stack((ops.expand_dims(cos, 1), ops.expand_dims(sin, 1)))   # [2, b, 1, s, r]


def _rotate(x, interleaved):
    """The partner of each channel with the sign of the rotation: rotate_half or its interleaved form."""
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
        first, second = ops.split(pairs, 1, axis=-1)
        return ops.cat((-second, first), axis=-1).reshape(x.shape)
    first, second = ops.split(x, x.shape[-1] // 2, axis=-1)
    return ops.cat((-second, first), axis=-1)


def apply_rotary(x, rotary, interleaved=False):
    """q or k `[b, n, s, d]` with its first r = rotary.shape[-1] channels rotated (in x's dtype)."""
    r = rotary.shape[-1]
    cos, sin = rotary[0].astype(x.dtype), rotary[1].astype(x.dtype)
    if r == x.shape[-1]:
        return x * cos + _rotate(x, interleaved) * sin
    rotated, passed = ops.split(x, [r, x.shape[-1] - r], axis=-1)
    return ops.cat((rotated * cos + _rotate(rotated, interleaved) * sin, passed), axis=-1)
