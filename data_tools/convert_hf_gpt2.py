#!/usr/bin/env python
"""Convert Hugging Face GPT-2 checkpoints to RapidGPT checkpoints and back (numpy only, no torch).

    python data_tools/convert_hf_gpt2.py --hf-dir gpt2/ --save checkpoints/gpt2
    python data_tools/convert_hf_gpt2.py --to-hf --load checkpoints/gpt2 --hf-dir gpt2_out/

HF -> RapidGPT: reads config.json + model.safetensors (fp16/bf16 weights become fp32) and writes
`iter_0000000` in RapidGPT's checkpoint layout, weights only, with metadata that records the
architecture, so `rapidgpt --task text_generation --load DIR --prompt ...` and
`rapidgpt --task pretraining --load DIR --skip-train ...` need no model flags. The folder's
vocab.json + merges.txt (if present) are copied into the checkpoint directory and recorded there
as the GPT2BPETokenizer (paths relative to the checkpoint, so it can be moved).

RapidGPT -> HF: writes config.json (GPT2LMHeadModel) + model.safetensors (a tied output layer is
saved once, as Hugging Face does) and copies the checkpoint's tokenizer files; the folder loads with
`GPT2LMHeadModel.from_pretrained(DIR)`.

Layouts and the exact mapping: rapidgpt/models/hf_gpt2.py.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.arguments import ArgumentError  # noqa: E402
from rapidgpt.models.hf_files import (CONFIG, SAFETENSORS, HFConversionError, load_into_model,  # noqa: E402
                                      write_safetensors)
from rapidgpt.models.hf_gpt2 import (TOKENIZER_FILES, eod_id, flags_from_hf_config, flags_of_model,  # noqa: E402
                                     hf_config_from_flags, hf_to_rapidgpt, read_hf_folder, rapidgpt_to_hf,
                                     tokenizer_files, vocab_file_size)
from rapidgpt.training.checkpoint_files import (LATEST, CheckpointError, find_checkpoint, read_metadata)
from rapidgpt.training.checkpointing import save_checkpoint  # noqa: E402

PROG = "convert_hf_gpt2.py"


def hf_to_checkpoint(hf_dir, save, ckpt_format="ckpt", divisible_by=128):
    """Write the HF GPT-2 folder `hf_dir` as a RapidGPT checkpoint under `save`; returns its path."""
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.models.pretrained import model_args

    if os.path.exists(os.path.join(save, LATEST)):
        raise HFConversionError(f"--save {save} already holds a RapidGPT checkpoint; give an empty "
                                f"or new folder")
    config, tensors, notes = read_hf_folder(hf_dir)
    flags = flags_from_hf_config(config, os.path.join(hf_dir, CONFIG))
    params = hf_to_rapidgpt(tensors, flags, where=hf_dir)
    tokenizer = tokenizer_files(hf_dir)
    if tokenizer and vocab_file_size(tokenizer["vocab_file"]) != flags["vocab_size"]:
        notes.append(f"note: {tokenizer['vocab_file']} has {vocab_file_size(tokenizer['vocab_file'])} "
                     f"tokens but config.json says vocab_size {flags['vocab_size']}; the tokenizer is "
                     f"not recorded (give --tokenizer-type/--vocab-file/--merge-file when you run)")
        tokenizer = {}
    elif not tokenizer:
        notes.append(f"note: no vocab.json + merges.txt in {hf_dir}: the checkpoint records no "
                     f"tokenizer (text generation will need --tokenizer-type/--vocab-file/--merge-file)")
    args = model_args(dict(flags, make_vocab_size_divisible_by=divisible_by))
    args.save, args.ckpt_format, args.no_save_optim, args.no_save_rng = save, ckpt_format, True, True
    if tokenizer:                         # save_checkpoint stores the files inside the checkpoint
        args.tokenizer_type = "GPT2BPETokenizer"
        args.vocab_file, args.merge_file = tokenizer["vocab_file"], tokenizer["merge_file"]
    model = build_gpt_model(args, flags["vocab_size"])
    load_into_model(model, params)
    return save_checkpoint(args, 0, 0, model, None, None), flags, notes


def checkpoint_to_hf(load, hf_dir):
    """Write the RapidGPT checkpoint under `load` as a Hugging Face GPT-2 folder `hf_dir`."""
    from rapidgpt.models.pretrained import load_pretrained

    if os.path.isfile(os.path.join(hf_dir, SAFETENSORS)):
        raise HFConversionError(f"--hf-dir {hf_dir} already holds a {SAFETENSORS}; give an empty or "
                                f"new folder")
    if not os.path.isdir(load):
        raise HFConversionError(f"--load {load}: no such directory")
    metadata = read_metadata(find_checkpoint(load))
    model = load_pretrained(load)
    flags = flags_of_model(model)
    saved_args = metadata.get("args") or {}
    for name in ("hidden_dropout", "attention_dropout", "init_method_std"):
        flags[name] = saved_args.get(name, flags[name])
    params = {name: param.asnumpy() for name, param in model.parameters_and_names()}
    tokenizer = {k: metadata["model"].get(k) for k in TOKENIZER_FILES} \
        if metadata["model"].get("tokenizer_type") == "GPT2BPETokenizer" else {}
    tokenizer = {k: v for k, v in tokenizer.items() if v and os.path.isfile(v)}
    notes = []
    if len(tokenizer) < len(TOKENIZER_FILES):
        notes.append(f"note: the checkpoint records no GPT-2 tokenizer files that exist here; "
                     f"{hf_dir} gets no vocab.json/merges.txt")
        tokenizer = {}
    os.makedirs(hf_dir, exist_ok=True)
    eod = eod_id(tokenizer["vocab_file"]) if tokenizer else None
    with open(os.path.join(hf_dir, CONFIG), "w") as f:
        json.dump(hf_config_from_flags(flags, eod), f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(hf_dir, SAFETENSORS), rapidgpt_to_hf(params, flags), {"format": "pt"})
    for flag, name in TOKENIZER_FILES.items():
        if flag in tokenizer:
            shutil.copyfile(tokenizer[flag], os.path.join(hf_dir, name))
    return flags, notes


def build_parser():
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf-dir", required=True,
                        help="Hugging Face GPT-2 folder: read (default) or written (--to-hf)")
    parser.add_argument("--save", help="HF -> RapidGPT: checkpoint folder to write")
    parser.add_argument("--to-hf", action="store_true", help="RapidGPT -> HF instead")
    parser.add_argument("--load", help="--to-hf: RapidGPT checkpoint folder to read")
    parser.add_argument("--ckpt-format", choices=["ckpt", "safetensors"], default="ckpt",
                        help="HF -> RapidGPT: MindSpore weight file format")
    parser.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                        help="HF -> RapidGPT: pad the vocabulary rows to a multiple of this")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.to_hf and not args.load:
        parser.error("--to-hf needs --load DIR (the RapidGPT checkpoint to export)")
    if not args.to_hf and not args.save:
        parser.error("give --save DIR (HF -> RapidGPT) or --to-hf --load DIR (RapidGPT -> HF)")
    if args.make_vocab_size_divisible_by < 1:
        parser.error("--make-vocab-size-divisible-by must be >= 1")
    try:
        if args.to_hf:
            flags, notes = checkpoint_to_hf(args.load, args.hf_dir)
            done = f"wrote {args.hf_dir} ({CONFIG} + {SAFETENSORS})"
        else:
            path, flags, notes = hf_to_checkpoint(args.hf_dir, args.save, args.ckpt_format,
                                                  args.make_vocab_size_divisible_by)
            done = f"wrote {path}"
    except (HFConversionError, CheckpointError, ArgumentError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    for note in notes:
        print(note, file=sys.stderr)
    print(f"{done}: GPT-2 with {flags['num_layers']} layers, hidden {flags['hidden_size']}, "
          f"{flags['num_attention_heads']} heads, vocabulary {flags['vocab_size']}, "
          f"{flags['max_position_embeddings']} positions"
          f"{', untied output layer' if flags['untie_embeddings_and_output_weights'] else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
