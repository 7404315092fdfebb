"""Saving and loading the tensors and state of a checkpoint (the folder layout, publication and
verification: rapidgpt/training/checkpoint_files.py).

Every rank calls `save_checkpoint`; the data-parallel rank 0 of each TP/PP position writes its
`mp_rank_XX` piece, rank 0 writes metadata.json (with the tokenizer files and the size and CRC-32
of every file) and publishes. `load_checkpoint` restores model, optimizer, scheduler and RNG
streams; a checkpoint saved at another tensor-parallel size is resharded while loading
(rapidgpt.parallel.resharding), one saved at another pipeline size is read from every stage.
"""
import errno
import json
import os
import random
import shutil
import signal
from typing import NamedTuple

import mindspore as ms
import numpy as np

from rapidgpt import __version__
from rapidgpt.config.pipeline_split import run_stage_layers, same_stage_layers
from rapidgpt.msrun_env import launched_by_msrun, passed_on_signal
from rapidgpt.parallel.comm import sum_over_ranks
from rapidgpt.parallel.fully_sharded import whole_parameters
from rapidgpt.parallel.resharding import merge_shards, split_for_rank, tensor_parallel_layout
from rapidgpt.parallel.state import get_parallel_state
from rapidgpt.training.checkpoint_files import (METADATA, MODEL_ARGS, STATE, WEIGHTS, CheckpointError,
                                                embed_tokenizer_files, file_record, file_records,
                                                find_checkpoint,
                                                fsync_path, iteration_dir, prune_checkpoints,
                                                publish_checkpoint, rank_dir_name, read_latest,
                                                read_metadata, temporary_dir, weights_file, write_json)


def rng_state():
    """Every RNG stream a resumed run needs to continue identically."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
            "mindspore": ms.get_rng_state().asnumpy().tolist()}


def set_rng_state(state):
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, np.uint32), pos, has_gauss, cached))
    ms.set_rng_state(ms.Tensor(np.array(state["mindspore"], np.uint8)))


def _named_parameters(model, optimizer, with_optimizer):
    """{checkpoint name: Parameter}: the model's parameters, each replaced by its fp32 main copy
    when the optimizer wrapper keeps one (16-bit runs), then with `with_optimizer` the optimizer's
    state (moments, step, lr, loss scaler) under the names an fp32 run gives it
    (rapidgpt/optim/mixed_precision.py): a checkpoint does not depend on the training precision.
    Under ZeRO-3 the model's parameters are ShardedStates over its pieces (whole_parameters)."""
    params = whole_parameters(model)
    if optimizer is not None:
        for name, tensor in optimizer.checkpoint_tensors(with_optimizer).items():
            params[name] = tensor
    return params


def model_config(args):
    """The model flags, and a classifier's label names (`args.labels`, class id = index)."""
    return {name: getattr(args, name, None) for name in MODEL_ARGS + ("labels",)}


