#!/usr/bin/env python
"""Change the tensor- and pipeline-parallel sizes of a RapidGPT checkpoint offline (one process).

    python data_tools/convert_checkpoint.py --load ckpt_tp2 --save ckpt_tp4 --target-tensor-parallel-size 4
    python data_tools/convert_checkpoint.py --load ckpt_pp2 --save ckpt_pp1 --target-pipeline-parallel-size 1

Reads the latest complete checkpoint under --load (or the iter_* directory given), merges every
tensor's `mp_rank_XX` pieces into the full tensor, refits the vocabulary padding to
--make-vocab-size-divisible-by x the new TP size, and writes the target size's pieces (model and
optimizer state alike) as iteration N of --save, atomically, with metadata, scheduler, RNG state
and consumed samples unchanged: a run at the new size resumes from it exactly as from the
original. Pipeline stages (`mp_rank_XX_YYY`) are merged by name; to split a checkpoint into
stages, tensors are placed by the built-in models' stage rule (rapidgpt.models.builtin.stages_of:
a layer on the stage of its global index, embeddings first, final LayerNorm and output layer last,
the tied word embeddings on both ends). `rapidgpt --load` also reshards on the fly; converting once
saves every rank reading every piece at each start.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mindspore as ms  # noqa: E402

from rapidgpt.models.builtin import stages_of  # noqa: E402
from rapidgpt.parallel.resharding import split_for_rank  # noqa: E402
from rapidgpt.tokenizer import padded_vocab_size  # noqa: E402
from rapidgpt.training.checkpoint_files import (METADATA, STATE, WEIGHTS, CheckpointError,  # noqa: E402
                                                file_record, file_records, find_checkpoint,
                                                fsync_path, iteration_dir,
                                                publish_checkpoint, rank_dir_name, temporary_dir,
                                                write_json)
from rapidgpt.training.checkpointing import gathered_tensors  # noqa: E402

PROG = "convert_checkpoint.py"


def _merged_state(source, pp_size):
    """state.json of TP rank 0, every pipeline stage's model parameters and tensor layout merged."""
    states = []
    for stage in range(pp_size):
        with open(os.path.join(source, rank_dir_name(0, stage, pp_size), STATE)) as f:
            states.append(json.load(f))
    if any("tensor_parallel_layout" not in state for state in states):
        return None
    state = dict(states[0])
    state["model_parameters"] = [n for s in states for n in s.get("model_parameters") or [] if n]
    state["tensor_parallel_layout"] = {k: v for s in states for k, v in s["tensor_parallel_layout"].items()}
    return state


def convert(load, save, target_tp, target_pp=None):
    """Write checkpoint `load` at tensor-parallel size `target_tp` and pipeline size `target_pp`
    (default: the checkpoint's) under `save`; returns (its path, the source's TP size, PP size)."""
    source = find_checkpoint(load)
    with open(os.path.join(source, METADATA)) as f:
        metadata = json.load(f)
    parallel = metadata.get("parallel", {})
    source_pp = parallel.get("pipeline_model_parallel_size", 1)
    target_pp = target_pp or source_pp
    state = _merged_state(source, source_pp)
    if state is None:
        raise CheckpointError(f"--load {load}: the checkpoint does not record how its tensors are split "
                              f"(saved by an older RapidGPT)")
    model = metadata.get("model") or {}
    if target_pp > 1 and (not model.get("num_layers") or model["num_layers"] % target_pp):
        raise CheckpointError(f"--target-pipeline-parallel-size {target_pp} does not divide the checkpoint's "
                              f"--num-layers {model.get('num_layers')}")
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
        _write_pieces(source, tmp, full, state, padded, target_tp, target_pp, model)
        metadata["parallel"] = dict(parallel, tensor_model_parallel_size=target_tp,
                                    pipeline_model_parallel_size=target_pp, world_size=target_tp * target_pp)
        metadata["parallel"].pop("stage_layers", None)          # the target's stages split evenly
        if padded and metadata.get("padded_vocab_size"):
            metadata["padded_vocab_size"] = max(padded.values())
        metadata.setdefault("args", {}).update(tensor_model_parallel_size=target_tp,
                                               pipeline_model_parallel_size=target_pp)
        metadata["files"] = file_records(tmp)
        write_json(os.path.join(tmp, METADATA), metadata)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish_checkpoint(save, tmp, iteration)
    return iteration_dir(save, iteration), parallel.get("tensor_model_parallel_size", 1), source_pp


def _write_pieces(source, tmp, full, state, padded, target_tp, target_pp, model):
    """Every target rank's mp_rank_XX(_YYY) folder (weights in the source's format, `state` as its
    state.json, restricted to the stage's tensors) and the source's other files (tokenizer files
    kept beside the metadata) into `tmp`, each file fsync'ed. `padded`: the target's padded rows of
    each vocabulary-sized tensor."""
    layout = state["tensor_parallel_layout"]
    fmt = "safetensors" if any(name.endswith(".safetensors") for _, _, names in os.walk(source) for name in names) \
        else "ckpt"
    tied = not model.get("untie_embeddings_and_output_weights")
    for stage in range(target_pp):
        names = [name for name in full if target_pp == 1 or
                 stage in stages_of(name, model["num_layers"], target_pp, tied)]
        stage_state = dict(state, model_parameters=[n for n in state["model_parameters"] if n in names],
                           tensor_parallel_layout={k: v for k, v in layout.items() if k in names})
        _write_stage(tmp, {name: full[name] for name in names}, stage_state, padded, target_tp, stage,
                     target_pp, fmt)
    for name in os.listdir(source):
        if os.path.isfile(os.path.join(source, name)) and name != METADATA:
            shutil.copy2(os.path.join(source, name), os.path.join(tmp, name))
            fsync_path(os.path.join(tmp, name))


def _write_stage(tmp, full, state, padded, target_tp, stage, target_pp, fmt):
    layout = state["tensor_parallel_layout"]
    for rank in range(target_tp):
        rank_dir = os.path.join(tmp, rank_dir_name(rank, stage, target_pp))
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


def _source_tp(load):
    with open(os.path.join(find_checkpoint(load), METADATA)) as f:
        return json.load(f).get("parallel", {}).get("tensor_model_parallel_size", 1)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, help="checkpoint folder (or iter_* directory) to read")
    parser.add_argument("--save", required=True, help="folder to write the converted checkpoint into")
    parser.add_argument("--target-tensor-parallel-size", type=int, default=None,
                        help="tensor-parallel size of the written checkpoint (default: the checkpoint's)")
    parser.add_argument("--target-pipeline-parallel-size", type=int, default=None,
                        help="pipeline stages of the written checkpoint (default: the checkpoint's); "
                             "stages are split by the built-in models' rule")
    args = parser.parse_args(argv)
    if args.target_tensor_parallel_size is None and args.target_pipeline_parallel_size is None:
        parser.error("give --target-tensor-parallel-size and/or --target-pipeline-parallel-size")
    for flag in ("target_tensor_parallel_size", "target_pipeline_parallel_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    try:
        target_tp = args.target_tensor_parallel_size or _source_tp(args.load)
        path, source_tp, source_pp = convert(args.load, args.save, target_tp, args.target_pipeline_parallel_size)
    except (CheckpointError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    target_pp = args.target_pipeline_parallel_size or source_pp
    print(f"wrote {path}: tensor-parallel size {source_tp} -> {target_tp}, pipeline size {source_pp} -> {target_pp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
