"""A float64 numpy GPT (GPT-2's math) used as the reference for RapidGPT's forward."""
import math

import numpy as np


def _layernorm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


ACTIVATIONS = {"gelu_new": _gelu_tanh, "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2))),
               "relu2": lambda x: np.maximum(x, 0) ** 2}          # HF GPT-2's activation_function names


def numpy_gpt_logits(params, tokens, heads, eps=1e-5, activation="gelu_new"):
    """GPT forward in float64 numpy from the RapidGPT parameter dict (names as in the model):
    logits over every (padded) row of the output weight, which is `output_layer.weight` when
    present (untied), else the word embeddings."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    b, s = tokens.shape
    x = p["word_embeddings.weight"][tokens] + p["position_embeddings.weight"][np.arange(s)][None]
    layer_ids = sorted({int(k.split(".")[1]) for k in p if k.startswith("layers.")})
    for i in layer_ids:
        q = lambda n: p[f"layers.{i}.{n}"]  # noqa: E731
        h = _layernorm(x, q("input_layernorm.gamma"), q("input_layernorm.beta"), eps)
        qkv = h @ q("self_attention.query_key_value.weight").T + q("self_attention.query_key_value.bias")
        hn = x.shape[-1] // heads
        qkv = qkv.reshape(b, s, heads, 3, hn)
        qh, kh, vh = (qkv[:, :, :, j].transpose(0, 2, 1, 3) for j in range(3))
        scores = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(hn)
        scores = np.where(np.triu(np.ones((s, s), bool), 1), -10000.0, scores)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ vh).transpose(0, 2, 1, 3).reshape(b, s, -1)
        x = x + context @ q("self_attention.dense.weight").T + q("self_attention.dense.bias")
        h = _layernorm(x, q("post_attention_layernorm.gamma"), q("post_attention_layernorm.beta"), eps)
        h = ACTIVATIONS[activation](h @ q("mlp.dense_h_to_4h.weight").T + q("mlp.dense_h_to_4h.bias"))
        x = x + h @ q("mlp.dense_4h_to_h.weight").T + q("mlp.dense_4h_to_h.bias")
    x = _layernorm(x, p["final_layernorm.gamma"], p["final_layernorm.beta"], eps)
    return x @ p.get("output_layer.weight", p["word_embeddings.weight"]).T
