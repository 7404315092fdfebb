"""The normalisations of the built-in models (--normalization, rapidgpt/config/transformer.py):
LayerNorm and RMSNorm over the last axis `[..., h]`, computed in fp32 whatever the input and
parameter dtype, the result in the input's dtype (Megatron's fused-norm semantics for 16-bit
models; a no-op cast in fp32 models), rounded to bf16 values under emulated bf16
(rapidgpt/emulated_bf16.py).

Both are ShardableLayers (ZeRO-3 gathers their weights) and take two options of Megatron's:
- `one_p` (--apply-layernorm-1p): the scale is stored centred on zero, initialised to 0, and the
  norm applies 1 + scale;
- `summed_over_tp`: for a norm inside a tensor-parallel region (Qwen3's per-head q/k norms, each
  rank normalising its own heads), the weights pass through CopyToTensorParallelRegion, whose
  backward sums their gradients over the TP ranks, so the replicated copies get the whole
  gradient and stay equal.
"""
import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from rapidgpt.emulated_bf16 import RoundsToBf16
from rapidgpt.parallel.fully_sharded import ShardableLayer
from rapidgpt.parallel.mappings import CopyToTensorParallelRegion
from rapidgpt.parallel.state import get_tensor_model_parallel_world_size


def composite_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis of `x` `[..., h]` written as the ops it is made of (mean,
    biased variance, normalisation, scale and shift), so that graph kernel fusion fuses it and its
    gradient into generated kernels. Why (MindSpore 2.10, CPU): its LayerNorm kernels are slow
    (forward and backward of `[1024, 256]`: 7.3-8.7 ms, this form fused: 1.75 ms; `[2048, 768]`: ~32
    ms for the kernel's backward alone), ~9% of the bench model's step. MindSpore's own expansion of
    those kernels (rapidgpt/config/kernel_fusion.py) computes a wrong forward at TP=2 with
    recompute; this form does not (the TP-with-recompute, pipeline and ZeRO equivalence tests hold
    with it)."""
    mean = x.mean(-1, keep_dims=True)
    centred = x - mean
    variance = (centred * centred).mean(-1, keep_dims=True)
    return centred * ops.rsqrt(variance + epsilon) * gamma + beta


class _NormOptions:
    """`one_p` and `summed_over_tp` (module docstring) for a norm's weights."""

    def _set_options(self, one_p, summed_over_tp):
        self.one_p = one_p
        self.summed_over_tp = summed_over_tp and get_tensor_model_parallel_world_size() > 1
        if self.summed_over_tp:
            self.copy_to_region = CopyToTensorParallelRegion()

    def _applied(self, weights):
        """The norm's weights as fp32 tensors, the scale first, as the formula uses them."""
        if self.summed_over_tp:
            weights = tuple(self.copy_to_region(w) for w in weights)
        weights = tuple(w if w.dtype == ms.float32 else w.astype(ms.float32) for w in weights)
        return ((weights[0] + 1.0,) + weights[1:]) if self.one_p else weights


class LayerNorm(ShardableLayer, RoundsToBf16, _NormOptions, nn.LayerNorm):
    """mindspore.nn.LayerNorm (same parameters, `gamma` and `beta`) in fp32 (module docstring).
    `composite` (set where the CPU step is fused, rapidgpt/training/model_transforms.py): fp32
    LayerNorm as `composite_layer_norm` instead of MindSpore's kernel -- the same formula, rounded
    differently (~1e-7 relative)."""

    def __init__(self, *args, one_p=False, summed_over_tp=False, **kwargs):
        if one_p:
            kwargs["gamma_init"] = "zeros"
        super().__init__(*args, **kwargs)
        self.weight_names = ("gamma", "beta")
        self.composite = False
        self._set_options(one_p, summed_over_tp)

    def construct(self, x):
        gamma, beta = self._applied(self.whole_weights())
        if x.dtype == ms.float32:                                   # decided while compiling
            if self.composite:
                return self.rounded(composite_layer_norm(x, gamma, beta, self.epsilon))
            y, _, _ = self.layer_norm(x, gamma, beta)
            return self.rounded(y)
        y, _, _ = self.layer_norm(x.astype(ms.float32), gamma, beta)
        return y.astype(x.dtype)


class RMSNorm(ShardableLayer, RoundsToBf16, _NormOptions, nn.Cell):
    """`x / sqrt(mean(x^2) + eps) * weight` over the last axis (Llama's; no bias, no centring),
    in fp32 (module docstring). Written as composite ops, which graph kernel fusion fuses."""

    def __init__(self, hidden_size, epsilon=1e-5, one_p=False, summed_over_tp=False):
        super().__init__()
        value = np.zeros if one_p else np.ones
        self.weight = Parameter(Tensor(value((hidden_size,), np.float32)), name="weight")
        self.weight_names = ("weight",)
        self.epsilon = epsilon
        self._set_options(one_p, summed_over_tp)

    def construct(self, x):
        (weight,) = self._applied(self.whole_weights())
        x32 = x.astype(ms.float32)
        y = x32 * ops.rsqrt((x32 * x32).mean(-1, keep_dims=True) + self.epsilon) * weight
        return self.rounded(y.astype(x.dtype))


def build_norm(config, size, summed_over_tp=False):
    """The --normalization of `config` (a TransformerConfig) over the last axis of `size`."""
    if config.normalization == "RMSNorm":
        return RMSNorm(size, config.layernorm_epsilon, config.apply_layernorm_1p, summed_over_tp)
    return LayerNorm((size,), epsilon=config.layernorm_epsilon, one_p=config.apply_layernorm_1p,
                     summed_over_tp=summed_over_tp)