class ExitSignal:
    """SIGTERM/SIGINT (pre-emption, Ctrl-C) during training: remembered, acted on at the next step
    boundary, where the loop saves a checkpoint and stops cleanly. A second signal is not caught
    in a single process; a rank msrun started keeps catching them."""

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = passed_on_signal(signal.Signals(signum).name)
        # Under msrun a rank may get the same SIGTERM twice (from a cluster scheduler and passed on
        # by the rapidgpt launcher), and the launcher's own second signal is the hard stop.
        if not launched_by_msrun():
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def save_checkpoint(args, iteration, consumed_samples, model, optimizer, scheduler, directory=None,
                    keep_last_n=None, extra_metadata=None, rerun_state=None):
    """Write checkpoint `iteration` under --save (or `directory`) atomically, publish it, prune old
    ones (all but the newest --keep-last-n-checkpoints, or `keep_last_n`). `extra_metadata` is
    added to metadata.json, `rerun_state` (the rerun state machine's) to each rank's state. Every rank calls it; with several processes the steps below run on
    the ranks named, and every rank learns whether a step failed anywhere before the next starts
    (so all of them raise the same error, and nothing half-written is published):

        rank 0                      a fresh temporary folder
        data-parallel rank 0 of     its mp_rank_XX folder (DP replicas hold the same values)
        each TP/PP position
        rank 0                      metadata.json, rename to iter_XXXXXXX, latest, prune

    With several nodes --save must be a shared filesystem, as for Megatron.
    """
    save, state = directory or args.save, get_parallel_state()
    tmp = temporary_dir(save, iteration)
    tp_rank, dp_rank, pp_rank = state.coordinates()
    params = _named_parameters(model, optimizer, not args.no_save_optim)
    # ZeRO's sharded state (rapidgpt/optim/distributed_optimizer.py) is gathered whole by every
    # data-parallel rank: the checkpoint holds what an unsharded run saves.
    params = {name: p.whole_value() if hasattr(p, "whole_value") else p for name, p in params.items()}

    def write_shard():
        rank_dir = os.path.join(tmp, rank_dir_name(tp_rank, pp_rank, state.pipeline_model_parallel_size))
        os.makedirs(rank_dir)
        weights = os.path.join(rank_dir, f"{WEIGHTS}.{args.ckpt_format}")
        ms.save_checkpoint([{"name": name, "data": p} for name, p in params.items()], weights,
                           format=args.ckpt_format)
        fsync_path(weights)
        write_json(os.path.join(rank_dir, STATE), {
            "weights_file": file_record(weights),
            "iteration": iteration, "consumed_train_samples": consumed_samples,
            "scheduler": scheduler.state_dict() if not args.no_save_optim else None,
            "rng": rng_state() if not args.no_save_rng else None,
            "has_optimizer": not args.no_save_optim,
            "rerun_state_machine": rerun_state,
            "model_parameters": list(whole_parameters(model)),
            "tensor_parallel_layout": tensor_parallel_layout(model, params)})
        fsync_path(rank_dir)

    def publish():
        stage_layers = run_stage_layers(args)
        write_json(os.path.join(tmp, METADATA), {
            "iteration": iteration, "consumed_train_samples": consumed_samples,
            "model": embed_tokenizer_files(tmp, model_config(args)), "files": file_records(tmp),
            "vocab_size": getattr(model, "vocab_size", None),
            "padded_vocab_size": getattr(model, "padded_vocab_size", None),
            "parallel": {"tensor_model_parallel_size": state.tensor_model_parallel_size,
                         "pipeline_model_parallel_size": state.pipeline_model_parallel_size,
                         "world_size": state.world_size,
                         **({"stage_layers": stage_layers} if stage_layers else {})},
            "versions": {"rapidgpt": __version__, "mindspore": ms.__version__},
            "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, list, type(None)))},
            **(extra_metadata or {})})
        publish_checkpoint(save, tmp, iteration)

    def fresh_tmp():
        os.makedirs(save, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)

    for on_this_rank, step in ((state.rank == 0, fresh_tmp), (dp_rank == 0, write_shard),
                               (state.rank == 0, publish)):
        error = None
        if on_this_rank:
            try:
                step()
            except Exception as e:        # noqa: BLE001 - every rank must reach the count below
                error = e
        if sum_over_ranks(int(error is not None)):
            if state.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            if error is not None and not _storage_error(error):
                raise error                   # a bug rather than the disk: keep its traceback
            raise _save_failed(save, iteration, error)
    if state.rank == 0:
        prune_checkpoints(save, keep_last_n or args.keep_last_n_checkpoints, keep=iteration,
                          retain_interval=None if keep_last_n else getattr(args, "save_retain_interval", None))
    return iteration_dir(save, iteration)


def _storage_error(error):
    """An error of the filesystem (safetensors' writer reports a full disk in its own error type)."""
    return isinstance(error, OSError) or "No space left" in str(error)


def _save_failed(save, iteration, error):
    """The CheckpointError of a failed save (`error`: this rank's storage error, None if another
    rank failed)."""
    previous = read_latest(save)
    kept = f"the last complete checkpoint (iteration {previous}) is intact" if previous is not None \
        else "no earlier checkpoint exists"
    if error is None:
        reason = "another rank could not write its part (its log under --log-dir says why)"
    elif getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(error):
        reason = "the disk is full"
    else:
        reason = str(error)
    failure = CheckpointError(f"could not save checkpoint {iteration} under --save {save}: {reason}; "
                              f"{kept}. Free space or point --save elsewhere.")
    failure.__cause__ = error
    return failure


