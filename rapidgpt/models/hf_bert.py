"""Hugging Face BERT <-> RapidGPT's BERT (rapidgpt/models/bert.py): configuration, weight layouts.

A Hugging Face BERT folder holds `config.json` (model_type "bert"), `model.safetensors` and the
tokenizer's `vocab.txt` (+ `tokenizer_config.json`, whose `do_lower_case` picks
BertWordPieceLowerCase or BertWordPieceCase; without it, lower case, Hugging Face's default, unless
the folder is named as a cased model, e.g. bert-base-cased). Saved from BertForPreTraining,
BertForMaskedLM, BertForSequenceClassification or BertModel, tensor names start with `bert.` (or
nothing, for BertModel) and the heads with `cls.` / `classifier.`; all are read, exports use
BertForPreTraining's names.

The two models compute the same function (post-LayerNorm layers, exact GELU, absolute positions,
two token types, pooler tanh(dense([CLS])), LM head LN(gelu(dense)) tied to the word embeddings
plus a bias); every conversion is a copy or a reshape, so values are copied bit for bit:

    HF (weight [out, in], as RapidGPT)                RapidGPT
    embeddings.word_embeddings.weight [vocab, h]      word_embeddings.weight [padded vocab, h]
    embeddings.position_embeddings.weight             position_embeddings.weight
    embeddings.token_type_embeddings.weight [2, h]    tokentype_embeddings.weight
    embeddings.LayerNorm.weight / .bias               embedding_layernorm.gamma / .beta
    encoder.layer.{i}.attention.self.query/key/value  layers.{i}.self_attention.query_key_value
        three [h, h] weights and [h] biases               [3h, h] / [3h], rows per head [heads, 3, hd]
    encoder.layer.{i}.attention.output.dense          layers.{i}.self_attention.dense
    encoder.layer.{i}.attention.output.LayerNorm      layers.{i}.post_attention_layernorm
    encoder.layer.{i}.intermediate.dense              layers.{i}.mlp.dense_h_to_4h
    encoder.layer.{i}.output.dense                    layers.{i}.mlp.dense_4h_to_h
    encoder.layer.{i}.output.LayerNorm                layers.{i}.post_mlp_layernorm
    pooler.dense                                      pooler
    cls.predictions.transform.dense / .LayerNorm      lm_head.dense / lm_head.layernorm
    cls.predictions.bias [vocab]                      lm_head.output_bias.bias [padded vocab]
    cls.seq_relationship [2, h]                       binary_head
    classifier [classes, h]                           head (BertSequenceClassifier, a BertModel:
                                                      the encoder under the same names)

Vocabulary padding: padded rows are zeros on import and dropped on export.
"""
import json
import os

import numpy as np

from rapidgpt.models.hf_files import CONFIG, ConfigChecks, HFConversionError, read_hf_config, read_hf_weights

VOCAB_TXT = "vocab.txt"
TOKENIZER_CONFIG = "tokenizer_config.json"

_LAYER_TENSORS = (
    ("attention.output.dense.weight", "self_attention.dense.weight"),
    ("attention.output.dense.bias", "self_attention.dense.bias"),
    ("attention.output.LayerNorm.weight", "post_attention_layernorm.gamma"),
    ("attention.output.LayerNorm.bias", "post_attention_layernorm.beta"),
    ("intermediate.dense.weight", "mlp.dense_h_to_4h.weight"),
    ("intermediate.dense.bias", "mlp.dense_h_to_4h.bias"),
    ("output.dense.weight", "mlp.dense_4h_to_h.weight"),
    ("output.dense.bias", "mlp.dense_4h_to_h.bias"),
    ("output.LayerNorm.weight", "post_mlp_layernorm.gamma"),
    ("output.LayerNorm.bias", "post_mlp_layernorm.beta"),
)
_QKV = ("query", "key", "value")
_EMBEDDINGS = (("embeddings.word_embeddings.weight", "word_embeddings.weight"),
               ("embeddings.position_embeddings.weight", "position_embeddings.weight"),
               ("embeddings.token_type_embeddings.weight", "tokentype_embeddings.weight"),
               ("embeddings.LayerNorm.weight", "embedding_layernorm.gamma"),
               ("embeddings.LayerNorm.bias", "embedding_layernorm.beta"))
_POOLER = (("pooler.dense.weight", "pooler.weight"), ("pooler.dense.bias", "pooler.bias"))
_LM_HEAD = (("cls.predictions.transform.dense.weight", "lm_head.dense.weight"),
            ("cls.predictions.transform.dense.bias", "lm_head.dense.bias"),
            ("cls.predictions.transform.LayerNorm.weight", "lm_head.layernorm.gamma"),
            ("cls.predictions.transform.LayerNorm.bias", "lm_head.layernorm.beta"),
            ("cls.predictions.bias", "lm_head.output_bias.bias"))
