"""Hugging Face Llama-family folders (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
Qwen3ForCausalLM) <-> the built-in GPT with Megatron-core's Llama flags
(rapidgpt/config/transformer.py). Numpy only, no torch.

Weights (h hidden, a query heads in g key/value groups, d head_dim, f intermediate, V vocabulary):

    model.embed_tokens.weight [V, h]            word_embeddings.weight (vocabulary rows padded)
    model.layers.i.input_layernorm.weight       layers.i.input_layernorm.weight
    self_attn.q_proj [a d, h], k_proj [g d, h], self_attention.query_key_value.weight, rows
      v_proj [g d, h] (.weight and .bias)         [g, a/g + 2, d]: each group's query heads, its key
                                                  head, its value head (Megatron-core's order)
    self_attn.o_proj [h, a d] (.weight, .bias)  self_attention.dense
    self_attn.q_norm/k_norm.weight [d] (Qwen3)  self_attention.q_layernorm/k_layernorm.weight
    post_attention_layernorm.weight             post_attention_layernorm.weight
    mlp.gate_proj, mlp.up_proj [f, h]           mlp.dense_h_to_4h.weight [2, f, h] (gate, then up)
    mlp.down_proj [h, f]                        mlp.dense_4h_to_h.weight
    model.norm.weight                           final_layernorm.weight
    lm_head.weight [V, h] (when untied)         output_layer.weight

transformers' query head j uses key/value head j // (a/g) (`repeat_kv`), as Megatron-core's
grouping does, and both rotate channel i with channel i + d/2 (`rotate_half`), so q and k need no
permutation (transformers' own conversion of Meta's checkpoints already made that layout).

Configuration: rope_theta, partial_rotary_factor, Llama 3.1's rope_scaling ("llama3"), rms_norm_eps,
head_dim, num_key_value_heads, tie_word_embeddings, the families' biases (Qwen2: q/k/v; Llama and
Mistral: attention_bias and mlp_bias together, as --disable-bias-linear's opposite); what the
built-in decoder cannot compute (another activation, sliding-window attention, other RoPE
scalings) is refused by name.
"""
import numpy as np

from rapidgpt.models.hf_files import (CONFIG, ConfigChecks, HFConversionError, check_tensor_shapes, read_hf_config,
                                      read_hf_weights)
from rapidgpt.tokenizer.hf_tokenizer import folder_problem

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "qwen3": "Qwen3ForCausalLM"}
# The model flags a checkpoint of this family records (beside the tokenizer's).
MODEL_FLAGS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "max_position_embeddings",
               "seq_length", "vocab_size", "layernorm_epsilon", "untie_embeddings_and_output_weights",
               "position_embedding_type", "rotary_base", "rotary_percent", "use_rope_scaling", "rope_scaling_factor",
               "rope_scaling_low_freq_factor", "rope_scaling_high_freq_factor",
               "rope_scaling_original_max_position_embeddings", "normalization", "swiglu", "group_query_attention",
               "num_query_groups", "kv_channels", "add_bias_linear", "add_qkv_bias", "qk_layernorm")
# A fresh run's sequence length when the folder's context is longer (the flag can raise it).
DEFAULT_SEQ_LENGTH = 4096


def _strip_model(stored_name):
    """Stored names as they are (`model.`, `lm_head.`); None for buffers that are not weights."""
    return None if stored_name.endswith("rotary_emb.inv_freq") else stored_name


def read_hf_folder(hf_dir):
    """`(config, tensors, notes)` of a Llama-family folder (hf_files.read_hf_weights)."""
    return read_hf_weights(hf_dir, _strip_model)


# ---- configuration ----------------------------------------------------------------------------

