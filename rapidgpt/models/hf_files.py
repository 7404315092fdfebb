"""Hugging Face model folders on disk: config.json, safetensors weights (one file, or shards
listed in model.safetensors.index.json). Used by the GPT-2 and BERT converters (hf_gpt2.py,
hf_bert.py).

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

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                 "I8": "i1", "U8": "u1", "BOOL": "?"}
_SAFETENSORS_DTYPES = {np.dtype(v): k for k, v in _NUMPY_DTYPES.items()}


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

def read_hf_config(hf_dir):
    """`(config, its path)`: a Hugging Face folder's config.json as a dict."""
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
    return config, config_path


def read_hf_weights(hf_dir, rename):
    """`(config, tensors, notes)` of a Hugging Face model folder: config.json as a dict, every
    weight as float32 under `rename(stored name)` (skipped where that is None), and remarks for
    the user (e.g. fp16 weights widened to fp32)."""
    config, _ = read_hf_config(hf_dir)
    files = _weight_files(hf_dir)
    tensors, notes, widened = {}, [], set()
    for path in files:
        loaded, dtypes = read_safetensors(path)
        for stored_name, array in loaded.items():
            name = rename(stored_name)
            if name is None:
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


def check_tensor_shapes(tensors, expected, where, sizes_hint, model, source=CONFIG):
    """Every tensor of `expected` ({name: shape}) is in `tensors` with that shape, and nothing else
    is; else one HFConversionError naming the tensor (`sizes_hint`: the settings of `source` to
    check; `model`: what a folder of these tensors is)."""
    for name, shape in expected.items():
        if name not in tensors:
            raise HFConversionError(f"{where}: tensor {name} missing (check {sizes_hint} in {source})")
        if tuple(tensors[name].shape) != shape:
            raise HFConversionError(f"{where}: tensor {name} has shape {list(tensors[name].shape)}, "
                                    f"{source} implies {list(shape)} (check {sizes_hint})")
    unexpected = sorted(set(tensors) - set(expected))
    if unexpected:
        raise HFConversionError(f"{where}: {len(unexpected)} tensors {model} does not have "
                                f"(first: {unexpected[0]})")


def load_into_model(model, params, partial=False):
    """Copy full-size parameters `{name: array}` into every parameter of a one-process model
    (zero-padding the vocabulary rows), or with `partial` into those `params` has. Call before the
    model's first compiled use."""
    from mindspore import Tensor
    for name, param in model.parameters_and_names():
        if partial and name not in params:
            continue
        value, shape = params[name], tuple(param.shape)
        if value.shape[0] < shape[0] and value.shape[1:] == shape[1:]:          # padded vocabulary
            value = np.concatenate([value, np.zeros((shape[0] - value.shape[0],) + shape[1:], value.dtype)])
        if value.shape != shape:
            raise HFConversionError(f"{name}: value of shape {list(value.shape)} for a parameter of "
                                    f"shape {list(shape)}")
        param.set_data(Tensor(np.ascontiguousarray(value, np.float32)))


class ConfigChecks:
    """Reading a config.json dict of one model family (`model_type`, e.g. "gpt2", or a tuple of
    them), `where` naming the file in messages: the family is checked on construction;
    `sizes(keys)` returns the named sizes, each required and a positive integer, and `refuse`
    rejects what RapidGPT cannot compute."""

    def __init__(self, config, where, model_type, family):
        self.config, self.where, self.family = config, where, family
        types = model_type if isinstance(model_type, tuple) else (model_type,)
        if config.get("model_type") not in types:
            raise HFConversionError(f"{where}: model_type {config.get('model_type')!r} is not "
                                    f"{' or '.join(map(repr, types))}; only {family} checkpoints convert here")

    def sizes(self, keys):
        found = {}
        for key in keys:
            if key not in self.config:
                raise HFConversionError(f"{self.where}: no {key!r}; this is not a {self.family} config.json")
            found[key] = value = self.config[key]
            if not isinstance(value, int) or value <= 0:
                raise HFConversionError(f"{self.where}: {key}={value!r} must be a positive integer")
        return found

    def divisible(self, sizes, key, by):
        if sizes[key] % sizes[by]:
            raise HFConversionError(f"{self.where}: {key} {sizes[key]} is not divisible by {by} {sizes[by]}")

    def refuse(self, key, value, why):
        raise HFConversionError(f"{self.where}: {key}={value!r} is not supported ({why}); only standard "
                                f"{self.family} models convert")


def model_type(hf_dir):
    """config.json's `model_type` of a Hugging Face folder (None if it has none or no config.json)."""
    try:
        with open(os.path.join(hf_dir, CONFIG)) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config.get("model_type") if isinstance(config, dict) else None


def converter_for(hf_dir):
    """The module that converts the folder's model (its config.json's model_type): hf_bert for
    "bert", hf_llama for the Llama family, hf_gpt2 otherwise (it names what it cannot convert).
    Each offers read_hf_folder, flags_from_hf_config, hf_folder_model_flags and hf_to_rapidgpt."""
    kind = model_type(hf_dir)
    if kind == "bert":
        from rapidgpt.models import hf_bert
        return hf_bert
    if kind in ("llama", "mistral", "qwen2", "qwen3"):
        from rapidgpt.models import hf_llama
        return hf_llama
    if kind not in ("gpt2", None):          # None: unreadable config.json, hf_gpt2 says what is wrong
        raise HFConversionError(f"{os.path.join(hf_dir, CONFIG)}: model_type {kind!r}; RapidGPT converts "
                                f"Hugging Face GPT-2 ('gpt2'), BERT ('bert'), Llama ('llama'), Mistral "
                                f"('mistral'), Qwen2 ('qwen2') and Qwen3 ('qwen3') models")
    from rapidgpt.models import hf_gpt2
    return hf_gpt2


def write_hf_config(hf_dir, config):
    """config.json (sorted keys, as save_pretrained writes it) in `hf_dir`, created if needed."""
    os.makedirs(hf_dir, exist_ok=True)
    with open(os.path.join(hf_dir, CONFIG), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
