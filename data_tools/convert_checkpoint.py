#!/usr/bin/env python
"""Change the tensor-parallel size of a RapidGPT checkpoint offline (numpy only, one process).

    python data_tools/convert_checkpoint.py --load ckpt_tp2 --save ckpt_tp4 --target-tensor-parallel-size 4

Reads the latest complete checkpoint under --load (or the iter_* directory given), merges every
tensor's `mp_rank_XX` pieces into the full tensor, refits the vocabulary padding to
--make-vocab-size-divisible-by x the new TP size, and writes the target size's pieces (model and
optimizer state alike) as iteration N of --save, atomically, with metadata, scheduler, RNG state
and consumed samples unchanged: a run at the new size resumes from it exactly as from the
original. `rapidgpt --load` also reshards on the fly; converting once saves every rank reading
every piece at each start.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402

from rapidgpt.arguments import padded_vocab_size  # noqa: E402
from rapidgpt.parallel.resharding import split_for_rank  # noqa: E402
from rapidgpt.training.checkpoint_files import (METADATA, STATE, WEIGHTS, CheckpointError,  # noqa: E402
                                                file_record, file_records, find_checkpoint,
                                                fsync_path, iteration_dir,
                                                publish_checkpoint, rank_dir_name, temporary_dir,
                                                write_json)
from rapidgpt.training.checkpointing import gathered_tensors  # noqa: E402

PROG = "convert_checkpoint.py"


def convert(load, save, target_tp):
    """Write checkpoint `load` at tensor-parallel size `target_tp` under `save`; returns its path."""
    source = find_checkpoint(load)
    with open(os.path.join(source, METADATA)) as f:
        metadata = json.load(f)
    parallel = metadata.get("parallel", {})
    if parallel.get("pipeline_model_parallel_size", 1) != 1:
        raise CheckpointError(f"--load {load}: checkpoints with pipeline stages cannot be converted yet")
    with open(os.path.join(source, rank_dir_name(0), STATE)) as f:
        state = json.load(f)
    if "tensor_parallel_layout" not in state:
        raise CheckpointError(f"--load {load}: the checkpoint does not record how its tensors are split "
                              f"(saved by an older RapidGPT)")
    model = metadata.get("model") or {}
    for flag in ("num_attention_heads", "ffn_hidden_size"):
        if model.get(flag) and model[flag] % target_tp:
            raise CheckpointError(f"--target-tensor-parallel-size {target_tp} does not divide the checkpoint's "
                                  f"--{flag.replace('_', '-')} {model[flag]}")
    iteration = metadata["iteration"]
    if os.path.exists(iteration_dir(save, iteration)):
        raise CheckpointError(f"--save {save} already holds iteration {iteration}; choose another folder")
    # The padding Megatron gives the vocabulary at the target size.
    divisible_by = model.get("make_vocab_size_divisible_by") or 1
    padded = {name: padded_vocab_size(spec[1], divisible_by, target_tp)
              for name, spec in state["tensor_parallel_layout"].items() if spec[1]}
    full = gathered_tensors(source)
    tmp = temporary_dir(save, iteration)
    os.makedirs(save, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        _write_pieces(source, tmp, full, state, padded, target_tp)
        metadata["parallel"] = dict(parallel, tensor_model_parallel_size=target_tp, world_size=target_tp)
        if padded and metadata.get("padded_vocab_size"):
            metadata["padded_vocab_size"] = max(padded.values())
        metadata.setdefault("args", {})["tensor_model_parallel_size"] = target_tp
        metadata["files"] = file_records(tmp)
        write_json(os.path.join(tmp, METADATA), metadata)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_checkpoint(save, tmp, iteration)
    return iteration_dir(save, iteration), parallel.get("tensor_model_parallel_size", 1)


def _write_pieces(source, tmp, full, state, padded, target_tp):
    """Every target rank's mp_rank_XX folder (weights in the source's format, `state` as its
    state.json) and the source's other files (tokenizer files kept beside the metadata) into `tmp`,
    each file fsync'ed. `padded`: the target's padded rows of each vocabulary-sized tensor."""
    layout = state["tensor_parallel_layout"]
    fmt = "safetensors" if os.path.isfile(os.path.join(source, rank_dir_name(0), f"{WEIGHTS}.safetensors")) \
        else "ckpt"
    for name in os.listdir(source):
        if os.path.isfile(os.path.join(source, name)) and name != METADATA:
            shutil.copy2(os.path.join(source, name), os.path.join(tmp, name))
            fsync_path(os.path.join(tmp, name))
    for rank in range(target_tp):
        rank_dir = os.path.join(tmp, rank_dir_name(rank))
        os.makedirs(rank_dir)
        pieces = []
        for name, value in full.items():
            spec = layout.get(name)
            local_shape = list(value.shape)
            if spec is not None:
                if spec[1]:
                    local_shape[0] = padded[name]
                local_shape[spec[0]] //= target_tp
            try:
                piece = split_for_rank(name, value, spec, tuple(local_shape), rank, target_tp)
            except ValueError as e:
                raise CheckpointError(f"--target-tensor-parallel-size {target_tp}: {e}") from None
            pieces.append({"name": name, "data": ms.Tensor(piece)})
        weights = os.path.join(rank_dir, f"{WEIGHTS}.{fmt}")
        ms.save_checkpoint(pieces, weights, format=fmt)
        fsync_path(weights)
        write_json(os.path.join(rank_dir, STATE), dict(state, weights_file=file_record(weights)))


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, help="checkpoint folder (or iter_* directory) to read")
    parser.add_argument("--save", required=True, help="folder to write the converted checkpoint into")
    parser.add_argument("--target-tensor-parallel-size", type=int, required=True,
                        help="tensor-parallel size of the written checkpoint")
    args = parser.parse_args(argv)
    if args.target_tensor_parallel_size < 1:
        parser.error("--target-tensor-parallel-size must be >= 1")
    try:
        path, source_tp = convert(args.load, args.save, args.target_tensor_parallel_size)
    except (CheckpointError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}: tensor-parallel size {source_tp} -> {args.target_tensor_parallel_size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
