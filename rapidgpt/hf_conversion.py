"""The checkpoint converters' command line (data_tools/convert_hf*.py, convert_megatron.py): the
overwrite checks and the argument and error handling they share. Above training/ (a RapidGPT checkpoint is recognised by its
tracker file), so the model-side mapping in rapidgpt/models/hf_*.py stays free of it."""
import os
import sys

from rapidgpt.errors import UserError
from rapidgpt.models.hf_files import CONFIG, SAFETENSORS, HFConversionError
from rapidgpt.training.checkpoint_files import LATEST


def check_conversion_targets(save=None, hf_dir=None, load=None):
    """Refuse to overwrite: `save` must not hold a RapidGPT checkpoint, `hf_dir` (written) no
    weights; `load` must exist."""
    if save is not None and os.path.exists(os.path.join(save, LATEST)):
        raise HFConversionError(f"--save {save} already holds a RapidGPT checkpoint; give an empty or new folder")
    if hf_dir is not None and os.path.isfile(os.path.join(hf_dir, SAFETENSORS)):
        raise HFConversionError(f"--hf-dir {hf_dir} already holds a {SAFETENSORS}; give an empty or new folder")
    if load is not None and not os.path.isdir(load):
        raise HFConversionError(f"--load {load}: no such directory")


def check_exportable(model_flags, load):
    """Refuse a model no Hugging Face class computes: muP's (--use-mup) attention scale and
    embedding and logit multipliers have no field in GPT-2's or the Llama family's config.json;
    multi-latent attention is DeepSeek's (its folders are not written here)."""
    if model_flags.get("multi_latent_attention"):
        raise HFConversionError(f"--load {load}: the checkpoint's model has multi-latent attention (DeepSeek's), "
                                f"which GPT-2's and the Llama family's Hugging Face classes do not compute; writing "
                                f"DeepSeek folders is not built (load it with --load or --pretrained-checkpoint)")
    if model_flags.get("use_mup"):
        raise HFConversionError(f"--load {load}: the checkpoint's model was trained with --use-mup; its attention "
                                f"scale and embedding and logit multipliers have no Hugging Face config field, so "
                                f"it is not exported (load it with --load or --pretrained-checkpoint)")


def run_converter(prog, convert):
    """`convert() -> (..., notes)`, its notes printed on stderr -> its other values; a user error
    (bad folder, checkpoint or flag) printed as one line -> None."""
    try:
        *result, notes = convert()
    except (UserError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return None
    for note in notes:
        print(note, file=sys.stderr)
    return result


def conversion_main(prog, family, description, hf_to_checkpoint, checkpoint_to_hf, summary, argv=None):
    """The command line of a converter script for one model `family` ("GPT-2", "BERT"):
    `--hf-dir D --save OUT` runs `hf_to_checkpoint(D, OUT, ckpt_format, divisible_by) -> (path,
    flags, notes)`, `--to-hf --load CKPT --hf-dir D` runs `checkpoint_to_hf(CKPT, D) -> (flags,
    notes)`; then the notes on stderr and `summary(flags)` after "wrote ...". A user error (bad
    folder, checkpoint or flag) is one line and exit status 1."""
    import argparse
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--hf-dir", required=True,
                        help=f"Hugging Face {family} folder: read (default) or written (--to-hf)")
    parser.add_argument("--save", help="HF -> RapidGPT: checkpoint folder to write")
    parser.add_argument("--to-hf", action="store_true", help="RapidGPT -> HF instead")
    parser.add_argument("--load", help="--to-hf: RapidGPT checkpoint folder to read")
    parser.add_argument("--ckpt-format", choices=["ckpt", "safetensors"], default="ckpt",
                        help="HF -> RapidGPT: MindSpore weight file format")
    parser.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                        help="HF -> RapidGPT: pad the vocabulary rows to a multiple of this")
    args = parser.parse_args(argv)
    if args.to_hf and not args.load:
        parser.error("--to-hf needs --load DIR (the RapidGPT checkpoint to export)")
    if not args.to_hf and not args.save:
        parser.error("give --save DIR (HF -> RapidGPT) or --to-hf --load DIR (RapidGPT -> HF)")
    if args.make_vocab_size_divisible_by < 1:
        parser.error("--make-vocab-size-divisible-by must be >= 1")
    if args.to_hf:
        result = run_converter(prog, lambda: checkpoint_to_hf(args.load, args.hf_dir))
        done = f"wrote {args.hf_dir} ({CONFIG} + {SAFETENSORS})"
    else:
        result = run_converter(prog, lambda: hf_to_checkpoint(args.hf_dir, args.save, args.ckpt_format,
                                                              args.make_vocab_size_divisible_by))
        done = f"wrote {result[0]}" if result else None
    if result is None:
        return 1
    flags = result[-1]
    print(f"{done}: {family} with {flags['num_layers']} layers, hidden {flags['hidden_size']}, "
          f"{flags['num_attention_heads']} heads, vocabulary {flags['vocab_size']}, "
          f"{flags['max_position_embeddings']} positions{summary(flags)}")
    return 0
