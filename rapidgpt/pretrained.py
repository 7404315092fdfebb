"""`rapidgpt.load_pretrained(path)`: the built-in GPT or BERT with trained weights, in one call.

    import numpy as np, mindspore as ms, rapidgpt
    model = rapidgpt.load_pretrained("checkpoints/gpt2")        # or a Hugging Face GPT-2 folder
    logits = model(ms.Tensor(np.array([[464, 2068, 7586]], np.int32)))   # [b, s, vocab]
    losses = model(tokens[:, :-1], labels=tokens[:, 1:])                  # per-token CE [b, s-1]

    bert = rapidgpt.load_pretrained("checkpoints/bert")         # or a Hugging Face BERT folder
    lm_logits, binary_logits = bert(input_ids, attention_mask, tokentype_ids)   # [b, s, V], [b, 2]

`path` is a RapidGPT checkpoint (a --save folder, whose latest complete checkpoint is taken, or an
`iter_XXXXXXX` folder) or a Hugging Face GPT-2, BERT, Llama, Mistral or Qwen2/3 folder (config.json + model.safetensors,
converted in memory, see rapidgpt/models/hf_gpt2.py, hf_bert.py, hf_llama.py). The architecture comes from the
checkpoint's metadata or config.json; a Hugging Face BERT gets the heads its file holds (BertModel:
none, and the model returns its hidden states `[b, s, h]` and None). No engine or command line is needed: the model is built in this process
(tensor/pipeline size 1) without touching an engine set up earlier (its flags, seeds and logger
stay as they were), and returned in eval mode (dropout off). Logits cover the true vocabulary;
padded rows never appear.
"""
import logging
import os

from rapidgpt.arguments import ArgumentError, apply_checkpoint_args, build_parser, validate_args
from rapidgpt.device import ensure_device, select_device
from rapidgpt.models.bert import build_bert_model
from rapidgpt.models.builtin import build_model
from rapidgpt.models.hf_files import CONFIG, converter_for, load_into_model
from rapidgpt.parallel.random import initialize_parameters
from rapidgpt.parallel.state import get_parallel_state
from rapidgpt.training.checkpoint_files import CheckpointError, find_checkpoint, read_metadata
from rapidgpt.training.checkpointing import load_checkpoint


def is_hf_folder(path):
    """A Hugging Face model folder? (It holds config.json; a RapidGPT checkpoint folder does not.)"""
    return os.path.isfile(os.path.join(path, CONFIG))


def model_args(flags):
    """A validated flag namespace: the defaults, with the model flags `flags` set."""
    args = build_parser().parse_args([])
    for name, value in flags.items():
        setattr(args, name, value)
    return validate_args(args)


def _require_one_process(what):
    state = get_parallel_state()
    if state.tensor_model_parallel_size != 1 or state.pipeline_model_parallel_size != 1:
        raise CheckpointError(f"load_pretrained builds the whole model in one process, but this process "
                              f"is set up for tensor/pipeline sizes {state.tensor_model_parallel_size}/"
                              f"{state.pipeline_model_parallel_size}; load {what} in a single-process run")


def load_pretrained(path):
    """The GPTModel or BertModel saved at `path` (RapidGPT checkpoint or Hugging Face folder), weights
    loaded, in eval mode. Raises CheckpointError / HFConversionError naming what is wrong."""
    _require_one_process(path)
    ensure_device(select_device(None))
    if not os.path.isdir(path):
        raise CheckpointError(f"load_pretrained: {path} is not a directory (give a RapidGPT --save "
                              f"folder or a Hugging Face model folder)")
    if is_hf_folder(path):
        hf = converter_for(path)
        config, tensors, notes = hf.read_hf_folder(path)
        flags = hf.flags_from_hf_config(config, os.path.join(path, CONFIG))
        params = hf.hf_to_rapidgpt(tensors, flags, where=path)
        for note in notes:
            logging.getLogger("rapidgpt").warning(f"{path}: {note}")
        args = model_args(flags)
        if args.model_type == "bert":        # the heads the folder has (BertModel: none)
            args.bert_binary_head = "binary_head.weight" in params
            model = build_bert_model(args, flags["vocab_size"], add_lm_head="lm_head.dense.weight" in params)
        else:
            model = build_model(args, flags["vocab_size"])
        initialize_parameters(model, args.seed)          # dropout streams; weights are replaced next
        missing = [name for name, _ in model.parameters_and_names() if name not in params]
        if missing:                          # e.g. BertForMaskedLM's folder has no pooler
            logging.getLogger("rapidgpt").warning(f"{path}: no {', '.join(missing)}; seeded initialisation "
                                                  f"(--seed {args.seed}) instead")
        load_into_model(model, params, partial=True)
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
        model = build_model(args, metadata["vocab_size"])
        initialize_parameters(model, args.seed)
        load_checkpoint(args, model)                     # weights only (no optimizer given)
    model.set_train(False)
    return model