class _RankCheckpoint:
    """This rank's view of the checkpoint in `path`: its state.json and, per tensor, this rank's
    piece. A checkpoint saved at another tensor-parallel size is resharded on the fly (every saved
    TP rank's folder is read; see rapidgpt.parallel.resharding); one saved at another pipeline size
    is read from every saved stage, each tensor from the first stage that holds it (names are
    global, and the tied embeddings' copy on the last stage equals the first stage's); so is one
    whose stages hold other layers than this run's (`stage_layers`, the run's; None: even)."""

    def __init__(self, path, tp_rank=None, tp_size=None, pp_rank=None, pp_size=None, stage_layers=None):
        state = get_parallel_state()
        pp_rank = state.coordinates()[2] if pp_rank is None else pp_rank
        pp_size = state.pipeline_model_parallel_size if pp_size is None else pp_size
        tp_rank = state.coordinates()[0] if tp_rank is None else tp_rank
        tp_size = state.tensor_model_parallel_size if tp_size is None else tp_size
        saved = read_metadata(path).get("parallel", {})
        saved_tp = saved.get("tensor_model_parallel_size", 1)
        saved_pp = saved.get("pipeline_model_parallel_size", 1)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.tp_resharded = saved_tp != tp_size
        num_layers = read_metadata(path).get("model", {}).get("num_layers")
        same_split = saved_pp == pp_size and same_stage_layers(saved.get("stage_layers"), stage_layers, num_layers,
                                                               pp_size)
        stages = [pp_rank] if same_split else list(range(saved_pp))
        ranks = range(saved_tp) if self.tp_resharded else [tp_rank]
        changes = ([f"tensor-parallel size {saved_tp}, resharded to {tp_size}"] if self.tp_resharded else []) + \
                  ([f"pipeline size {saved_pp} read as {pp_size}"] if saved_pp != pp_size else []) + \
                  (["other layers per pipeline stage, read from every stage"]
                   if saved_pp == pp_size and not same_split else [])
        self.where = f"{path} (saved at {', '.join(changes)})" if changes else \
            os.path.join(path, rank_dir_name(tp_rank, pp_rank, saved_pp))
        self.resharded = bool(changes)          # for the log
        try:
            self.pieces, metas = [], []
            for rank in ranks:
                piece = {}
                for stage in stages:
                    rank_dir = os.path.join(path, rank_dir_name(rank, stage, saved_pp))
                    found = weights_file(rank_dir)
                    if found is None:
                        raise CheckpointError(f"checkpoint {rank_dir}: {WEIGHTS}.ckpt|.safetensors missing or empty")
                    for name, tensor in ms.load_checkpoint(found[0], format=found[1]).items():
                        piece.setdefault(name, tensor)
                    if rank == ranks[0]:
                        with open(os.path.join(rank_dir, STATE)) as f:
                            metas.append(json.load(f))
                self.pieces.append(piece)
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint {self.where} cannot be read: {e}") from e
        self.meta = dict(metas[0])
        self.meta["model_parameters"] = [n for meta in metas for n in meta.get("model_parameters") or []]
        self.layout = {}
        for meta in reversed(metas):
            self.layout.update(meta.get("tensor_parallel_layout", {}))
        if self.tp_resharded and any("tensor_parallel_layout" not in meta for meta in metas):
            raise CheckpointError(f"checkpoint {path} does not record how its tensors are split over "
                                  f"tensor-parallel ranks (saved by an older RapidGPT); load it with "
                                  f"--tensor-model-parallel-size {saved_tp}")

    def names(self):
        return list(self.pieces[0])

    def __contains__(self, name):
        return name in self.pieces[0]

    def full(self, name):
        """Tensor `name` as numpy, every TP rank's piece merged (the vocabulary padded as saved)."""
        try:
            return merge_shards(name, [piece[name].asnumpy() for piece in self.pieces], self.layout.get(name))
        except ValueError as e:
            raise CheckpointError(f"checkpoint {self.where}: {e}") from None

    def value(self, name, local_shape):
        """Tensor `name` for a parameter of `local_shape` on this rank."""
        if not self.tp_resharded:
            return self.pieces[0][name]
        try:
            return ms.Tensor(split_for_rank(name, self.full(name), self.layout.get(name), local_shape,
                                            self.tp_rank, self.tp_size))
        except ValueError as e:
            raise CheckpointError(f"checkpoint {self.where}: {e}") from None


