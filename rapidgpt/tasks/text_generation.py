"""`rapidgpt --task text_generation --load DIR --prompt "..."` (or --prompts-file FILE).

With --chat each prompt is a user turn: the chat template (the checkpoint's tokenizer folder's own,
or --sft-tokenizer-prompt-format / --chat-template) renders it with its generation prompt, and the
answer stops at the template's end-of-turn token.

Builds the GPT the checkpoint describes (its metadata supplies the model and tokenizer flags),
loads its weights, and prints a continuation of each prompt: greedy by default, sampling with
--temperature / --top-k / --top-p, at most --max-new-tokens, stopping at end-of-document; the
key/value cache makes each new token one single-position step. With --fp16 the model computes in
fp16 (the checkpoint's fp32 weights cast), whatever precision it was trained in.
"""
from rapidgpt.arguments import parse_args
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.global_vars import get_logger, get_tokenizer
from rapidgpt.models.generation import generate
from rapidgpt.models.gpt import build_gpt_model
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.tasks.pretraining import chat_answer, vocab_size
from rapidgpt.training.checkpoint_files import CheckpointError, find_checkpoint
from rapidgpt.training.checkpointing import load_checkpoint
from rapidgpt.training.model_transforms import prepare_model


def read_prompts(args):
    if args.prompts_file:
        with open(args.prompts_file, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.strip()]
    return [args.prompt]


def main(argv=None, args=None):
    """Run the task on `argv` (default: the command line), or on the already parsed `args`."""
    args = args if args is not None else parse_args(argv=argv)
    find_checkpoint(args.load)                  # no checkpoint there: say so before anything else
    RapidGPTEngine(args=args)
    tokenizer = get_tokenizer()
    if tokenizer is None:
        raise CheckpointError(f"the checkpoint under --load {args.load} records no tokenizer; give "
                              f"--tokenizer-type/--vocab-file/--merge-file")
    model = build_gpt_model(args, vocab_size(args))
    initialize_parameters(model, args.seed)
    prepare_model(model, args.precision, args.recompute)        # --fp16: generate in fp16
    load_checkpoint(args, model, logger=get_logger())
    for prompt in read_prompts(args):
        if args.chat:
            get_logger().info(f"prompt: {prompt!r}\nanswer: {chat_answer(args, model, tokenizer, prompt)!r}")
        else:
            text = generate(model, tokenizer, prompt, args.max_new_tokens, args.top_k, args.top_p,
                            args.temperature, args.seed)
            get_logger().info(f"prompt: {prompt!r}\ncontinuation: {text!r}")
    return 0