def flags_from_hf_config(config, where=CONFIG):
    """RapidGPT model flags for a Llama-family config.json dict; refuses what the built-in decoder
    cannot compute. `where` names the file in messages."""
    kind = config.get("model_type")
    checks = ConfigChecks(config, where, tuple(ARCHITECTURES), "Llama-family (Llama, Mistral, Qwen2, Qwen3)")
    refuse = checks.refuse
    if config.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", config.get("hidden_act"), "the SwiGLU MLP uses SiLU")
    if config.get("sliding_window") is not None and (kind == "mistral" or config.get("use_sliding_window")):
        refuse("sliding_window", config.get("sliding_window"), "attention is over the whole sequence; a model "
               "trained with full attention (sliding_window null) converts")
    # transformers 4.x writes rope_theta and rope_scaling; 5.x one rope_parameters dict of both.
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or ({} if rope.get("rope_type", "default") == "default" else rope)
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if scaling and rope_type != "llama3":
        refuse("rope_scaling", scaling, "of RoPE scalings only Llama 3.1's 'llama3' is implemented")
    sizes = checks.sizes(("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                          "vocab_size", "max_position_embeddings"))
    heads = sizes["num_attention_heads"]
    groups = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or sizes["hidden_size"] // heads
    if heads % groups:
        refuse("num_key_value_heads", groups, f"it must divide num_attention_heads {heads}")
    attention_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
    if kind in ("llama", "mistral", "qwen3") and attention_bias != mlp_bias:
        refuse("attention_bias", attention_bias, "biases are on every linear layer or none (--disable-bias-linear), "
               f"and mlp_bias is {mlp_bias}")
    flags = {"num_layers": sizes["num_hidden_layers"], "hidden_size": sizes["hidden_size"],
             "num_attention_heads": heads, "ffn_hidden_size": sizes["intermediate_size"],
             "max_position_embeddings": sizes["max_position_embeddings"],
             "seq_length": min(sizes["max_position_embeddings"], DEFAULT_SEQ_LENGTH),
             "vocab_size": sizes["vocab_size"], "layernorm_epsilon": float(config.get("rms_norm_eps", 1e-6)),
             "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", False),
             "position_embedding_type": "rope",
             "rotary_base": int(config.get("rope_theta", rope.get("rope_theta", 10000))),
             "rotary_percent": float(config.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))),
             "use_rope_scaling": bool(scaling), "rope_scaling_factor": float(scaling.get("factor", 8.0)),
             "rope_scaling_low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
             "rope_scaling_high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
             "rope_scaling_original_max_position_embeddings": int(scaling.get("original_max_position_embeddings", 8192)),
             "normalization": "RMSNorm", "swiglu": True, "group_query_attention": groups != heads,
             "num_query_groups": groups, "kv_channels": head_dim,
             "add_bias_linear": attention_bias and kind != "qwen2", "add_qkv_bias": kind == "qwen2",
             "qk_layernorm": kind == "qwen3",
             "hidden_dropout": 0.0, "attention_dropout": float(config.get("attention_dropout", 0.0)),
             "init_method_std": float(config.get("initializer_range", 0.02))}
    return flags


def hf_folder_model_flags(hf_dir):
    """The model flags a RapidGPT checkpoint records for the Llama-family folder `hf_dir`: from its
    config.json, and its tokenizer (--tokenizer-type HuggingFaceTokenizer) when it holds a tokenizer.json."""
    flags = flags_from_hf_config(*read_hf_config(hf_dir))
    model = {name: flags[name] for name in MODEL_FLAGS}
    if folder_problem(hf_dir) is None:
        model.update(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=hf_dir)
    return model


def architecture_of(flags):
    """The transformers class a checkpoint of these flags is exported as: Qwen3 with q/k norms,
    Qwen2 with q/k/v biases only, else Llama (a Mistral folder without sliding window is a Llama)."""
    if flags["qk_layernorm"]:
        return "qwen3"
    return "qwen2" if flags["add_qkv_bias"] and not flags["add_bias_linear"] else "llama"


