"""`rapidgpt.load_pretrained(path)`: the built-in GPT with trained weights, in one call.

    import numpy as np, mindspore as ms, rapidgpt
    model = rapidgpt.load_pretrained("checkpoints/gpt2")        # or a Hugging Face GPT-2 folder
    logits = model(ms.Tensor(np.array([[464, 2068, 7586]], np.int32)))   # [b, s, vocab]
    losses = model(tokens[:, :-1], labels=tokens[:, 1:])                  # per-token CE [b, s-1]

`path` is a RapidGPT checkpoint (a --save folder, whose latest complete checkpoint is taken, or an
`iter_XXXXXXX` folder) or a Hugging Face GPT-2 folder (config.json + model.safetensors, converted
in memory, see rapidgpt/models/hf_gpt2.py). The architecture comes from the checkpoint's
metadata or config.json. No engine or command line is needed: the model is built in this process
(tensor/pipeline size 1) without touching an engine set up earlier (its flags, seeds and logger
stay as they were), and returned in eval mode (dropout off). Logits cover the true vocabulary;
padded rows never appear.
"""
import logging
import os

import mindspore as ms

from rapidgpt.arguments import ArgumentError, apply_checkpoint_args, build_parser, validate_args
from rapidgpt.engine import MINDSPORE_DEVICE, select_device
from rapidgpt.models.gpt import build_gpt_model
from rapidgpt.models.hf_gpt2 import (CONFIG, flags_from_hf_config, hf_to_rapidgpt, load_into_model,
                                     read_hf_folder)
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.parallel.state import get_parallel_state
from rapidgpt.training.checkpoint_files import CheckpointError, find_checkpoint, read_metadata
from rapidgpt.training.checkpointing import load_checkpoint


def is_hf_folder(path):
    """A Hugging Face model folder? (It holds config.json; a RapidGPT checkpoint folder does not.)"""
    return os.path.isfile(os.path.join(path, CONFIG))


def gpt_args(flags):
    """A validated flag namespace: the defaults, with the model flags `flags` set."""
    args = build_parser().parse_args([])
    for name, value in flags.items():
        setattr(args, name, value)
    return validate_args(args)


def _ensure_device():
    """Choose the device as RapidGPTEngine does, unless it (or the user) already chose one: MindSpore
    fixes the device once a kernel has run, so an engine created later must find the same choice."""
    from mindspore._c_expression import DeviceManagerConf
    if not DeviceManagerConf.get_instance().is_device_enable():
        ms.set_device(MINDSPORE_DEVICE[select_device(None)])


def _require_one_process(what):
    state = get_parallel_state()
    if state.tensor_model_parallel_size != 1 or state.pipeline_model_parallel_size != 1:
        raise CheckpointError(f"load_pretrained builds the whole model in one process, but this process "
                              f"is set up for tensor/pipeline sizes {state.tensor_model_parallel_size}/"
                              f"{state.pipeline_model_parallel_size}; load {what} in a single-process run")


def load_pretrained(path):
    """The GPTModel saved at `path` (RapidGPT checkpoint or Hugging Face GPT-2 folder), weights
    loaded, in eval mode. Raises CheckpointError / HFConversionError naming what is wrong."""
    _require_one_process(path)
    _ensure_device()
    if not os.path.isdir(path):
        raise CheckpointError(f"load_pretrained: {path} is not a directory (give a RapidGPT --save "
                              f"folder or a Hugging Face GPT-2 folder)")
    if is_hf_folder(path):
        config, tensors, notes = read_hf_folder(path)
        flags = flags_from_hf_config(config, os.path.join(path, CONFIG))
        params = hf_to_rapidgpt(tensors, flags, where=path)
        for note in notes:
            logging.getLogger("rapidgpt").warning(f"{path}: {note}")
        args = gpt_args(flags)
        model = build_gpt_model(args, flags["vocab_size"])
        initialize_parameters(model, args.seed)          # dropout streams; weights are replaced next
        load_into_model(model, params)
    else:
        args = build_parser().parse_args(["--load", path])
        try:
            apply_checkpoint_args(args, given=set())
            validate_args(args)
        except ArgumentError as e:
            raise CheckpointError(str(e)) from None
        metadata = read_metadata(find_checkpoint(path))
        stages = metadata.get("parallel", {}).get("pipeline_model_parallel_size", 1)
        if stages != 1:                       # tensor-parallel pieces are merged while loading
            raise CheckpointError(f"{path} was saved with {stages} pipeline stages; load_pretrained reads "
                                  f"checkpoints without pipeline stages")
        model = build_gpt_model(args, metadata["vocab_size"])
        initialize_parameters(model, args.seed)
        load_checkpoint(args, model)                     # weights only (no optimizer given)
    model.set_train(False)
    return model
