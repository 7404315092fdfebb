#!/usr/bin/env python
"""Estimate the memory per rank of a training run from its flags, before running it.

    python data_tools/estimate_memory.py <the training flags> [--world-size N] [--json]

    python data_tools/estimate_memory.py --num-layers 36 --hidden-size 4096 --num-attention-heads 32 \\
        --seq-length 1024 --vocab-size 51200 --micro-batch-size 1 --fp16 --world-size 64 \\
        --zero-2-memory-optimization

Prints the built-in GPT's parameters (in total and per pipeline stage) and, per rank of each
stage, the bytes of weights, gradients, optimizer state and activations for the layout (TP, PP,
the data-parallel size that --world-size leaves), the precision, the recompute flags and the ZeRO
stage given; --json prints one object with the keys parameters, parameters_per_rank (what a
rank holds: under ZeRO-3 its 1/DP shard, outside the layer being gathered),
parameters_per_model_parallel_rank (before ZeRO-3 sharding), weight_bytes_per_rank,
gradient_bytes_per_rank, optimizer_bytes_per_rank, activation_bytes_per_rank (the stage that needs
the most memory; every stage under "stages"). Under ZeRO-3 the table shows the unsharded count
apart, as before-ZeRO-3.
Nothing is allocated and MindSpore is not loaded: any model size works. The vocabulary comes from
--vocab-size, else the tokenizer flags, else (--task pretraining without data) the demo corpus's.
How each figure is computed: rapidgpt/theoretical_memory.py.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.arguments import build_parser, validate_args  # noqa: E402
from rapidgpt.flag_parser import ArgumentError, Problems  # noqa: E402
from rapidgpt.theoretical_memory import estimate, format_bytes, layout_from_args, shape_from_args  # noqa: E402

PROG = "estimate_memory.py"


def vocabulary_size(args):
    if args.vocab_size is not None:
        return args.vocab_size
    if args.tokenizer_type is None and args.task == "pretraining" and not (args.data_path or args.train_data_path):
        from rapidgpt.tasks.pretraining import use_demo_corpus
        use_demo_corpus(args)
    if args.tokenizer_type is None:
        raise ArgumentError(["--vocab-size: give it, or the tokenizer flags (--tokenizer-type, --vocab-file, "
                             "--merge-file), so that the embeddings' size is known"])
    from rapidgpt.tokenizer import build_tokenizer
    return build_tokenizer(args).vocab_size


def parse(argv):
    own = argparse.ArgumentParser(prog=PROG, add_help=False)
    own.add_argument("--world-size", type=int, default=None)
    own.add_argument("--json", action="store_true")
    own.add_argument("-h", "--help", action="store_true")
    mine, rest = own.parse_known_args(argv)
    if mine.help:
        print(__doc__)
        sys.exit(0)
    args, problems = build_parser().parse(rest)
    check = Problems()
    check.messages += problems
    try:
        if args.train_iters is None and args.train_samples is None:
            args.train_iters = 1                # the length of training changes nothing here
        world_size = mine.world_size or args.nproc_per_node * (args.nnodes or 1)
        check.require(world_size >= 1, f"--world-size: must be >= 1, got {world_size}")
        validate_args(args, world_size=world_size, check=check)
        vocab = vocabulary_size(args) if not check.messages else None
    except ArgumentError as e:
        check.messages += [m for m in e.problems if m not in check.messages]
    if check.messages:
        for message in check.messages:
            print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)
    return args, mine, vocab


def main(argv=None):
    args, mine, vocab = parse(sys.argv[1:] if argv is None else argv)
    zero = args.zero
    shape, layout = shape_from_args(args, vocab), layout_from_args(args)
    result = estimate(shape, layout)
    if mine.json:
        print(json.dumps(result.as_dict(), indent=1))
        return 0
    print(f"GPT: {shape.num_layers} layers, hidden {shape.hidden_size}, {shape.num_attention_heads} heads, "
          f"seq {shape.seq_length}, vocabulary {vocab} (padded {shape.padded_vocab_size}); "
          f"{result.parameters:,} parameters")
    print(f"layout: TP={layout.tensor_parallel}{' (sequence parallel)' if layout.sequence_parallel else ''} "
          f"x PP={layout.pipeline_parallel} x DP={layout.data_parallel}, "
          f"{zero.describe()}, {args.precision.describe().split(';')[0]}, recompute: {args.recompute.describe()}, "
          f"micro batch {layout.micro_batch_size} x {layout.num_micro_batches} per step")
    sharded = zero.stage >= 3       # a rank holds 1/DP of its parameters: the unsharded count apart
    print(f"{'stage':>5} {'parameters/rank':>16} " + (f"{'before-ZeRO-3':>16} " if sharded else "")
          + f"{'weights':>10} {'gradients':>10} {'optimizer':>10} {'activations':>12} {'total':>10}")
    for st in result.stages:
        whole = f" {st['parameters_per_model_parallel_rank']:>16,}" if sharded else ""
        print(f"{st['stage']:>5} {st['parameters_per_rank']:>16,}{whole} "
              f"{format_bytes(st['weight_bytes_per_rank']):>10} "
              f"{format_bytes(st['gradient_bytes_per_rank']):>10} {format_bytes(st['optimizer_bytes_per_rank']):>10} "
              f"{format_bytes(st['activation_bytes_per_rank']):>12} {format_bytes(st['total_bytes_per_rank']):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