class _HuggingFaceWeights:
    """A Hugging Face model folder (GPT-2, BERT, the Llama family; Rapidformer's --pretrained-model-name-or-path) read like a
    checkpoint: its tensors under RapidGPT's names (rapidgpt/models/hf_gpt2.py, hf_bert.py, hf_llama.py), each split
    for this rank the way the model's own parameter is (`prefix`: where the GPT/BERT sits in the model)."""

    def __init__(self, path, model, logger=None):
        from rapidgpt.models.hf_files import CONFIG, converter_for
        hf = converter_for(path)
        config, tensors, notes = hf.read_hf_folder(path)
        self.tensors = hf.hf_to_rapidgpt(tensors, hf.flags_from_hf_config(config, os.path.join(path, CONFIG)),
                                         where=path)
        for note in notes if logger is not None else ():
            logger.warning(f"{path}: {note}")
        self.where, self.meta, self.prefix = path, {}, ""
        self.layout = tensor_parallel_layout(model, list(whole_parameters(model)))
        self.tp_rank, _, _ = get_parallel_state().coordinates()
        self.tp_size = get_parallel_state().tensor_model_parallel_size

    def names(self):
        return list(self.tensors)

    def value(self, name, local_shape):
        spec = self.layout.get(self.prefix + name)
        return ms.Tensor(split_for_rank(name, self.tensors[name], spec, local_shape, self.tp_rank, self.tp_size))