def hf_config_from_flags(flags, kind=None, bos_id=None, eos_id=None):
    """A config.json dict (`kind`: "llama", "mistral", "qwen2", "qwen3"; default architecture_of)
    for RapidGPT model flags; refuses flags no Llama-family class computes."""
    kind = kind or architecture_of(flags)
    problems = [f"{flag} {flags[flag]!r}" for flag, wanted in
                (("position_embedding_type", "rope"), ("normalization", "RMSNorm"), ("swiglu", True),
                 ("apply_layernorm_1p", False), ("rotary_interleaved", False)) if flags.get(flag, wanted) != wanted]
    if flags["qk_layernorm"] != (kind == "qwen3") or (kind == "qwen2" and not flags["add_qkv_bias"]):
        problems.append(f"--qk-layernorm {flags['qk_layernorm']} / --add-qkv-bias {flags['add_qkv_bias']}")
    if problems:
        raise HFConversionError(f"the checkpoint's model ({', '.join(problems)}) is not a {ARCHITECTURES[kind]}")
    config = {"architectures": [ARCHITECTURES[kind]], "model_type": kind,
              "vocab_size": flags["vocab_size"], "hidden_size": flags["hidden_size"],
              "intermediate_size": flags["ffn_hidden_size"], "num_hidden_layers": flags["num_layers"],
              "num_attention_heads": flags["num_attention_heads"],
              "num_key_value_heads": flags["num_query_groups"], "head_dim": flags["kv_channels"],
              "max_position_embeddings": flags["max_position_embeddings"], "hidden_act": "silu",
              "rms_norm_eps": flags["layernorm_epsilon"], "rope_theta": float(flags["rotary_base"]),
              "tie_word_embeddings": not flags["untie_embeddings_and_output_weights"],
              "attention_dropout": flags.get("attention_dropout", 0.0),
              "initializer_range": flags.get("init_method_std", 0.02), "use_cache": True,
              "bos_token_id": bos_id, "eos_token_id": eos_id, "torch_dtype": "float32"}
    if flags["rotary_percent"] != 1.0:
        config["partial_rotary_factor"] = flags["rotary_percent"]
    if flags["use_rope_scaling"]:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": flags["rope_scaling_factor"],
                                  "low_freq_factor": flags["rope_scaling_low_freq_factor"],
                                  "high_freq_factor": flags["rope_scaling_high_freq_factor"],
                                  "original_max_position_embeddings":
                                      flags["rope_scaling_original_max_position_embeddings"]}
    if kind in ("llama", "mistral"):
        config["attention_bias"] = config["mlp_bias"] = flags["add_bias_linear"]
    if kind == "qwen3":
        config["attention_bias"] = False
    if kind in ("mistral", "qwen2", "qwen3"):
        config["sliding_window"] = None
        config["use_sliding_window"] = False
    return config


# ---- weights ----------------------------------------------------------------------------------

def _shapes(flags):
    """{HF name: shape} of every tensor the flags' model has."""
    h, f, v = flags["hidden_size"], flags["ffn_hidden_size"], flags["vocab_size"]
    a, g, d = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
    qkv_bias = flags["add_bias_linear"] or flags["add_qkv_bias"]
    layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
             "self_attn.q_proj.weight": (a * d, h), "self_attn.k_proj.weight": (g * d, h),
             "self_attn.v_proj.weight": (g * d, h), "self_attn.o_proj.weight": (h, a * d),
             "mlp.gate_proj.weight": (f, h), "mlp.up_proj.weight": (f, h), "mlp.down_proj.weight": (h, f)}
    if qkv_bias:
        layer.update({"self_attn.q_proj.bias": (a * d,), "self_attn.k_proj.bias": (g * d,),
                      "self_attn.v_proj.bias": (g * d,)})
    if flags["add_bias_linear"]:
        layer.update({"self_attn.o_proj.bias": (h,), "mlp.gate_proj.bias": (f,), "mlp.up_proj.bias": (f,),
                      "mlp.down_proj.bias": (h,)})
    if flags["qk_layernorm"]:
        layer.update({"self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,)})
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(flags["num_layers"]):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in layer.items()})
    if flags["untie_embeddings_and_output_weights"]:
        shapes["lm_head.weight"] = (v, h)
    return shapes


