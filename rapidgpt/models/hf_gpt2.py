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

safetensors files are read and written here with numpy + json (the format is an 8-byte header
length, a JSON header, raw little-endian bytes), which also reads bf16 weights, a type numpy lacks.
"""
import json
import os

import numpy as np

from rapidgpt.errors import UserError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
TOKENIZER_FILES = {"vocab_file": "vocab.json", "merge_file": "merges.txt"}
EOD_TOKEN = "<|endoftext|>"
# HF's names for the tanh approximation of GELU; `gelu` (exact erf) is a different function.
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                 "I8": "i1", "U8": "u1", "BOOL": "?"}
_SAFETENSORS_DTYPES = {np.dtype(v): k for k, v in _NUMPY_DTYPES.items()}

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


class HFConversionError(UserError, ValueError):
    """A Hugging Face folder or RapidGPT model that cannot be converted; the message says why."""


# ---- safetensors ------------------------------------------------------------------------------

def read_safetensors(path):
    """`({name: array}, {name: stored dtype})` from a safetensors file. Arrays keep their stored
    dtype and are read-only views of the memory-mapped file (a multi-GB model is not copied
    twice), except BF16, which numpy lacks: it is widened to float32 exactly."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            if not 0 < header_len <= size - 8:
                raise ValueError("bad header length")
            header = json.loads(f.read(header_len))
        data = np.memmap(path, np.uint8, mode="r", offset=8 + header_len) if size > 8 + header_len \
            else np.zeros(0, np.uint8)
        tensors, dtypes = {}, {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            kind, shape, (start, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
            itemsize = 2 if kind == "BF16" else np.dtype(_NUMPY_DTYPES[kind]).itemsize
            if end - start != int(np.prod(shape, dtype=np.int64)) * itemsize or not 0 <= start <= end <= len(data):
                raise ValueError(f"tensor {name} has offsets {start}..{end} that do not fit its shape "
                                 f"{list(shape)} or the file")
            raw = data[start:end]
            if kind == "BF16":      # bf16 = the high 16 bits of a float32
                array = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                array = raw.view(_NUMPY_DTYPES[kind])
            tensors[name], dtypes[name] = array.reshape(shape), kind
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise HFConversionError(f"{path}: not a readable safetensors file ({e}); re-save the model "
                                f"with save_pretrained(..., safe_serialization=True)") from None
    return tensors, dtypes


def write_safetensors(path, tensors, metadata=None):
    """Write `{name: numpy array}` as a safetensors file (to a temporary name, then renamed)."""
    header, offset = {}, 0
    arrays = {name: np.ascontiguousarray(value) for name, value in tensors.items()}
    for name, array in arrays.items():
        kind = _SAFETENSORS_DTYPES.get(array.dtype.newbyteorder("<"))
        if kind is None:
            raise ValueError(f"tensor {name}: dtype {array.dtype} has no safetensors equivalent here")
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    if metadata:
        header["__metadata__"] = metadata
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)          # the data starts 8-byte aligned
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for array in arrays.values():
            f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- reading a Hugging Face folder -------------------------------------------------------------

def read_hf_folder(hf_dir):
    """`(config, tensors, notes)` of a Hugging Face GPT-2 folder: config.json as a dict, every
    weight as float32 under its name without the `transformer.` prefix, and remarks for the user
    (e.g. fp16 weights widened to fp32)."""
    if not os.path.isdir(hf_dir):
        raise HFConversionError(f"--hf-dir {hf_dir}: no such directory")
    config_path = os.path.join(hf_dir, CONFIG)
    try:
        with open(config_path) as f:
            config = json.load(f)
    except FileNotFoundError:
        raise HFConversionError(f"--hf-dir {hf_dir}: no {CONFIG}; give the folder written by "
                                f"save_pretrained (config.json + model.safetensors)") from None
    except (OSError, ValueError) as e:
        raise HFConversionError(f"{config_path}: unreadable ({e})") from None
    if not isinstance(config, dict):
        raise HFConversionError(f"{config_path}: not a JSON object")
    files = _weight_files(hf_dir)
    tensors, notes, widened = {}, [], set()
    for path in files:
        loaded, dtypes = read_safetensors(path)
        for stored_name, array in loaded.items():
            name = stored_name[len("transformer."):] if stored_name.startswith("transformer.") else stored_name
            if name.startswith("h.") and name.endswith(_IGNORED_SUFFIXES):
                continue
            if not np.issubdtype(array.dtype, np.floating):
                raise HFConversionError(f"{path}: tensor {stored_name} is {dtypes[stored_name]}, "
                                        f"not a floating-point weight")
            if dtypes[stored_name] != "F32":
                widened.add(dtypes[stored_name].lower())
            tensors[name] = array.astype(np.float32, copy=False)
    if widened:
        notes.append(f"note: {'/'.join(sorted(widened))} weights converted to fp32 "
                     f"(RapidGPT keeps fp32 master weights; --fp16/--bf16 choose the compute precision)")
    return config, tensors, notes


def _weight_files(hf_dir):
    single, index = os.path.join(hf_dir, SAFETENSORS), os.path.join(hf_dir, SAFETENSORS_INDEX)
    if os.path.isfile(single):
        return [single]
    if os.path.isfile(index):
        try:
            with open(index) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise HFConversionError(f"{index}: unreadable ({e})") from None
        missing = [s for s in shards if not os.path.isfile(os.path.join(hf_dir, s))]
        if missing:
            raise HFConversionError(f"{index} lists {missing[0]}, which is not in {hf_dir}")
        return [os.path.join(hf_dir, s) for s in shards]
    if any(os.path.isfile(os.path.join(hf_dir, n)) for n in ("pytorch_model.bin", "tf_model.h5")):
        raise HFConversionError(f"--hf-dir {hf_dir}: only PyTorch/TF weight files, no {SAFETENSORS}; "
                                f"re-save it with model.save_pretrained(DIR, safe_serialization=True)")
    raise HFConversionError(f"--hf-dir {hf_dir}: no {SAFETENSORS}; give the folder written by "
                            f"save_pretrained (config.json + model.safetensors)")


# ---- configuration ----------------------------------------------------------------------------

def flags_from_hf_config(config, where=CONFIG):
    """RapidGPT model flags (argument names) for a GPT-2 config.json dict; refuses what the
    built-in GPT cannot compute. `where` names the file in messages."""
    def need(key):
        if key not in config:
            raise HFConversionError(f"{where}: no {key!r}; this is not a GPT-2 config.json")
        return config[key]

    def refuse(key, value, why):
        raise HFConversionError(f"{where}: {key}={value!r} is not supported ({why}); only standard "
                                f"GPT-2 models convert")

    if config.get("model_type") != "gpt2":
        raise HFConversionError(f"{where}: model_type {config.get('model_type')!r} is not 'gpt2'; "
                                f"only GPT-2 checkpoints convert")
    activation = config.get("activation_function", "gelu_new")
    if activation not in TANH_GELU:
        refuse("activation_function", activation, "RapidGPT's GPT uses the tanh GELU, gelu_new")
    if not config.get("scale_attn_weights", True):
        refuse("scale_attn_weights", False, "RapidGPT always scales attention scores by 1/sqrt(head_dim)")
    if config.get("scale_attn_by_inverse_layer_idx", False):
        refuse("scale_attn_by_inverse_layer_idx", True, "RapidGPT does not scale scores per layer")
    if config.get("add_cross_attention", False):
        refuse("add_cross_attention", True, "RapidGPT's GPT is decoder-only, without cross-attention")
    # reorder_and_upcast_attn only changes rounding under fp16 (RapidGPT's softmax already runs in
    # fp32): the same function, accepted.
    hidden, heads = need("n_embd"), need("n_head")
    sizes = {"n_layer": need("n_layer"), "n_embd": hidden, "n_head": heads,
             "n_positions": need("n_positions"), "vocab_size": need("vocab_size")}
    for key, value in sizes.items():
        if not isinstance(value, int) or value <= 0:
            raise HFConversionError(f"{where}: {key}={value!r} must be a positive integer")
    if hidden % heads:
        raise HFConversionError(f"{where}: n_embd {hidden} is not divisible by n_head {heads}")
    ffn = config.get("n_inner") or 4 * hidden
    eps = config.get("layer_norm_epsilon", 1e-5)
    return {"num_layers": sizes["n_layer"], "hidden_size": hidden, "num_attention_heads": heads,
            "ffn_hidden_size": ffn, "max_position_embeddings": sizes["n_positions"],
            "seq_length": sizes["n_positions"], "vocab_size": sizes["vocab_size"],
            "layernorm_epsilon": float(eps),
            "untie_embeddings_and_output_weights": not config.get("tie_word_embeddings", True),
            "hidden_dropout": float(config.get("resid_pdrop", 0.1)),
            "attention_dropout": float(config.get("attn_pdrop", 0.1)),
            "init_method_std": float(config.get("initializer_range", 0.02))}


def hf_folder_model_flags(hf_dir):
    """The model flags a RapidGPT checkpoint records (architecture, sequence length, tokenizer) for
    the Hugging Face GPT-2 folder `hf_dir`: from its config.json, and its vocab.json + merges.txt
    as the GPT2BPETokenizer when both are there."""
    where = os.path.join(hf_dir, CONFIG)
    try:
        with open(where) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise HFConversionError(f"{where}: unreadable ({e})") from None
    flags = flags_from_hf_config(config, where)
    model = {name: flags[name] for name in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                                            "max_position_embeddings", "seq_length", "vocab_size",
                                            "layernorm_epsilon", "untie_embeddings_and_output_weights")}
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
            "attention_dropout": c.attention_dropout, "init_method_std": c.init_method_std}


