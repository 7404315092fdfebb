#!/usr/bin/env python
"""Convert a Megatron-LM GPT or Llama-family checkpoint into a RapidGPT checkpoint.

    python data_tools/convert_megatron.py --load megatron_ckpts/llama --save checkpoints/llama

`--load` is the folder Megatron's `--save` wrote (its latest_checkpointed_iteration.txt picks the
iteration) or one `iter_XXXXXXX` folder in it, in either of Megatron's formats (see
data_tools/megatron_checkpoint.py): legacy `torch` (mp_rank_TT[_PPP]/model_optim_rng.pt, any
tensor- and pipeline-parallel layout) or `torch_dist`. The parameter names are Megatron-core's, of
the local or the Transformer Engine layer spec (`linear_qkv.layer_norm_weight` is the input norm).

The architecture comes from the args the checkpoint saved: the model flags, Megatron's padded
vocabulary (every row of it, since Megatron's softmax runs over all of them), the GELU Megatron
computed (its fused bias-GELU is the tanh form; unfused, or without biases, the exact one), and the
tokenizer when its files exist here. The output (`iter_0000000`, weights only) trains on with
`--load` or finetunes with `--pretrained-checkpoint` at any layout, and needs no model flags.

Needs torch (the CPU build is enough; `pip install 'rapidgpt[megatron]'`), and not Megatron.
Multi-latent attention converts too (its names of either layer spec; the local spec's
column-parallel down projections joined, Transformer Engine's duplicated ones taken once).
Refused with a reason: what RapidGPT's GPT does not compute (MoE,
multi-token prediction, activations other than GELU, squared ReLU and SwiGLU, sliding windows, RoPE variants
other than Llama 3.1's scaling, ...: `_REFUSED_ARGS`), and Megatron-core's BERT (pre-LayerNorm, where
RapidGPT's BERT is the original post-LayerNorm one). Checkpoints saved with virtual pipeline stages
(`--num-layers-per-virtual-pipeline-stage`) convert as any other: their chunks' layers are numbered
in the model's order (chunk 0 of every stage, then chunk 1, ...).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import megatron_checkpoint  # noqa: E402
from megatron_checkpoint import MegatronCheckpointError  # noqa: E402

PROG = "convert_megatron.py"

# Megatron arg -> RapidGPT flag, copied as they are.
_COPIED_ARGS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels",
                "group_query_attention", "num_query_groups", "max_position_embeddings", "seq_length",
                "position_embedding_type", "rotary_base", "rotary_percent", "rotary_interleaved", "use_rope_scaling",
                "rope_scaling_factor", "normalization", "apply_layernorm_1p", "swiglu", "add_bias_linear",
                "add_qkv_bias", "qk_layernorm", "untie_embeddings_and_output_weights", "init_method_std",
                "hidden_dropout", "attention_dropout", "bias_gelu_fusion", "squared_relu", "use_mup",
                "mup_base_hidden_size", "mup_embedding_mult", "mup_output_mult", "mup_base_head_dim",
                "mup_attn_scale_power")
# Multi-latent attention's args, copied for a model that has it (Megatron saves them for every model).
_MLA_ARGS = ("multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
             "v_head_dim", "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim")
# Megatron args that, when set (not None, False or 0), make a model RapidGPT's GPT is not.
_REFUSED_ARGS = (("num_experts", "mixture-of-experts layers are not built"),
                 ("mtp_num_layers", "multi-token prediction is not built"),
                 ("openai_gelu", "the OpenAI GELU option is not built"),
                 ("quick_geglu", "quick-GEGLU is not built (GELU, or SwiGLU)"),
                 ("glu_linear_offset", "an offset in the GLU is not built"),
                 ("activation_func_clamp_value", "clamping the activation is not built"),
                 ("apply_residual_connection_post_layernorm", "the residual taken after the norm is not built"),
                 ("qk_l2_norm", "L2-normalised queries and keys are not built (--qk-layernorm is)"),
                 ("attention_output_gate", "a gated attention output is not built"),
                 ("experimental_attention_variant", "experimental attention variants are not built"),
                 ("window_size", "sliding-window attention is not built"),
                 ("mrope_section", "multimodal RoPE is not built"),
                 ("rotary_seq_len_interpolation_factor", "RoPE position interpolation is not built"),
                 ("no_rope_freq", "layers without RoPE are not built"),
                 ("heterogeneous_layers_config_path", "per-layer shapes are not built"))
BERT_REFUSED = ("a Megatron-core BERT checkpoint: its BertModel is pre-LayerNorm, and RapidGPT's BERT is the original "
                "post-LayerNorm one (Hugging Face's), so it does not convert; GPT and Llama-family checkpoints do")

# Megatron-core's names within a layer -> RapidGPT's (LayerNorm's weight/bias are gamma/beta here).
_LAYER_NAMES = {"input_layernorm": "input_layernorm",
                "self_attention.linear_qkv.layer_norm": "input_layernorm",      # Transformer Engine's fused norm
                "self_attention.linear_qkv": "self_attention.query_key_value",
                "self_attention.linear_proj": "self_attention.dense",
                "self_attention.q_layernorm": "self_attention.q_layernorm",
                "self_attention.k_layernorm": "self_attention.k_layernorm",
                **{f"self_attention.{name}": f"self_attention.{name}"          # multi-latent attention's
                   for name in ("linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj",
                                "linear_kv_up_proj", "kv_layernorm")},
                "self_attention.linear_q_up_proj.layer_norm": "self_attention.q_layernorm",   # Transformer Engine's
                "self_attention.linear_kv_up_proj.layer_norm": "self_attention.kv_layernorm",
                "pre_mlp_layernorm": "post_attention_layernorm",
                "mlp.linear_fc1.layer_norm": "post_attention_layernorm",
                "mlp.linear_fc1": "mlp.dense_h_to_4h",
                "mlp.linear_fc2": "mlp.dense_4h_to_h"}
_TOP_NAMES = {"embedding.word_embeddings": "word_embeddings", "embedding.position_embeddings": "position_embeddings",
              "decoder.final_layernorm": "final_layernorm", "output_layer": "output_layer"}
_NORMS = ("input_layernorm", "post_attention_layernorm", "final_layernorm", "q_layernorm", "k_layernorm",
          "kv_layernorm")
# Tensor-parallel slicing of Megatron-core's linear layers: column-parallel (rows split), row-parallel
# (columns split); every other tensor is whole on each rank.
_COLUMN_PARALLEL = ("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias",
                    "linear_fc1.weight", "linear_fc1.bias", "linear_q_proj.weight", "linear_q_up_proj.weight",
                    "linear_kv_up_proj.weight")
# Multi-latent attention's down projections: column-parallel in the local layer spec, whole on every
# rank in Transformer Engine's (its "duplicated" linear layers): {name: its whole rows from the args}.
_DOWN_PROJECTIONS = {"linear_q_down_proj.weight": lambda args: args.q_lora_rank,
                     "linear_kv_down_proj.weight": lambda args: args.kv_lora_rank + args.qk_pos_emb_head_dim}
_ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")


def read_checkpoint(load):
    """-> (Megatron's args, {Megatron-core name with global layer numbers: full numpy array})."""
    folder = megatron_checkpoint.checkpoint_folder(load)
    if os.path.isfile(os.path.join(folder, megatron_checkpoint.DIST_MARKER)):
        args, tensors = megatron_checkpoint.read_torch_dist(folder)
        tensors = _unstack_layers(tensors)
    else:
        args, pieces = megatron_checkpoint.read_legacy(folder)
        tensors = _merge_legacy(pieces, args)
    if any(name.startswith(("encoder.", "lm_head.", "binary_head.")) for name in tensors):
        raise MegatronCheckpointError(f"{folder}: {BERT_REFUSED}")
    if args is None:
        raise MegatronCheckpointError(f"{folder}: the checkpoint holds no saved args (Megatron saves them "
                                      f"unless told not to); the architecture cannot be read")
    if not getattr(args, "untie_embeddings_and_output_weights", False):
        tensors.pop("output_layer.weight", None)        # the last stage's copy of the tied embeddings
    return args, {_te_to_local(name): value for name, value in tensors.items()}


def _te_to_local(name):
    """Transformer Engine's fused-norm names (`linear_qkv.layer_norm_weight`) as the local spec's."""
    for fused in ("self_attention.linear_qkv.layer_norm_", "mlp.linear_fc1.layer_norm_",
                  "self_attention.linear_q_up_proj.layer_norm_", "self_attention.linear_kv_up_proj.layer_norm_"):
        if fused in name:
            return name.replace(fused, fused[:-1] + ".")
    return name


def _unstack_layers(tensors):
    """torch_dist stacks each layer tensor on a leading [num_layers] axis: one tensor per layer."""
    out = {}
    for name, value in tensors.items():
        if name.startswith("decoder.layers."):
            rest = name[len("decoder.layers."):]
            out.update({f"decoder.layers.{i}.{rest}": value[i] for i in range(value.shape[0])})
        else:
            out[name] = value
    return out


def _merge_legacy(pieces, args):
    """Join the tensor-parallel slices of each chunk (a pipeline stage, or one of its virtual
    stages) and number the chunks' layers globally, in the model's order: virtual stage 0 of every
    pipeline stage, then virtual stage 1, ... (Megatron's layer offset of chunk v on stage p is
    v L/V + p L/(P V) for even chunks)."""
    tp, pp, vp = (1 + max(key[axis] for key in pieces) for axis in range(3))
    missing = [(t, p, v) for t in range(tp) for p in range(pp) for v in range(vp) if (t, p, v) not in pieces]
    if missing:
        raise MegatronCheckpointError(f"the checkpoint lacks (tensor, pipeline, virtual stage) {missing}: a rank's "
                                      f"file is missing, or holds fewer virtual stages than another")
    out, first_layer = {}, 0
    for chunk in [(stage, v) for v in range(vp) for stage in range(pp)]:
        shards = [pieces[(t, *chunk)] for t in range(tp)]
        layers = 1 + max([int(name.split(".")[2]) for name in shards[0] if name.startswith("decoder.layers.")],
                         default=-1)
        for name in shards[0]:
            value = _join(name, [shard[name] for shard in shards], args)
            if name.startswith("decoder.layers."):
                _, _, local, rest = name.split(".", 3)
                name = f"decoder.layers.{first_layer + int(local)}.{rest}"
            out.setdefault(name, value)                 # the tied embedding copy: the first stage's
        first_layer += layers
    return out


def _join(name, slices, args):
    down = next((rows for suffix, rows in _DOWN_PROJECTIONS.items() if name.endswith(suffix)), None)
    if down is not None and args is not None and slices[0].shape[0] == down(args):
        return slices[0]                                # Transformer Engine's duplicated down projection
    if len(slices) == 1 or not name.endswith(_COLUMN_PARALLEL + _ROW_PARALLEL + tuple(_DOWN_PROJECTIONS)):
        return slices[0]
    if name.endswith(_ROW_PARALLEL):
        return np.concatenate(slices, axis=1)
    if getattr(args, "swiglu", False) and ".linear_fc1." in name:               # each rank holds [its gate rows; its up rows]
        halves = [np.split(piece, 2, axis=0) for piece in slices]
        return np.concatenate([h[0] for h in halves] + [h[1] for h in halves], axis=0)
    return np.concatenate(slices, axis=0)               # qkv: whole query groups per rank, in order


def model_flags(args, where):
    """RapidGPT's model flags for Megatron's saved `args` (an argparse.Namespace)."""
    for name, reason in _REFUSED_ARGS:
        value = getattr(args, name, None)
        if value not in (None, False, 0):
            raise MegatronCheckpointError(f"{where}: the checkpoint's model has {name}={value!r}: {reason}")
    copied = _COPIED_ARGS + (_MLA_ARGS if getattr(args, "multi_latent_attention", False) else ())
    flags = {name: getattr(args, name) for name in copied if hasattr(args, name)}
    if not flags.get("group_query_attention"):
        flags.pop("num_query_groups", None)              # Megatron keeps 1 there without GQA
    flags["layernorm_epsilon"] = float(getattr(args, "norm_epsilon", getattr(args, "layernorm_epsilon", 1e-5)))
    flags["vocab_size"] = int(args.padded_vocab_size)
    flags["make_vocab_size_divisible_by"] = 1          # the rows are Megatron's padded vocabulary already
    if flags.get("position_embedding_type") not in ("learned_absolute", "rope", "none"):
        raise MegatronCheckpointError(f"{where}: position_embedding_type {flags.get('position_embedding_type')!r} is "
                                      f"not built (learned_absolute, rope or none)")
    return flags


def to_rapidgpt(tensors, flags):
    """{RapidGPT parameter name: array} from Megatron-core's tensors (global layer numbers)."""
    params = {}
    for name, value in tensors.items():
        stem, kind = name.rsplit(".", 1)
        if stem.startswith("decoder.layers."):
            _, _, layer, rest = stem.split(".", 3)
            if rest not in _LAYER_NAMES:
                raise MegatronCheckpointError(f"the checkpoint's {name} has no counterpart in RapidGPT's model")
            ours = f"layers.{layer}.{_LAYER_NAMES[rest]}"
        elif stem in _TOP_NAMES:
            ours = _TOP_NAMES[stem]
        else:
            raise MegatronCheckpointError(f"the checkpoint's {name} has no counterpart in RapidGPT's model")
        if ours.endswith(_NORMS) and flags.get("normalization", "LayerNorm") == "LayerNorm":
            kind = {"weight": "gamma", "bias": "beta"}[kind]
        if flags.get("swiglu") and ours.endswith("dense_h_to_4h"):
            value = value.reshape((2, -1) + value.shape[1:])      # [gate; up] -> [2, ffn, ...]
        params[f"{ours}.{kind}"] = np.ascontiguousarray(value, np.float32)
    return params


def _tokenizer_flags(args, notes):
    """The tokenizer the checkpoint was trained with, when its files are on this machine."""
    kind = getattr(args, "tokenizer_type", None)
    files = {name: getattr(args, name, None) for name in ("vocab_file", "merge_file", "tokenizer_model")}
    given = {name: path for name, path in files.items() if path}
    if kind is None or (kind != "NullTokenizer" and not given):
        notes.append("note: the checkpoint names no tokenizer; give --tokenizer-type and its files when you run")
        return {}
    absent = [path for path in given.values() if not os.path.exists(path)]
    if absent:
        notes.append(f"note: the tokenizer's {', '.join(absent)} is not on this machine; the checkpoint records no "
                     f"tokenizer (give --tokenizer-type {kind} and its files when you run)")
        return {}
    return dict(tokenizer_type=kind, **given)


def megatron_to_checkpoint(load, save, ckpt_format="ckpt"):
    """Convert the Megatron-LM checkpoint under `load` into a RapidGPT checkpoint under `save`;
    -> (its path, the model flags, notes for the user)."""
    from rapidgpt.hf_conversion import check_conversion_targets
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.models.hf_files import check_tensor_shapes, load_into_model
    from rapidgpt.pretrained import model_args
    from rapidgpt.training.checkpointing import save_checkpoint
    check_conversion_targets(save=save)
    megatron_args, tensors = read_checkpoint(load)
    notes = []
    flags = model_flags(megatron_args, load)
    params = to_rapidgpt(tensors, flags)
    args = model_args(dict(flags, **_tokenizer_flags(megatron_args, notes)))
    args.save, args.ckpt_format, args.no_save_optim, args.no_save_rng = save, ckpt_format, True, True
    model = build_gpt_model(args, flags["vocab_size"])
    check_tensor_shapes(params, {name: tuple(param.shape) for name, param in model.parameters_and_names()}, load,
                        "num_layers, hidden_size, num_query_groups, ffn_hidden_size", "the saved args' model",
                        source="the checkpoint's saved args")
    load_into_model(model, params)
    return save_checkpoint(args, 0, 0, model, None, None), flags, notes


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, help="Megatron-LM checkpoint folder (its --save, or an iter_XXXXXXX)")
    parser.add_argument("--save", required=True, help="RapidGPT checkpoint folder to write")
    parser.add_argument("--ckpt-format", choices=["ckpt", "safetensors"], default="ckpt",
                        help="MindSpore weight file format of the output")
    args = parser.parse_args(argv)
    from rapidgpt.hf_conversion import run_converter
    result = run_converter(PROG, lambda: megatron_to_checkpoint(args.load, args.save, args.ckpt_format))
    if result is None:
        return 1
    path, flags = result
    print(f"wrote {path}: {flags['num_layers']} layers, hidden {flags['hidden_size']}, "
          f"{flags['num_attention_heads']} heads, vocabulary {flags['vocab_size']} (Megatron's padded rows), "
          f"{flags['position_embedding_type']} positions, {flags.get('normalization', 'LayerNorm')}, "
          f"{'SwiGLU' if flags.get('swiglu') else 'GELU'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
