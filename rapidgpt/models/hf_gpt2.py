"""Hugging Face GPT-2 <-> RapidGPT's GPT: configuration, weight layouts, safetensors files.

A Hugging Face GPT-2 folder holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and usually the tokenizer's `vocab.json` + `merges.txt`. Tensor
names are `transformer.wte.weight`, `transformer.h.{i}.attn.c_attn.weight`, ... when saved from
GPT2LMHeadModel and the same without `transformer.` when saved from GPT2Model; both are read,
exports use the GPT2LMHeadModel names.

The two models compute the same function (pre-LayerNorm blocks, tanh GELU = HF's `gelu_new`,
learned absolute positions, causal softmax attention scaled by 1/sqrt(head_dim), final LayerNorm,
output layer tied to the token embeddings unless `tie_word_embeddings` is false); only the storage
differs, and every conversion below is a transpose or a reshape, so values are copied bit for bit:

    HF (Conv1D, weight [in, out])            RapidGPT (weight [out, in], Megatron's)
    h.{i}.ln_1.weight / .bias                layers.{i}.input_layernorm.gamma / .beta
    h.{i}.attn.c_attn.weight [h, 3h]         layers.{i}.self_attention.query_key_value.weight [3h, h]
        output axis [3, heads, hd]               output axis [heads, 3, hd] (a TP split keeps
        (all q, then all k, then all v)          each head's q, k, v together)
    h.{i}.attn.c_attn.bias [3h]              ...query_key_value.bias [3h], same reorder
    h.{i}.attn.c_proj.weight [h, h]          layers.{i}.self_attention.dense.weight, transposed
    h.{i}.ln_2.weight / .bias                layers.{i}.post_attention_layernorm.gamma / .beta
    h.{i}.mlp.c_fc.weight [h, ffn]           layers.{i}.mlp.dense_h_to_4h.weight [ffn, h]
    h.{i}.mlp.c_proj.weight [ffn, h]         layers.{i}.mlp.dense_4h_to_h.weight [h, ffn]
    wte.weight [vocab, h]                    word_embeddings.weight [padded vocab, h]
    wpe.weight [n_positions, h]              position_embeddings.weight
    ln_f.weight / .bias                      final_layernorm.gamma / .beta
    lm_head.weight [vocab, h] (untied only)  output_layer.weight [padded vocab, h]

Vocabulary padding (`--make-vocab-size-divisible-by`): the padded rows are zeros on import and
dropped on export. A tied HF model's file has no `lm_head.weight` (HF saves a tied tensor once).

Files (safetensors, config.json, sharded weights): rapidgpt/models/hf_files.py.
"""
import json
import os

import numpy as np

from rapidgpt.models.hf_files import (CONFIG, ConfigChecks, check_tensor_shapes, read_hf_config,
                                      read_hf_weights)

TOKENIZER_FILES = {"vocab_file": "vocab.json", "merge_file": "merges.txt"}
EOD_TOKEN = "<|endoftext|>"
# HF's activation_function names of the MLP activations the built-in GPT computes, and the RapidGPT
# flags that select each: the tanh GELU (`gelu_new`, `gelu_pytorch_tanh`: GPT-2's), the exact erf
# GELU (`gelu`: --no-bias-gelu-fusion) and the squared ReLU (`relu2`: --squared-relu).
ACTIVATION_FLAGS = {"gelu_new": {}, "gelu_pytorch_tanh": {}, "gelu": {"bias_gelu_fusion": False},
                    "relu2": {"squared_relu": True}}
HF_ACTIVATION = {"gelu_tanh": "gelu_new", "gelu": "gelu", "squared_relu": "relu2"}      # TransformerConfig's

# Per-layer tensors: HF name under h.{i}., RapidGPT name under layers.{i}., layout change.
_LAYER_TENSORS = (
    ("ln_1.weight", "input_layernorm.gamma", None),
    ("ln_1.bias", "input_layernorm.beta", None),
    ("attn.c_attn.weight", "self_attention.query_key_value.weight", "qkv"),
    ("attn.c_attn.bias", "self_attention.query_key_value.bias", "qkv"),
    ("attn.c_proj.weight", "self_attention.dense.weight", "transpose"),
    ("attn.c_proj.bias", "self_attention.dense.bias", None),
    ("ln_2.weight", "post_attention_layernorm.gamma", None),
    ("ln_2.bias", "post_attention_layernorm.beta", None),
    ("mlp.c_fc.weight", "mlp.dense_h_to_4h.weight", "transpose"),
    ("mlp.c_fc.bias", "mlp.dense_h_to_4h.bias", None),
    ("mlp.c_proj.weight", "mlp.dense_4h_to_h.weight", "transpose"),
    ("mlp.c_proj.bias", "mlp.dense_4h_to_h.bias", None),
)
_TOP_TENSORS = (("wte.weight", "word_embeddings.weight"), ("wpe.weight", "position_embeddings.weight"),
                ("ln_f.weight", "final_layernorm.gamma"), ("ln_f.bias", "final_layernorm.beta"))