_BINARY_HEAD = (("cls.seq_relationship.weight", "binary_head.weight"),
                ("cls.seq_relationship.bias", "binary_head.bias"))
_CLASSIFIER = (("classifier.weight", "head.weight"), ("classifier.bias", "head.bias"))
# The decoder's weight is the word embeddings (tied) and its bias cls.predictions.bias: HF may save
# either; position_ids is a buffer older versions saved.
_IGNORED = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "embeddings.position_ids")


def _bert_name(stored_name):
    """A stored tensor's name without `bert.`; None for a tied copy or buffer, not a weight."""
    name = stored_name[len("bert."):] if stored_name.startswith("bert.") else stored_name
    return None if name in _IGNORED else name


def read_hf_folder(hf_dir):
    """`(config, tensors, notes)` of a Hugging Face BERT folder (hf_files.read_hf_weights), the
    encoder's tensors named without `bert.`."""
    return read_hf_weights(hf_dir, _bert_name)


def flags_from_hf_config(config, where=CONFIG):
    """RapidGPT model flags for a BERT config.json dict; refuses what the built-in BERT cannot compute."""
    checks = ConfigChecks(config, where, "bert", "BERT")
    refuse = checks.refuse
    if config.get("hidden_act", "gelu") != "gelu":
        refuse("hidden_act", config.get("hidden_act"), "RapidGPT's BERT uses the exact GELU, 'gelu'")
    if config.get("position_embedding_type", "absolute") != "absolute":
        refuse("position_embedding_type", config.get("position_embedding_type"),
               "RapidGPT's BERT learns absolute positions")
    if config.get("type_vocab_size", 2) != 2:
        refuse("type_vocab_size", config.get("type_vocab_size"), "RapidGPT's BERT has two token types")
    if config.get("is_decoder", False) or config.get("add_cross_attention", False):
        refuse("is_decoder", True, "RapidGPT's BERT is an encoder")
    sizes = checks.sizes(("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                          "max_position_embeddings", "vocab_size"))
    checks.divisible(sizes, "hidden_size", "num_attention_heads")
    return {"model_type": "bert", "num_layers": sizes["num_hidden_layers"], "hidden_size": sizes["hidden_size"],
            "num_attention_heads": sizes["num_attention_heads"], "ffn_hidden_size": sizes["intermediate_size"],
            "max_position_embeddings": sizes["max_position_embeddings"],
            "seq_length": min(sizes["max_position_embeddings"], 512), "vocab_size": sizes["vocab_size"],
            "layernorm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
            "untie_embeddings_and_output_weights": False,
            "hidden_dropout": float(config.get("hidden_dropout_prob", 0.1)),
            "attention_dropout": float(config.get("attention_probs_dropout_prob", 0.1)),
            "init_method_std": float(config.get("initializer_range", 0.02))}


def lower_case(hf_dir):
    """Whether the folder's tokenizer lower-cases: tokenizer_config.json's do_lower_case, else
    Hugging Face's default (lower case) unless the folder's name says cased (bert-base-cased)."""
    path = os.path.join(hf_dir, TOKENIZER_CONFIG)
    if os.path.isfile(path):
        try:
            with open(path) as f:
                value = json.load(f).get("do_lower_case")
        except (OSError, ValueError, AttributeError) as e:
            raise HFConversionError(f"{path}: unreadable ({e})") from None
        if value is not None:
            return bool(value)
    name = os.path.basename(os.path.normpath(hf_dir)).lower()
    return not ("cased" in name and "uncased" not in name)


def tokenizer_flags(hf_dir):
    """`{tokenizer_type, vocab_file}` of the folder's WordPiece vocabulary (empty without vocab.txt)."""
    vocab = os.path.join(hf_dir, VOCAB_TXT)
    if not os.path.isfile(vocab):
        return {}
    kind = "BertWordPieceLowerCase" if lower_case(hf_dir) else "BertWordPieceCase"
    return {"tokenizer_type": kind, "vocab_file": vocab}


def hf_folder_model_flags(hf_dir):
    """The model flags a RapidGPT checkpoint records for the Hugging Face BERT folder `hf_dir`:
    its config.json's architecture, and its vocab.txt as the WordPiece tokenizer."""
    flags = flags_from_hf_config(*read_hf_config(hf_dir))
    model = {name: flags[name] for name in ("model_type", "num_layers", "hidden_size", "num_attention_heads",
                                            "ffn_hidden_size", "max_position_embeddings", "seq_length",
                                            "vocab_size", "layernorm_epsilon", "untie_embeddings_and_output_weights")}
    model.update(tokenizer_flags(hf_dir))
    return model


def hf_config_from_flags(flags):
    """A BertForPreTraining config.json dict for RapidGPT model flags."""
    return {"architectures": ["BertForPreTraining"], "model_type": "bert", "vocab_size": flags["vocab_size"],
            "hidden_size": flags["hidden_size"], "num_hidden_layers": flags["num_layers"],
            "num_attention_heads": flags["num_attention_heads"], "intermediate_size": flags["ffn_hidden_size"],
            "hidden_act": "gelu", "hidden_dropout_prob": flags["hidden_dropout"],
            "attention_probs_dropout_prob": flags["attention_dropout"],
            "max_position_embeddings": flags["max_position_embeddings"], "type_vocab_size": 2,
            "initializer_range": flags["init_method_std"], "layer_norm_eps": flags["layernorm_epsilon"],
            "pad_token_id": 0, "position_embedding_type": "absolute", "torch_dtype": "float32"}


def _name_pairs(flags, tensors):
    """(HF name, RapidGPT name) of every one-to-one tensor; heads only where `tensors` has them."""
    pairs = list(_EMBEDDINGS)
    for i in range(flags["num_layers"]):
        pairs += [(f"encoder.layer.{i}.{hf}", f"layers.{i}.{ours}") for hf, ours in _LAYER_TENSORS]
    for group in (_POOLER, _LM_HEAD, _BINARY_HEAD, _CLASSIFIER):
        if group[0][0] in tensors:
            pairs += list(group)
    return pairs


def _qkv_names(i, kind):
    return [f"encoder.layer.{i}.attention.self.{part}.{kind}" for part in _QKV]


def hf_to_rapidgpt(tensors, flags, where="the Hugging Face weights"):
    """RapidGPT BERT parameters `{name: float32 array}` (true vocabulary rows) from HF tensors
    (names without `bert.`): the encoder, and each head the file has (pooler, LM head, binary
    head, classifier, under the names of rapidgpt/models/bert.py and classification)."""
    h, heads = flags["hidden_size"], flags["num_attention_heads"]
    pairs = _name_pairs(flags, tensors)
    needed = [hf for hf, _ in pairs] + [n for i in range(flags["num_layers"]) for kind in ("weight", "bias")
                                        for n in _qkv_names(i, kind)]
    for name in needed:
        if name not in tensors:
            raise HFConversionError(f"{where}: tensor {name} missing (config.json describes "
                                    f"{flags['num_layers']} layers, hidden_size {h})")
    unexpected = sorted(set(tensors) - set(needed))
    if unexpected:
        raise HFConversionError(f"{where}: {len(unexpected)} tensors a BERT does not have (first: "
                                f"{unexpected[0]}); BertForPreTraining/MaskedLM/SequenceClassification/"
                                f"BertModel convert")
    params = {ours: np.ascontiguousarray(tensors[hf], np.float32) for hf, ours in pairs}
    for i in range(flags["num_layers"]):
        for kind in ("weight", "bias"):
            q, k, v = (tensors[n] for n in _qkv_names(i, kind))
            # [3, heads, hd, ...] -> [heads, 3, hd, ...]: each head's q, k, v together (Megatron's order)
            stacked = np.stack([q, k, v]).reshape((3, heads, h // heads) + q.shape[1:]).swapaxes(0, 1)
            params[f"layers.{i}.self_attention.query_key_value.{kind}"] = \
                np.ascontiguousarray(stacked.reshape((3 * h,) + q.shape[1:]), np.float32)
    shapes = {"word_embeddings.weight": (flags["vocab_size"], h),
              "position_embeddings.weight": (flags["max_position_embeddings"], h),
              "layers.0.mlp.dense_h_to_4h.weight": (flags["ffn_hidden_size"], h)}
    for name, shape in shapes.items():
        if name in params and params[name].shape != shape:
            raise HFConversionError(f"{where}: {name} has shape {list(params[name].shape)}, config.json "
                                    f"implies {list(shape)}")
    return params


def rapidgpt_to_hf(params, flags):
    """BertForPreTraining tensors `{name: float32 array}` from RapidGPT BERT parameters (padded
    vocabulary rows dropped; the tied decoder weight is not written, as HF saves it)."""
    h, heads, vocab = flags["hidden_size"], flags["num_attention_heads"], flags["vocab_size"]
    tensors = {}
    for hf, ours in _name_pairs(flags, {hf: None for hf, ours in _POOLER + _LM_HEAD + _BINARY_HEAD
                                        if ours in params}):
        value = params[ours]
        if ours in ("word_embeddings.weight", "lm_head.output_bias.bias"):
            value = value[:vocab]
        tensors[hf if hf.startswith("cls.") else "bert." + hf] = np.ascontiguousarray(value, np.float32)
    for i in range(flags["num_layers"]):
        for kind in ("weight", "bias"):
            qkv = params[f"layers.{i}.self_attention.query_key_value.{kind}"]
            split = qkv.reshape((heads, 3, h // heads) + qkv.shape[1:]).swapaxes(0, 1).reshape((3, h) + qkv.shape[1:])
            for name, value in zip(_qkv_names(i, kind), split):
                tensors["bert." + name] = np.ascontiguousarray(value, np.float32)
    return tensors
