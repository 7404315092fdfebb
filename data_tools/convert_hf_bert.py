#!/usr/bin/env python
"""Convert Hugging Face BERT checkpoints to RapidGPT checkpoints and back (numpy only, no torch).

    python data_tools/convert_hf_bert.py --hf-dir bert-base-cased/ --save checkpoints/bert
    python data_tools/convert_hf_bert.py --to-hf --load checkpoints/bert --hf-dir bert_out/

HF -> RapidGPT: reads config.json + model.safetensors (BertForPreTraining, BertForMaskedLM,
BertForSequenceClassification or BertModel; fp16/bf16 weights become fp32) and writes `iter_0000000`
in RapidGPT's checkpoint layout, weights only, with metadata recording the architecture
(--model-type bert, --bert-no-binary-head when the file has no next-sentence head). The folder's
vocab.txt is copied into the checkpoint and recorded as BertWordPieceLowerCase or BertWordPieceCase
(tokenizer_config.json's do_lower_case), so `rapidgpt.load_pretrained(DIR)`,
`--pretrained-checkpoint DIR` and `--load DIR` need no model or tokenizer flags. A file without the
masked-LM head or pooler (BertModel, BertForMaskedLM, a classifier) gets seeded ones, and says so.

RapidGPT -> HF: writes config.json (BertForPreTraining) + model.safetensors (the tied decoder weight
saved once, as Hugging Face does) + vocab.txt and tokenizer_config.json; the folder loads with
`BertForPreTraining.from_pretrained(DIR)`.

Layouts and the exact mapping: rapidgpt/models/hf_bert.py.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.models.hf_bert import (TOKENIZER_CONFIG, VOCAB_TXT, flags_from_hf_config, hf_config_from_flags,  # noqa: E402
                                     hf_to_rapidgpt, rapidgpt_to_hf, read_hf_folder, tokenizer_flags)
from rapidgpt.hf_conversion import check_conversion_targets, conversion_main  # noqa: E402
from rapidgpt.models.hf_files import (CONFIG, SAFETENSORS, HFConversionError, load_into_model,  # noqa: E402
                                      write_hf_config, write_safetensors)
from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata  # noqa: E402
from rapidgpt.training.checkpointing import save_checkpoint  # noqa: E402

PROG = "convert_hf_bert.py"
_SAVED_FLAGS = ("hidden_dropout", "attention_dropout", "init_method_std", "num_layers", "hidden_size",
                "num_attention_heads", "ffn_hidden_size", "max_position_embeddings", "layernorm_epsilon")


def _vocab_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def hf_to_checkpoint(hf_dir, save, ckpt_format="ckpt", divisible_by=128):
    """Write the HF BERT folder `hf_dir` as a RapidGPT checkpoint under `save`; returns
    (its path, the model flags, notes for the user)."""
    from rapidgpt.models.bert import build_bert_model
    from rapidgpt.pretrained import model_args
    from rapidgpt.parallel.random import initialize_parameters

    check_conversion_targets(save=save)
    config, tensors, notes = read_hf_folder(hf_dir)
    flags = flags_from_hf_config(config, os.path.join(hf_dir, CONFIG))
    params = hf_to_rapidgpt(tensors, flags, where=hf_dir)
    tokenizer = tokenizer_flags(hf_dir)
    if tokenizer and _vocab_lines(tokenizer["vocab_file"]) != flags["vocab_size"]:
        notes.append(f"note: {tokenizer['vocab_file']} has {_vocab_lines(tokenizer['vocab_file'])} tokens but "
                     f"config.json says vocab_size {flags['vocab_size']}; the tokenizer is not recorded (give "
                     f"--tokenizer-type/--vocab-file when you run)")
        tokenizer = {}
    elif not tokenizer:
        notes.append(f"note: no {VOCAB_TXT} in {hf_dir}: the checkpoint records no tokenizer (give "
                     f"--tokenizer-type/--vocab-file when you run)")
    args = model_args(dict(flags, make_vocab_size_divisible_by=divisible_by, **tokenizer))
    args.bert_binary_head = "binary_head.weight" in params
    args.save, args.ckpt_format, args.no_save_optim, args.no_save_rng = save, ckpt_format, True, True
    model = build_bert_model(args, flags["vocab_size"])
    initialize_parameters(model, args.seed)
    missing = sorted(name for name, _ in model.parameters_and_names() if name not in params)
    if missing:
        notes.append(f"note: {hf_dir} has no {', '.join(missing)} (its model has no such head); they start "
                     f"from the seeded initialisation (--seed {args.seed})")
    load_into_model(model, params, partial=True)
    return save_checkpoint(args, 0, 0, model, None, None), dict(flags, bert_binary_head=args.bert_binary_head), notes


def checkpoint_to_hf(load, hf_dir):
    """Write the RapidGPT BERT checkpoint under `load` as a Hugging Face BERT folder `hf_dir`."""
    from rapidgpt.pretrained import load_pretrained

    check_conversion_targets(hf_dir=hf_dir, load=load)
    metadata = read_metadata(find_checkpoint(load))
    if metadata["model"].get("model_type") != "bert":
        raise HFConversionError(f"--load {load}: the checkpoint holds a {metadata['model'].get('model_type') or 'gpt'} "
                                f"model; export GPT checkpoints with data_tools/convert_hf_gpt2.py")
    model = load_pretrained(load)
    saved = dict(metadata["model"], **(metadata.get("args") or {}))
    flags = {name: saved[name] for name in _SAVED_FLAGS}
    flags["vocab_size"] = model.vocab_size
    params = {name: param.asnumpy() for name, param in model.parameters_and_names()}
    write_hf_config(hf_dir, hf_config_from_flags(flags))
    write_safetensors(os.path.join(hf_dir, SAFETENSORS), rapidgpt_to_hf(params, flags), {"format": "pt"})
    notes, vocab = [], metadata["model"].get("vocab_file")
    if vocab and os.path.isfile(vocab):
        shutil.copyfile(vocab, os.path.join(hf_dir, VOCAB_TXT))
        with open(os.path.join(hf_dir, TOKENIZER_CONFIG), "w") as f:
            lower = metadata["model"].get("tokenizer_type") == "BertWordPieceLowerCase"
            json.dump({"do_lower_case": lower, "tokenizer_class": "BertTokenizer"}, f, indent=2)
            f.write("\n")
    else:
        notes.append(f"note: the checkpoint records no vocab.txt that exists here; {hf_dir} gets none")
    return flags, notes


def main(argv=None):
    return conversion_main(PROG, "BERT", __doc__.split("\n\n")[0], hf_to_checkpoint, checkpoint_to_hf,
                           lambda flags: "" if flags.get("bert_binary_head", True) else ", no binary head", argv)


if __name__ == "__main__":
    sys.exit(main())
