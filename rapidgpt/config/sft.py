"""Instruction finetuning (SFT): Megatron's `--sft` and `--sft-tokenizer-prompt-format`, its
`--chat-template`, and RapidGPT's choices for bad lines and long conversations.

    --sft                                   train on conversations (.jsonl, rapidgpt/data/chat_data.py)
                                            with the loss on the answers only (rapidgpt/data/sft_dataset.py);
                                            `--task sft` is `--task pretraining --sft`; without --data-path,
                                            on the embedded demo conversations (rapidgpt/data/demo_chats.py)
    --sft-tokenizer-prompt-format NAME      a named template: chatml, llama3, Megatron's nemotron-h-aligned,
                                            nemotron-nano-v2, identity; "default" (and no flag) is the
                                            tokenizer folder's own chat_template. (Megatron's default is
                                            nemotron-h-aligned, the template of its Nemotron tokenizers; a
                                            Hugging Face folder's own template is the one its model knows.)
    --chat-template TEXT|FILE               a Jinja chat template (Megatron's flag), over both
    --chat                                  --task text_generation (and the answer printed after --task sft
                                            with --prompt): each prompt is a user turn, rendered with the
                                            template and its generation prompt; generation stops at the
                                            template's end-of-turn token
    --sft-bad-lines refuse|skip             a line that is not a conversation stops the run (default),
                                            or is left out and counted
    --sft-too-long truncate|refuse          a conversation longer than --seq-length is cut (default, as
                                            Megatron cuts), or stops the run

The loss is the mean over the answer tokens of the whole iteration (all micro-batches and
data-parallel ranks): --sft turns on Megatron's --calculate-per-token-loss, so the result does not
depend on how answers fall into micro-batches.
"""
import os

from rapidgpt.data.chat_data import BAD_LINE_CHOICES
from rapidgpt.data.sft_dataset import TOO_LONG_CHOICES
from rapidgpt.tokenizer.chat_template import PROMPT_FORMATS

# Tokenizers that give each token's span of the text, which the answer mask is made from.
SFT_TOKENIZER_TYPES = ("HuggingFaceTokenizer", "GPT2BPETokenizer")
DATA_FLAGS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")


def add_sft_args(parser):
    g = parser.add_argument_group("instruction finetuning", "Megatron's --sft (rapidgpt/config/sft.py)")
    g.add_argument("--sft", action="store_true",
                   help="train on .jsonl conversations with the loss on the assistant answers, packed")
    g.add_argument("--sft-tokenizer-prompt-format", default=None, choices=PROMPT_FORMATS,
                   help="a named chat template (default: the tokenizer folder's chat_template)")
    g.add_argument("--chat-template", default=None, metavar="TEXT|FILE",
                   help="a Jinja chat template, or a file holding one")
    g.add_argument("--chat", action="store_true",
                   help="text generation: the prompt is a user turn of the chat template, the answer ends at its "
                        "end-of-turn token")
    g.add_argument("--sft-bad-lines", default="refuse", choices=BAD_LINE_CHOICES,
                   help="a .jsonl line that is not a conversation: stop the run (refuse) or leave it out (skip)")
    g.add_argument("--sft-too-long", default="truncate", choices=TOO_LONG_CHOICES,
                   help="a conversation longer than --seq-length: cut it (truncate) or stop the run (refuse)")


def check_sft_args(args, check):
    if args.task == "sft":
        args.sft = True
    check.require(not args.chat or args.task in ("text_generation", "sft") or args.sft,
                  "--chat: chat generation is --task text_generation's (or the answer to --prompt after --task sft)")
    template_flags = (("--sft-tokenizer-prompt-format", None), ("--chat-template", None))
    if not args.sft:
        for flag, default in (template_flags if not args.chat else ()) + (("--sft-bad-lines", "refuse"),
                                                                           ("--sft-too-long", "truncate")):
            check.require(getattr(args, flag[2:].replace("-", "_")) == default,
                          f"{flag}: takes effect with --sft (or --task sft{', --chat' * (flag in dict(template_flags))}) "
                          f"only; add --sft or remove {flag}")
        return
    check.require(getattr(args, "model_type", "gpt") != "bert", "--sft: instruction finetuning trains a GPT "
                                                               "(decoder); remove --model-type bert")
    check.require(not args.mock_data, "--sft: the conversations come from --data-path FILE.jsonl; remove --mock-data")
    check.require(not getattr(args, "fim_data", False), "--sft: fill-in-the-middle permutes pretraining samples; "
                                                        "remove --fim-data")
    check.require(args.tokenizer_type is None or args.tokenizer_type in SFT_TOKENIZER_TYPES,
                  f"--tokenizer-type {args.tokenizer_type}: --sft finds the answer tokens through the tokenizer's "
                  f"token spans, which {', '.join(SFT_TOKENIZER_TYPES)} give; use one of them")
    check.require(args.tokenizer_type, "--tokenizer-type: --sft renders conversations with a tokenizer; start "
                                       "from a Hugging Face folder that holds one (--pretrained-model-name-or-path) "
                                       "or give --tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR")
    for name in DATA_FLAGS:
        value = getattr(args, name)
        paths = value.split() if isinstance(value, str) else list(value or [])
        flag = "--" + name.replace("_", "-")
        for path in paths:
            check.require(os.path.splitext(path)[1].lower() in (".jsonl", ".json"),
                          f"{flag} {path}: --sft reads conversations from .jsonl files (one JSON object per line; "
                          f"weights are not taken: several files are read one after the other)")
    args.calculate_per_token_loss = True
