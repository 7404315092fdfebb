"""Reading a Megatron-LM checkpoint with torch, without Megatron: its saved args and every model
tensor as a full (tensor- and pipeline-merged where the format stores it so) numpy array.

Two formats, as `pretrain_gpt.py --ckpt-format` writes them:

    <dir>/latest_checkpointed_iteration.txt                   "1000" (or "release")
    <dir>/iter_0001000/mp_rank_TT[_PPP]/model_optim_rng.pt    torch (legacy): one torch.save per
        rank, {"args": Namespace, "iteration", "checkpoint_version", "model": {name: tensor}, ...}
        ("model0", "model1", ... instead of "model" with virtual pipeline stages: one per chunk);
        names are Megatron-core's, layers numbered within the chunk, tensors are this rank's TP slice
    <dir>/iter_0001000/{.metadata, __R_0.distcp, metadata.json}   torch_dist: a
        torch.distributed.checkpoint (DCP) folder of global tensors (layers stacked on a leading
        axis, [num_layers, ...], TP slices already joined); the args are pickled inside it
        (`common_state`), or in common.pt beside it (older Megatron)

The pickled args refer to Megatron's classes (enums such as AttnBackend); they are read as
stand-ins that keep their arguments, so Megatron need not be installed.
"""
import io
import os
import pickle
import types
import warnings

from rapidgpt.errors import UserError

TRACKER = "latest_checkpointed_iteration.txt"
LEGACY_FILE = "model_optim_rng.pt"
DIST_MARKER = ".metadata"
TORCH_MISSING = ("reading a Megatron-LM checkpoint needs torch (the CPU build is enough): "
                 "pip install 'rapidgpt[megatron]' or pip install torch")


class MegatronCheckpointError(UserError, ValueError):
    """A folder that is not a readable Megatron-LM checkpoint; the message says which file and why."""


def import_torch():
    try:
        import torch
    except ImportError:
        raise MegatronCheckpointError(TORCH_MISSING) from None
    return torch


class StandIn:
    """An instance of a class the checkpoint names but this process does not have (Megatron's)."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state):
        self.state = state

    def __repr__(self):
        return f"{type(self).__name__}{self.args or ''}"


class _TolerantUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.split(".")[0] != "megatron":
            try:
                return super().find_class(module, name)
            except (ImportError, AttributeError):
                pass
        return type(name, (StandIn,), {"__module__": module})


# torch.load's pickle_module: its Unpickler is subclassed by torch (tensor storages), ours underneath.
TOLERANT_PICKLE = types.SimpleNamespace(Unpickler=_TolerantUnpickler, load=pickle.load, __name__="pickle")


def checkpoint_folder(load):
    """The `iter_XXXXXXX` (or `release`) folder `load` names: itself, or the one its tracker file names."""
    tracker = os.path.join(load, TRACKER)
    if not os.path.isfile(tracker):
        if os.path.isdir(load) and (os.path.isfile(os.path.join(load, DIST_MARKER)) or _legacy_ranks(load)):
            return load
        raise MegatronCheckpointError(f"--load {load}: no {TRACKER} and no Megatron checkpoint files in it; give "
                                      f"the folder Megatron's --save wrote, or one of its iter_XXXXXXX folders")
    with open(tracker) as f:
        text = f.read().strip()
    folder = os.path.join(load, "release" if text == "release" else f"iter_{int(text):07d}" if text.isdigit() else text)
    if not os.path.isdir(folder):
        raise MegatronCheckpointError(f"--load {load}: {TRACKER} says {text!r} but there is no {folder}")
    return folder


def _legacy_ranks(folder):
    return sorted(name for name in os.listdir(folder)
                  if name.startswith("mp_rank_") and os.path.isfile(os.path.join(folder, name, LEGACY_FILE)))


def _load(torch, source, name=None):
    try:
        return torch.load(source, map_location="cpu", weights_only=False, pickle_module=TOLERANT_PICKLE)
    except Exception as e:            # torch raises many kinds for a truncated or foreign file
        raise MegatronCheckpointError(f"{name or source}: not a readable torch file ({type(e).__name__}: "
                                      f"{e})") from None


def read_legacy(folder):
    """-> (args, {(tp_rank, pp_rank, virtual stage): {name: numpy array}}) of a legacy (`torch`)
    checkpoint (virtual stage 0 only without virtual pipeline stages)."""
    torch = import_torch()
    pieces, args = {}, None
    for name in _legacy_ranks(folder):
        numbers = name[len("mp_rank_"):].split("_")
        tp_rank, pp_rank = int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else 0
        path = os.path.join(folder, name, LEGACY_FILE)
        state = _load(torch, path)
        chunks = {0: state["model"]} if "model" in state else {
            int(key[len("model"):]): value for key, value in state.items() if key[len("model"):].isdigit()}
        if not chunks:
            raise MegatronCheckpointError(f"{path}: no model in it (keys: {sorted(state)}); Megatron saves the "
                                          f"model as 'model' (or 'model0', 'model1', ... per virtual stage)")
        args = args or state.get("args")
        for vp_stage, model in chunks.items():
            pieces[tp_rank, pp_rank, vp_stage] = {key: value.detach().float().numpy() for key, value in model.items()
                                                  if torch.is_tensor(value) and not key.endswith("_extra_state")}
    return args, pieces                                                   # (_extra_state: TE's FP8 state)


def read_torch_dist(folder):
    """-> (args, {name: numpy array}) of a `torch_dist` checkpoint: the global tensors."""
    torch = import_torch()
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    class KeepBytes(dcp.DefaultLoadPlanner):
        """Keeps the pickled items (`common_state`: the args) as bytes: torch would unpickle them
        with Megatron's classes, which are not here."""
        def load_bytes(self, read_item, value):
            self.original_state_dict[read_item.dest_index.fqn] = value.read()

    reader = dcp.FileSystemReader(folder)
    try:
        metadata = reader.read_metadata()
    except Exception as e:
        raise MegatronCheckpointError(f"{os.path.join(folder, DIST_MARKER)}: not a readable torch.distributed "
                                      f"checkpoint ({type(e).__name__}: {e})") from None
    items = metadata.state_dict_metadata
    state = {key: torch.empty(tuple(item.size), dtype=item.properties.dtype)
             for key, item in items.items() if isinstance(item, TensorStorageMetadata)}
    common = [key for key, item in items.items() if key.startswith("common_state") and
              isinstance(item, BytesStorageMetadata)]
    state.update({key: None for key in common})
    with warnings.catch_warnings():        # torch's notice that no process group is used, as asked
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader, planner=KeepBytes(), no_dist=True)
    args = None
    for key in common:
        common_state = _load(torch, io.BytesIO(state.pop(key)), f"{folder} ({key})")
        for part in common_state if isinstance(common_state, list) else [common_state]:   # a ShardedObject's list
            args = args or part.get("args")
    if args is None and os.path.isfile(os.path.join(folder, "common.pt")):     # older Megatron: a file
        args = _load(torch, os.path.join(folder, "common.pt")).get("args")
    return args, {key: value.float().numpy() for key, value in state.items()}