def gathered_tensors(path):
    """{name: numpy array} of every tensor of the checkpoint in `path` (`latest` under a --save
    folder, or an iter_* directory) as a single process would hold it: the tensor-parallel pieces
    merged; vocabulary-padded tensors keep the padding they were saved with."""
    checkpoint = _RankCheckpoint(find_checkpoint(path), tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    return {name: checkpoint.full(name) for name in checkpoint.names()}


def _assign(targets, checkpoint):
    """Set each `param` of `targets` {param name: (param, checkpoint name)} to the checkpoint's
    value after checking its shape."""
    for name, (param, saved_name) in targets.items():
        value = checkpoint.value(saved_name, tuple(param.shape))
        if tuple(value.shape) != tuple(param.shape):
            raise CheckpointError(f"checkpoint {checkpoint.where}: {saved_name} has shape {tuple(value.shape)}, "
                                  f"the model's {name} has {tuple(param.shape)}")
        param.set_data(value.astype(param.dtype))


def load_checkpoint(args, model, optimizer=None, scheduler=None, logger=None, rerun=None):
    """Restore model (+ optimizer, scheduler, RNG unless told not to, and the state of `rerun`, a
    rapidgpt.training.rerun_state_machine.RerunStateMachine) from --load.

    Returns `(iteration, consumed_train_samples)` to continue from; `(0, 0)` with --finetune,
    which takes the weights only (as does a call without an optimizer, e.g. for generation). Must run before the first compiled step (graphs do not see
    `set_data` made after they ran).
    """
    path = find_checkpoint(args.load, logger)
    checkpoint = _RankCheckpoint(path, stage_layers=run_stage_layers(args))
    meta = checkpoint.meta
    finetune = args.finetune or optimizer is None
    load_optimizer = not (finetune or args.no_load_optim) and meta["has_optimizer"]
    params = _named_parameters(model, optimizer, load_optimizer)
    optional = optimizer.optional_checkpoint_tensors() if optimizer is not None else set()
    params = {name: p for name, p in params.items() if name in checkpoint or name not in optional}
    missing = [name for name in params if name not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint {checkpoint.where} has no value for {len(missing)} parameters "
                              f"(first: {missing[0]}); it was saved from a different model")
    _assign({name: (param, name) for name, param in params.items()}, checkpoint)
    if optimizer is not None:
        optimizer.reload_model_params()
    if checkpoint.resharded and logger is not None:
        logger.info(f" resharded checkpoint {checkpoint.where}")
    if finetune:
        return 0, 0
    if load_optimizer and meta["scheduler"] is not None:
        try:
            scheduler.load_state_dict(meta["scheduler"], override=args.override_opt_param_scheduler,
                                      use_checkpoint=args.use_checkpoint_opt_param_scheduler)
        except ValueError as e:
            raise CheckpointError(f"--load {args.load}: {e}") from None
        resumes_training = not args.skip_train and meta["iteration"] < (args.train_iters or 0)
        if resumes_training and scheduler.num_steps >= scheduler.lr_decay_steps and logger is not None:
            logger.warning(f"WARNING: the LR schedule has finished decaying at this checkpoint: training goes on "
                           f"at the minimum learning rate {scheduler.min_lr:g} (--min-lr); to train further with "
                           f"a longer schedule, pass the new flags with --override-opt_param-scheduler")
    if not args.no_load_rng and meta["rng"] is not None:
        set_rng_state(meta["rng"])
    if rerun is not None:
        same_layout = not checkpoint.resharded and \
            read_metadata(path).get("parallel", {}).get("world_size") == get_parallel_state().world_size
        rerun.load_state_dict(meta.get("rerun_state_machine"), same_layout)
    return meta["iteration"], meta["consumed_train_samples"]


def _prefix_of(model_names, checkpoint_names):
    """The cell path under which the checkpoint's network sits in the model: '' when the names
    agree, `backbone.` when the model holds the pretrained network as `self.backbone`; the
    prefix that matches the most checkpoint tensors (the shortest among equals)."""
    counts = {}
    for name in model_names:
        parts = name.split(".")
        for cut in range(len(parts)):
            if ".".join(parts[cut:]) in checkpoint_names:
                prefix = ".".join(parts[:cut]) + "." if cut else ""
                counts[prefix] = counts.get(prefix, 0) + 1
    return max(counts, key=lambda prefix: (counts[prefix], -len(prefix))) if counts else None


class PretrainedLoad(NamedTuple):
    """What --pretrained-checkpoint did: model parameter names loaded and left to their fresh
    initialisation, and checkpoint tensors that went unused."""
    loaded: list
    initialised: list
    unused: list


def load_pretrained_weights(path, model, logger=None, optimizer=None, stage_layers=None,
                            flag="--pretrained-checkpoint"):
    """Model weights only (no optimizer, scheduler, iteration or RNG) from the checkpoint under
    `path` (--pretrained-checkpoint; `latest` or an `iter_*` directory, as for --load).

    Checkpoint tensor `n` goes into the model parameter `n`, or `<prefix>n` when the model wraps
    the pretrained network in a cell (e.g. `backbone.`, see `_prefix_of`). Parameters the
    checkpoint lacks (a new head) keep their fresh initialisation; both they and the unused
    checkpoint tensors are logged. A shape that differs is an error. Must run before the first
    compiled step. With the run's `optimizer` wrapper, 16-bit runs load into the fp32 main
    parameters (then cast into the model's). `stage_layers`: the run's layers per pipeline stage
    (rapidgpt/config/pipeline_split.py; None: an even split). `flag`: the flag that named `path`.
    """
    if os.path.isfile(os.path.join(path, "config.json")):
        directory = path
        checkpoint = _HuggingFaceWeights(path, model, logger)
    else:
        directory = find_checkpoint(path, logger, flag=flag)
        checkpoint = _RankCheckpoint(directory, stage_layers=stage_layers)
    checkpoint_names = checkpoint.meta.get("model_parameters") or sorted(checkpoint.names())
    params = _named_parameters(model, optimizer, False)
    prefix = checkpoint.prefix = _prefix_of(params, set(checkpoint_names))
    if prefix is None:
        raise CheckpointError(f"{flag} {path}: none of its {len(checkpoint_names)} tensors "
                              f"(e.g. {checkpoint_names[0]}) matches a parameter of the model "
                              f"(e.g. {next(iter(params))}); it was saved from a different model")
    targets = {prefix + name: (params[prefix + name], name) for name in checkpoint_names
               if prefix + name in params}
    _assign(targets, checkpoint)
    if optimizer is not None:
        optimizer.reload_model_params()
    report = PretrainedLoad(sorted(targets), sorted(set(params) - set(targets)),
                            sorted(name for name in checkpoint_names if prefix + name not in params))
    if logger is not None:
        where = f" into {prefix!r}" if prefix else ""
        logger.info(f" loaded {len(report.loaded)} of the model's {len(params)} parameters from "
                    f"{flag} {directory}{where} (weights only"
                    f"{', starting at iteration 0' if flag == '--pretrained-checkpoint' else ''})\n"
                    f"   newly initialised (not in the checkpoint): {', '.join(report.initialised) or 'none'}\n"
                    f"   unused checkpoint tensors: {', '.join(report.unused) or 'none'}")
    return report