# (HF name within a layer, RapidGPT name within a layer) of the tensors copied as they are.
_LAYER_COPIES = (("input_layernorm.weight", "input_layernorm.weight"),
                 ("post_attention_layernorm.weight", "post_attention_layernorm.weight"),
                 ("self_attn.o_proj.weight", "self_attention.dense.weight"),
                 ("self_attn.o_proj.bias", "self_attention.dense.bias"),
                 ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
                 ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
                 ("mlp.down_proj.weight", "mlp.dense_4h_to_h.weight"),
                 ("mlp.down_proj.bias", "mlp.dense_4h_to_h.bias"))


def hf_to_rapidgpt(tensors, flags, where="the Hugging Face weights"):
    """RapidGPT parameters `{name: float32 array}` (true vocabulary rows) from the HF tensors;
    every tensor is checked against the config."""
    if not flags["untie_embeddings_and_output_weights"]:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}      # tied: the embeddings
    check_tensor_shapes(tensors, _shapes(flags), where, "num_hidden_layers, hidden_size, head_dim, "
                        "num_key_value_heads, intermediate_size, vocab_size", "the model config.json describes")
    g, d = flags["num_query_groups"], flags["kv_channels"]
    params = {"word_embeddings.weight": tensors["model.embed_tokens.weight"],
              "final_layernorm.weight": tensors["model.norm.weight"]}
    if flags["untie_embeddings_and_output_weights"]:
        params["output_layer.weight"] = tensors["lm_head.weight"]
    for i in range(flags["num_layers"]):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            parts = [tensors.get(f"{hf}self_attn.{p}_proj.{kind}") for p in "qkv"]
            if parts[0] is not None:
                q, k, v = (x.reshape((g, -1, d) + x.shape[1:]) for x in parts)     # [g, heads, d, ...]
                params[f"{ours}self_attention.query_key_value.{kind}"] = \
                    np.concatenate([q, k, v], axis=1).reshape((-1,) + parts[0].shape[1:])
        gate, up = tensors[f"{hf}mlp.gate_proj.weight"], tensors[f"{hf}mlp.up_proj.weight"]
        params[f"{ours}mlp.dense_h_to_4h.weight"] = np.stack([gate, up])
        if f"{hf}mlp.gate_proj.bias" in tensors:
            params[f"{ours}mlp.dense_h_to_4h.bias"] = np.stack([tensors[f"{hf}mlp.gate_proj.bias"],
                                                                tensors[f"{hf}mlp.up_proj.bias"]])
        for hf_name, our_name in _LAYER_COPIES:
            if hf + hf_name in tensors:
                params[ours + our_name] = tensors[hf + hf_name]
    return {name: np.ascontiguousarray(value, np.float32) for name, value in params.items()}


def rapidgpt_to_hf(params, flags):
    """HF tensors `{name: float32 array}` from RapidGPT parameters (padded vocabulary rows dropped);
    a tied output layer is not written, as transformers saves it."""
    a, g, d, vocab = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"], flags["vocab_size"]
    r = a // g
    tensors = {"model.embed_tokens.weight": params["word_embeddings.weight"][:vocab],
               "model.norm.weight": params["final_layernorm.weight"]}
    if flags["untie_embeddings_and_output_weights"]:
        tensors["lm_head.weight"] = params["output_layer.weight"][:vocab]
    for i in range(flags["num_layers"]):
        hf, ours = f"model.layers.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            fused = params.get(f"{ours}self_attention.query_key_value.{kind}")
            if fused is not None:
                grouped = fused.reshape((g, r + 2, d) + fused.shape[1:])
                for name, part in (("q", grouped[:, :r]), ("k", grouped[:, r]), ("v", grouped[:, r + 1])):
                    tensors[f"{hf}self_attn.{name}_proj.{kind}"] = part.reshape((-1,) + fused.shape[1:])
        for kind in ("weight", "bias"):
            stacked = params.get(f"{ours}mlp.dense_h_to_4h.{kind}")
            if stacked is not None:
                tensors[f"{hf}mlp.gate_proj.{kind}"], tensors[f"{hf}mlp.up_proj.{kind}"] = stacked[0], stacked[1]
        for hf_name, our_name in _LAYER_COPIES:
            if ours + our_name in params:
                tensors[hf + hf_name] = params[ours + our_name]
    return {name: np.ascontiguousarray(value, np.float32) for name, value in tensors.items()}
