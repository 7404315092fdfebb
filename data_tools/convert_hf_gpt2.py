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
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.hf_conversion import check_conversion_targets, check_exportable, conversion_main  # noqa: E402
from rapidgpt.models.hf_files import CONFIG, SAFETENSORS, load_into_model, write_hf_config, write_safetensors  # noqa: E402
from rapidgpt.models.hf_gpt2 import (TOKENIZER_FILES, eod_id, flags_from_hf_config, flags_of_model,  # noqa: E402
                                     hf_config_from_flags, hf_to_rapidgpt, read_hf_folder, rapidgpt_to_hf,
                                     tokenizer_files, vocab_file_size)
from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata  # noqa: E402
from rapidgpt.training.checkpointing import save_checkpoint  # noqa: E402

PROG = "convert_hf_gpt2.py"


def hf_to_checkpoint(hf_dir, save, ckpt_format="ckpt", divisible_by=128):
    """Write the HF GPT-2 folder `hf_dir` as a RapidGPT checkpoint under `save`; returns its path."""
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.pretrained import model_args

    check_conversion_targets(save=save)
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
    from rapidgpt.pretrained import load_pretrained

    check_conversion_targets(hf_dir=hf_dir, load=load)
    metadata = read_metadata(find_checkpoint(load))
    check_exportable(metadata["model"], load)
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
    eod = eod_id(tokenizer["vocab_file"]) if tokenizer else None
    write_hf_config(hf_dir, hf_config_from_flags(flags, eod))
    write_safetensors(os.path.join(hf_dir, SAFETENSORS), rapidgpt_to_hf(params, flags), {"format": "pt"})
    for flag, name in TOKENIZER_FILES.items():
        if flag in tokenizer:
            shutil.copyfile(tokenizer[flag], os.path.join(hf_dir, name))
    return flags, notes


def main(argv=None):
    return conversion_main(PROG, "GPT-2", __doc__.split("\n\n")[0], hf_to_checkpoint, checkpoint_to_hf,
                           lambda flags: ", untied output layer" if flags["untie_embeddings_and_output_weights"] else "",
                           argv)


if __name__ == "__main__":
    sys.exit(main())