def hf_config_from_flags(flags, eod_id=None):
    """A GPT2LMHeadModel config.json dict for RapidGPT model flags (`eod_id`: <|endoftext|>)."""
    hidden = flags["hidden_size"]
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
            "vocab_size": flags["vocab_size"], "n_positions": flags["max_position_embeddings"],
            "n_embd": hidden, "n_layer": flags["num_layers"], "n_head": flags["num_attention_heads"],
            "n_inner": None if flags["ffn_hidden_size"] == 4 * hidden else flags["ffn_hidden_size"],
            "activation_function": "gelu_new", "layer_norm_epsilon": flags["layernorm_epsilon"],
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
    expected = _hf_shapes(flags)
    if not flags["untie_embeddings_and_output_weights"]:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}   # tied: same as wte
    for name, shape in expected.items():
        if name not in tensors:
            raise HFConversionError(f"{where}: tensor {name} missing (config.json describes "
                                    f"{flags['num_layers']} layers, n_embd {flags['hidden_size']})")
        if tuple(tensors[name].shape) != shape:
            raise HFConversionError(f"{where}: tensor {name} has shape {list(tensors[name].shape)}, "
                                    f"config.json implies {list(shape)} (check n_embd, n_inner, "
                                    f"n_positions, vocab_size)")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise HFConversionError(f"{where}: {len(unexpected)} tensors a GPT-2 language model does not "
                                f"have (first: {unexpected[0]}); only GPT2LMHeadModel/GPT2Model convert")
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


def load_into_model(model, params):
    """Copy full-size parameters `{name: array}` into a one-process GPTModel (zero-padding the
    vocabulary rows). Call before the model's first compiled use."""
    from mindspore import Tensor
    for name, param in model.parameters_and_names():
        value, shape = params[name], tuple(param.shape)
        if value.shape[0] < shape[0] and value.shape[1:] == shape[1:]:          # padded vocabulary
            value = np.concatenate([value, np.zeros((shape[0] - value.shape[0],) + shape[1:], value.dtype)])
        if value.shape != shape:
            raise HFConversionError(f"{name}: value of shape {list(value.shape)} for a parameter of "
                                    f"shape {list(shape)}")
        param.set_data(Tensor(np.ascontiguousarray(value, np.float32)))


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
