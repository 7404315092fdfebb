#!/usr/bin/env python
"""Convert Hugging Face checkpoints to RapidGPT checkpoints and back, by the model's architecture (numpy only, no torch).

    python data_tools/convert_hf.py --hf-dir Qwen2.5-0.5B/ --save checkpoints/qwen
    python data_tools/convert_hf.py --to-hf --load checkpoints/qwen --hf-dir qwen_out/

HF -> RapidGPT: config.json's model_type picks the mapping: LlamaForCausalLM (Llama 3.1's RoPE
scaling included), MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
(rapidgpt/models/hf_llama.py), GPT2LMHeadModel (data_tools/convert_hf_gpt2.py) and BERT
(data_tools/convert_hf_bert.py). The checkpoint (`iter_0000000`, weights only) records the
architecture flags, so `--load` / `--pretrained-checkpoint` / `rapidgpt.load_pretrained` need none.
RapidGPT -> HF: the checkpoint's model picks the class: BERT, GPT-2, or for a Llama-style model
Qwen3ForCausalLM (q/k norms), Qwen2ForCausalLM (q/k/v biases only) or LlamaForCausalLM (a Mistral
without sliding window is one); config.json + model.safetensors load with transformers'
from_pretrained, and HF -> RapidGPT -> HF gives the same tensors bit for bit.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import convert_hf_bert  # noqa: E402
import convert_hf_gpt2  # noqa: E402

from rapidgpt.hf_conversion import check_conversion_targets, check_exportable, conversion_main  # noqa: E402
from rapidgpt.models import hf_llama  # noqa: E402
from rapidgpt.models.hf_files import (CONFIG, SAFETENSORS, load_into_model, model_type,  # noqa: E402
                                      write_hf_config, write_safetensors)
from rapidgpt.tokenizer.hf_tokenizer import FOLDER_FILES  # noqa: E402
from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata  # noqa: E402

PROG = "convert_hf.py"


def llama_to_checkpoint(hf_dir, save, ckpt_format="ckpt", divisible_by=128):
    """Write the Llama-family folder `hf_dir` as a RapidGPT checkpoint under `save`."""
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.pretrained import model_args
    from rapidgpt.training.checkpointing import save_checkpoint
    check_conversion_targets(save=save)
    config, tensors, notes = hf_llama.read_hf_folder(hf_dir)
    flags = hf_llama.flags_from_hf_config(config, os.path.join(hf_dir, CONFIG))
    params = hf_llama.hf_to_rapidgpt(tensors, flags, where=hf_dir)
    args = model_args(dict(flags, make_vocab_size_divisible_by=divisible_by))
    args.save, args.ckpt_format, args.no_save_optim, args.no_save_rng = save, ckpt_format, True, True
    if _folder_tokenizer(hf_dir, flags["vocab_size"], notes):     # save_checkpoint stores its files
        args.tokenizer_type, args.tokenizer_model = "HuggingFaceTokenizer", hf_dir
    model = build_gpt_model(args, flags["vocab_size"])
    load_into_model(model, params)
    notes.append(f"note: --seq-length is {flags['seq_length']} of the model's {flags['max_position_embeddings']} "
                 f"positions")
    return save_checkpoint(args, 0, 0, model, None, None), flags, notes


def _folder_tokenizer(hf_dir, vocab_size, notes):
    """The Hugging Face folder's own tokenizer (tokenizer.json, as AutoTokenizer's fast tokenizer
    reads it), or None with a note saying why the checkpoint records none."""
    from rapidgpt.tokenizer.hf_tokenizer import HuggingFaceTokenizer, TokenizerError, folder_problem
    unrecorded = "the checkpoint records no tokenizer (text generation will need --tokenizer-type/--tokenizer-model)"
    if folder_problem(hf_dir):
        notes.append(f"note: no tokenizer.json in {hf_dir}: {unrecorded}")
        return None
    try:
        tokenizer = HuggingFaceTokenizer(hf_dir)
    except TokenizerError as e:
        notes.append(f"note: {e}; {unrecorded}")
        return None
    if tokenizer.vocab_size > vocab_size:
        notes.append(f"note: {hf_dir}'s tokenizer has {tokenizer.vocab_size} tokens, more than the model's "
                     f"vocab_size {vocab_size}; {unrecorded}")
        return None
    return tokenizer


def _write_tokenizer(model_flags, hf_dir, notes):
    """Write the tokenizer a checkpoint carries into the Hugging Face folder `hf_dir`, as
    transformers' AutoTokenizer reads it: a Hugging Face tokenizer folder's files as they are; a
    SentencePiece model as tokenizer.model with a LlamaTokenizer tokenizer_config.json (BOS added as
    Llama2Tokenizer adds it). -> (bos id, eos id) for config.json, None where there is none."""
    from rapidgpt.tokenizer import build_tokenizer
    kind, source = model_flags.get("tokenizer_type"), model_flags.get("tokenizer_model")
    if kind not in ("HuggingFaceTokenizer", "Llama2Tokenizer", "GPTSentencePieceTokenizer") or not source \
            or not os.path.exists(source):
        notes.append(f"note: the checkpoint carries no Hugging Face or SentencePiece tokenizer; {hf_dir} gets none "
                     f"(and no bos/eos token ids)")
        return None, None
    tokenizer = build_tokenizer(argparse.Namespace(tokenizer_type=kind, tokenizer_model=source))
    if kind == "HuggingFaceTokenizer":
        for name in FOLDER_FILES:
            if os.path.isfile(os.path.join(source, name)):
                shutil.copyfile(os.path.join(source, name), os.path.join(hf_dir, name))
        return tokenizer.bos, tokenizer.eod
    shutil.copyfile(source, os.path.join(hf_dir, "tokenizer.model"))
    config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": kind == "Llama2Tokenizer",
              "add_eos_token": False, "legacy": True, **tokenizer.special_pieces()}
    with open(os.path.join(hf_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    return (None if tokenizer.bos < 0 else tokenizer.bos), tokenizer.eod


def checkpoint_to_llama(load, hf_dir):
    """Write the RapidGPT checkpoint under `load` (a Llama-style GPT) as a Hugging Face folder."""
    from rapidgpt.pretrained import load_pretrained
    check_conversion_targets(hf_dir=hf_dir, load=load)
    metadata = read_metadata(find_checkpoint(load))
    check_exportable(metadata["model"], load)
    flags = dict(metadata["model"])
    for name in ("attention_dropout", "init_method_std"):          # not model flags: the run's
        flags[name] = (metadata.get("args") or {}).get(name, flags.get(name))
    model = load_pretrained(load)
    flags["vocab_size"] = model.vocab_size      # a run's from its tokenizer (the checkpoint records its flag)
    params = {name: param.asnumpy() for name, param in model.parameters_and_names()}
    notes = []
    os.makedirs(hf_dir, exist_ok=True)
    bos, eos = _write_tokenizer(flags, hf_dir, notes)
    config = hf_llama.hf_config_from_flags(flags, bos_id=bos, eos_id=eos)
    write_hf_config(hf_dir, config)
    write_safetensors(os.path.join(hf_dir, SAFETENSORS), hf_llama.rapidgpt_to_hf(params, flags), {"format": "pt"})
    return flags, [f"note: written as {config['architectures'][0]}"] + notes


def _is_llama_style(flags):
    return flags.get("normalization") == "RMSNorm" or flags.get("position_embedding_type") == "rope"


def hf_to_checkpoint(hf_dir, save, ckpt_format="ckpt", divisible_by=128):
    kind = model_type(hf_dir)
    if kind == "bert":
        return convert_hf_bert.hf_to_checkpoint(hf_dir, save, ckpt_format, divisible_by)
    if kind in hf_llama.ARCHITECTURES:
        return llama_to_checkpoint(hf_dir, save, ckpt_format, divisible_by)
    return convert_hf_gpt2.hf_to_checkpoint(hf_dir, save, ckpt_format, divisible_by)   # names what it refuses


def checkpoint_to_hf(load, hf_dir):
    check_conversion_targets(load=load)
    flags = read_metadata(find_checkpoint(load))["model"]
    if flags.get("model_type") == "bert":
        return convert_hf_bert.checkpoint_to_hf(load, hf_dir)
    if _is_llama_style(flags):
        return checkpoint_to_llama(load, hf_dir)
    return convert_hf_gpt2.checkpoint_to_hf(load, hf_dir)


def _summary(flags):
    if not _is_llama_style(flags):
        return ", untied output layer" if flags.get("untie_embeddings_and_output_weights") else ""
    return (f", {flags['num_query_groups']} key/value heads of {flags['kv_channels']} channels, RoPE base "
            f"{flags['rotary_base']}{' (Llama 3.1 scaling)' if flags['use_rope_scaling'] else ''}, "
            f"{'untied' if flags['untie_embeddings_and_output_weights'] else 'tied'} output layer")


def main(argv=None):
    return conversion_main(PROG, "Hugging Face", __doc__.split("\n\n")[0], hf_to_checkpoint, checkpoint_to_hf,
                           _summary, argv)


if __name__ == "__main__":
    sys.exit(main())