# Buffers older transformers versions saved with the weights (the causal mask): not parameters.
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _gpt2_name(stored_name):
    """A stored tensor's name without `transformer.`; None for a buffer that is not a weight."""
    name = stored_name[len("transformer."):] if stored_name.startswith("transformer.") else stored_name
    return None if name.startswith("h.") and name.endswith(_IGNORED_SUFFIXES) else name


def read_hf_folder(hf_dir):
    """`(config, tensors, notes)` of a Hugging Face GPT-2 folder (hf_files.read_hf_folder), tensors
    named without `transformer.`."""
    return read_hf_weights(hf_dir, _gpt2_name)


# ---- configuration ----------------------------------------------------------------------------

def flags_from_hf_config(config, where=CONFIG):
    """RapidGPT model flags (argument names) for a GPT-2 config.json dict; refuses what the
    built-in GPT cannot compute. `where` names the file in messages."""
    checks = ConfigChecks(config, where, "gpt2", "GPT-2")
    refuse = checks.refuse
    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATION_FLAGS:
        refuse("activation_function", activation, f"RapidGPT's GPT computes {', '.join(ACTIVATION_FLAGS)}")
    if not config.get("scale_attn_weights", True):
        refuse("scale_attn_weights", False, "RapidGPT always scales attention scores by 1/sqrt(head_dim)")
    if config.get("scale_attn_by_inverse_layer_idx", False):
        refuse("scale_attn_by_inverse_layer_idx", True, "RapidGPT does not scale scores per layer")
    if config.get("add_cross_attention", False):
        refuse("add_cross_attention", True, "RapidGPT's GPT is decoder-only, without cross-attention")
    # reorder_and_upcast_attn only changes rounding under fp16 (RapidGPT's softmax already runs in
    # fp32): the same function, accepted.
    sizes = checks.sizes(("n_layer", "n_embd", "n_head", "n_positions", "vocab_size"))
    checks.divisible(sizes, "n_embd", "n_head")
    hidden, heads = sizes["n_embd"], sizes["n_head"]
    ffn = config.get("n_inner") or 4 * hidden
    eps = config.get("layer_norm_epsilon", 1e-5)
    return {"num_layers": sizes["n_layer"], "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, "max_position_embeddings": sizes["n_positions"],
            "seq_length": sizes["n_positions"], "vocab_size": sizes["vocab_size"],
            "layernorm_epsilon": float(eps),
            "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", True),
            "hidden_dropout": float(config.get("resid_pdrop", 0.1)),
            "attention_dropout": float(config.get("attn_pdrop", 0.1)),
            "init_method_std": float(config.get("initializer_range", 0.02)), **ACTIVATION_FLAGS[activation]}


def hf_folder_model_flags(hf_dir):
    """The model flags a RapidGPT checkpoint records (architecture, sequence length, tokenizer) for
    the Hugging Face GPT-2 folder `hf_dir`: from its config.json, and its vocab.json + merges.txt
    as the GPT2BPETokenizer when both are there."""
    flags = flags_from_hf_config(*read_hf_config(hf_dir))
    model = {name: flags[name] for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                                            "max_position_embeddings", "seq_length", "vocab_size",
                                            "layernorm_epsilon", "untie_embeddings_and_output_weights",
                                            "bias_gelu_fusion", "squared_relu") if name in flags}
    tokenizer = tokenizer_files(hf_dir)
    if tokenizer:
        model.update(tokenizer_type="GPT2BPETokenizer", **tokenizer)
    return model


def flags_of_model(model):
    """The flags `flags_from_hf_config` would give for a built GPTModel."""
    c = model.config
    return {"num_layers": c.num_layers, "hidden_size": c.hidden_size,
            "num_attention_heads": c.num_attention_heads, "ffn_hidden_size": c.ffn_hidden_size,
            "max_position_embeddings": c.max_position_embeddings, "seq_length": c.seq_length,
            "vocab_size": model.vocab_size, "layernorm_epsilon": c.layernorm_epsilon,
            "untie_embeddings_and_output_weights": model.untied, "hidden_dropout": c.hidden_dropout,
            "attention_dropout": c.attention_dropout, "init_method_std": c.init_method_std,
            **ACTIVATION_FLAGS[HF_ACTIVATION[c.activation]]}


def hf_activation(flags):
    """HF's activation_function for RapidGPT model flags (the inverse of ACTIVATION_FLAGS)."""
    if flags.get("squared_relu", False):
        return "relu2"
    return "gelu_new" if flags.get("bias_gelu_fusion", True) else "gelu"


def hf_config_from_flags(flags, eod_id=None):
    """A GPT2LMHeadModel config.json dict for RapidGPT model flags (`eod_id`: <|endoftext|>)."""
    hidden = flags["hidden_size"]
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": flags["vocab_size"], "n_positions": flags["max_position_embeddings"],
            "n_embd": hidden, "n_layer": flags["num_layers"], "n_head": flags["num_attention_heads"],
            "n_inner": None if flags["ffn_hidden_size"] == 4 * hidden else flags["ffn_hidden_size"],
            "activation_function": hf_activation(flags), "layer_norm_epsilon": flags["layernorm_epsilon"],
            "resid_pdrop": flags["hidden_dropout"], "embd_pdrop": flags["hidden_dropout"],
            "attn_pdrop": flags["attention_dropout"], "initializer_range": flags["init_method_std"],
            "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False, "use_cache": True,
            "tie_word_embeddings": not flags["untie_embeddings_and_output_weights"],
            "bos_token_id": eod_id, "eos_token_id": eod_id, "torch_dtype": "float32"}


# ---- weights ----------------------------------------------------------------------------------

def _hf_shapes(flags):
    """Expected shape of every HF tensor (names without `transformer.`), in HF's layouts."""
    h, ffn, vocab = flags["hidden_size"], flags["ffn_hidden_size"], flags["vocab_size"]
    layer = {"ln_1.weight": (h,), "ln_1.bias": (h,), "attn.c_attn.weight": (h, 3 * h),
             "attn.c_attn.bias": (3 * h,), "attn.c_proj.weight": (h, h), "attn.c_proj.bias": (h,),
             "ln_2.weight": (h,), "ln_2.bias": (h,), "mlp.c_fc.weight": (h, ffn), "mlp.c_fc.bias": (ffn,),
             "mlp.c_proj.weight": (ffn, h), "mlp.c_proj.bias": (h,)}
    shapes = {"wte.weight": (vocab, h), "wpe.weight": (flags["max_position_embeddings"], h),
              "ln_f.weight": (h,), "ln_f.bias": (h,)}
    for i in range(flags["num_layers"]):
        shapes.update({f"h.{i}.{name}": shape for name, shape in layer.items()})
    if flags["untie_embeddings_and_output_weights"]:
        shapes["lm_head.weight"] = (vocab, h)
    return shapes


def _name_pairs(flags):
    """(HF name, RapidGPT name, layout change) for every tensor of the model."""
    pairs = [(hf, ours, None) for hf, ours in _TOP_TENSORS]
    for i in range(flags["num_layers"]):
        pairs += [(f"h.{i}.{hf}", f"layers.{i}.{ours}", change) for hf, ours, change in _LAYER_TENSORS]
    if flags["untie_embeddings_and_output_weights"]:
        pairs.append(("lm_head.weight", "output_layer.weight", None))
    return pairs


def _swap_row_groups(rows, first, second):
    """Rows grouped [first, second, hd] -> [second, first, hd] (other axes unchanged)."""
    return rows.reshape((first, second, -1) + rows.shape[1:]).swapaxes(0, 1).reshape(rows.shape)


def hf_to_rapidgpt(tensors, flags, where="the Hugging Face weights"):
    """RapidGPT parameters `{name: float32 array}` (true vocabulary rows, no padding) from HF
    tensors (names without `transformer.`); every tensor is checked against the config."""
    if not flags["untie_embeddings_and_output_weights"]:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}   # tied: same as wte
    check_tensor_shapes(tensors, _hf_shapes(flags), where, "n_layer, n_embd, n_inner, n_positions, vocab_size",
                        "a GPT-2 language model (GPT2LMHeadModel/GPT2Model)")
    heads, params = flags["num_attention_heads"], {}
    for hf, ours, change in _name_pairs(flags):
        value = tensors[hf]
        if change == "qkv":
            value = _swap_row_groups(value.T, 3, heads)      # out axis [3, heads, hd] -> [heads, 3, hd]
        elif change == "transpose":
            value = value.T                                  # [in, out] -> [out, in]
        params[ours] = np.ascontiguousarray(value, np.float32)
    return params


def rapidgpt_to_hf(params, flags):
    """HF tensors `{GPT2LMHeadModel name: float32 array}` from RapidGPT parameters (padded
    vocabulary rows dropped); a tied output layer is not written, as HF saves it."""
    heads, vocab, tensors = flags["num_attention_heads"], flags["vocab_size"], {}
    for hf, ours, change in _name_pairs(flags):
        value = params[ours]
        if change == "qkv":
            value = _swap_row_groups(value, heads, 3).T      # [heads, 3, hd] -> [3, heads, hd], [in, out]
        elif change == "transpose":
            value = value.T                                  # [out, in] -> [in, out]
        elif ours in ("word_embeddings.weight", "output_layer.weight"):
            value = value[:vocab]
        name = hf if hf == "lm_head.weight" else "transformer." + hf
        tensors[name] = np.ascontiguousarray(value, np.float32)
    return tensors


def tokenizer_files(folder):
    """`{flag: path}` of the GPT-2 tokenizer files in `folder` (empty unless both are there)."""
    paths = {flag: os.path.join(folder, name) for flag, name in TOKENIZER_FILES.items()}
    return paths if all(os.path.isfile(p) for p in paths.values()) else {}


def eod_id(vocab_file):
    """The id of <|endoftext|> in a GPT-2 vocab.json (None if absent)."""
    with open(vocab_file, encoding="utf-8") as f:
        return json.load(f).get(EOD_TOKEN)


def vocab_file_size(vocab_file):
    with open(vocab_file, encoding="utf-8") as f:
        return len(json.load(f))
