"""Checkpoint storage: the folder layout, atomic publication, and verification (no MindSpore here,
so the flags can be checked against a checkpoint before MindSpore is loaded).

    <save>/latest_checkpointed_iteration.txt         "100"
    <save>/iter_0000100/metadata.json                 model config, tokenizer, layout, versions, and
                                                      the size + CRC-32 of every other file
    <save>/iter_0000100/vocab.json, merges.txt        the tokenizer's files (or vocab.txt)
    <save>/iter_0000100/mp_rank_00/model_optim_rng.ckpt   model + optimizer state (MindSpore ckpt)
    <save>/iter_0000100/mp_rank_00/state.json         iteration, consumed samples, LR scheduler,
                                                      RNG states, tensor-parallel layout
    <save>/iter_0000100/mp_rank_01/...                the next tensor-parallel rank's piece
                                                      (mp_rank_TT_PPP with pipeline stages)

A checkpoint carries what it needs to be used anywhere: the tokenizer files are copied into it
and recorded by their names inside it (as a Hugging Face model folder does), so generation,
finetuning and conversion work from any directory, after the original files are gone.

Publication: everything is written into a temporary folder, fsync'ed, renamed to `iter_XXXXXXX`
in one step, and only then is `latest` replaced (write, fsync, rename). A crash at any moment
leaves the previous checkpoint complete and `latest` naming a complete one.

Verification on load: the checkpoint `latest` names must have every file metadata.json lists, at
the recorded size and CRC-32 (a truncated or corrupted file is caught, not just a missing one);
otherwise the newest checkpoint that verifies is used, with a warning naming the bad file.
"""
import json
import os
import shutil
import zlib

from rapidgpt.config.transformer import ARCHITECTURE_FLAGS
from rapidgpt.errors import UserError
from rapidgpt.tokenizer import TOKENIZER_FILE_ARGS, tokenizer_files

LATEST = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
WEIGHTS = "model_optim_rng"          # + ".ckpt" or ".safetensors" (--ckpt-format)
FORMATS = ("ckpt", "safetensors")
STATE = "state.json"
BEST = "best"                        # <save>/best/: the best evaluation's checkpoint (Finetuner)
# Model flags a checkpoint records. Loading fills them in unless given; a given architecture flag
# must match.
ARCHITECTURE_ARGS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size",
                     "max_position_embeddings", "vocab_size", "make_vocab_size_divisible_by",
                     "untie_embeddings_and_output_weights", "layernorm_epsilon", "tokenizer_type",
                     "model_type") + ARCHITECTURE_FLAGS
# The tokenizers' other settings (NullTokenizer's EOD; TikTokenizer's pattern and special tokens).
TOKENIZER_SETTING_ARGS = ("null_tokenizer_eod_id", "tiktoken_pattern", "tiktoken_num_special_tokens", "special_tokens")
MODEL_ARGS = ARCHITECTURE_ARGS + ("seq_length", "bert_binary_head") + TOKENIZER_SETTING_ARGS + TOKENIZER_FILE_ARGS
_CHUNK = 1 << 22
# Files whose CRC-32 this process already checked, by (path, size, mtime): --load's checkpoint is
# verified when the flags are read and again when it is loaded; it is read once.
_VERIFIED = set()
_TOKENIZER_BYTES = {}                # absolute path -> contents (remember_tokenizer_files)


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be written or read; the message says which and what to do."""


def iteration_dir(save, iteration):
    return os.path.join(save, f"iter_{iteration:07d}")


def temporary_dir(save, iteration):
    """Where checkpoint `iteration` is written before `publish_checkpoint` renames it into place."""
    return os.path.join(save, f".iter_{iteration:07d}.tmp")


def rank_dir_name(tp_rank=0, pp_rank=0, pp_size=1):
    """Megatron's per-rank folder: mp_rank_{tp:02d} or, with pipeline stages, mp_rank_{tp:02d}_{pp:03d}."""
    return f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path, payload):
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def file_record(path):
    """`{"size": bytes, "crc32": CRC-32}` of a file (zlib's CRC runs at several GB/s)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return {"size": os.path.getsize(path), "crc32": crc}


def file_records(folder):
    """`{relative path: {size, crc32}}` of every file of the checkpoint being written in `folder`
    but metadata.json; a weights file's record comes from the rank that wrote it (its state.json),
    so rank 0 reads only small files."""
    records = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if name.startswith(WEIGHTS + "."):
                with open(os.path.join(root, STATE)) as f:
                    records[relative] = json.load(f)["weights_file"]
            elif name != METADATA:
                records[relative] = file_record(path)
    return records


def remember_tokenizer_files(model_config):
    """Read the tokenizer files `model_config` names into memory (once per path): every later save
    embeds these bytes, even after their source is gone (e.g. the checkpoint a run resumed from,
    pruned by --keep-last-n-checkpoints). The engine calls it at start-up."""
    for key in TOKENIZER_FILE_ARGS:
        for path in tokenizer_files(model_config.get(key)):
            if os.path.abspath(path) not in _TOKENIZER_BYTES:
                with open(path, "rb") as f:
                    _TOKENIZER_BYTES[os.path.abspath(path)] = f.read()


def embed_tokenizer_files(folder, model_config):
    """Write the tokenizer files `model_config` names into `folder` (a tokenizer folder's into the
    subfolder `tokenizer/`) and record them there by name (a copy of `model_config` is returned)."""
    remember_tokenizer_files(model_config)
    config = dict(model_config)
    for key in TOKENIZER_FILE_ARGS:
        source = config.get(key)
        if not source:
            continue
        if os.path.isdir(source):
            name = "tokenizer"
            os.makedirs(os.path.join(folder, name), exist_ok=True)
            targets = [(path, os.path.join(name, os.path.basename(path))) for path in tokenizer_files(source)]
        else:
            name = os.path.basename(source)
            if key == "merge_file" and name == os.path.basename(config.get("vocab_file") or ""):
                name = "merges_" + name             # two files of one name keep distinct names
            targets = [(source, name)]
        for path, target in targets:
            with open(os.path.join(folder, target), "wb") as f:
                f.write(_TOKENIZER_BYTES[os.path.abspath(path)])
        config[key] = name
    return config


def publish_checkpoint(save, tmp, iteration):
    """Make the complete checkpoint written in `tmp` iteration `iteration` under `save`: fsync it,
    rename it to iter_XXXXXXX in one step, then replace `latest` (write, fsync, rename)."""
    final = iteration_dir(save, iteration)
    fsync_path(tmp)
    if os.path.exists(final):          # saving an iteration again: swap, never delete first
        trash = f"{final}.old{os.getpid()}"
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_path(save)
    latest_tmp = os.path.join(save, f".{LATEST}.tmp{os.getpid()}")
    with open(latest_tmp, "w") as f:
        f.write(str(iteration))
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(save, LATEST))
    fsync_path(save)


def prune_checkpoints(save, keep_last_n, keep, retain_interval=None):
    """After checkpoint `keep` (the latest) is complete: delete all but the newest `keep_last_n`
    complete checkpoints; with `retain_interval` (--save-retain-interval), Megatron's rule: the
    checkpoint saved before `keep` goes unless its iteration is a multiple of the interval."""
    if not keep_last_n and not retain_interval:
        return
    complete = complete_iterations(save)
    doomed = set(complete[:-keep_last_n]) if keep_last_n else set()
    previous = [iteration for iteration in complete if iteration < keep]
    if retain_interval and previous and previous[-1] % retain_interval:
        doomed.add(previous[-1])
    for iteration in sorted(doomed - {keep}):
        shutil.rmtree(iteration_dir(save, iteration), ignore_errors=True)


def save_dir_problem(save):
    """Why checkpoints cannot be written under `save` (None when they can): checked at start-up,
    so that a run does not train for hours and then find it cannot save."""
    existing = os.path.abspath(save)
    while not os.path.isdir(existing):
        if os.path.exists(existing):
            return f"{existing} is a file, not a directory; point --save at a directory"
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "the directory" if existing == os.path.abspath(save) else f"its parent {existing}"
        return (f"no permission to write in {what} (a permission problem, not disk space); "
                f"fix the permissions or point --save at a directory you can write")
    return None


def read_latest(save):
    try:
        with open(os.path.join(save, LATEST)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _read_metadata_file(path):
    with open(os.path.join(path, METADATA)) as f:
        return json.load(f)


def checkpoint_problem(path, verify_contents=False):
    """Why the checkpoint directory `path` cannot be loaded (None when it is complete): a missing
    directory or file, a file whose size differs from the one recorded, and with
    `verify_contents` a file whose CRC-32 differs (the whole checkpoint is read)."""
    if not os.path.isdir(path):
        return "directory missing"
    try:
        metadata = _read_metadata_file(path)
    except (OSError, ValueError) as e:
        return f"{METADATA} unreadable ({e})"
    parallel = metadata.get("parallel", {})
    tp, pp = parallel.get("tensor_model_parallel_size", 1), parallel.get("pipeline_model_parallel_size", 1)
    rank_dirs = [rank_dir_name(t, p, pp) for p in range(pp) for t in range(tp)]
    absent = [d for d in rank_dirs if not os.path.isdir(os.path.join(path, d))]
    if absent:
        return f"{absent[0]} missing ({len(rank_dirs)} mp_rank_* directories expected)"
    for d in rank_dirs:
        if weights_file(os.path.join(path, d)) is None:
            return f"{d}/{WEIGHTS}.ckpt|.safetensors missing or empty"
        state = os.path.join(path, d, STATE)
        if not os.path.isfile(state) or os.path.getsize(state) == 0:
            return f"{d}/{STATE} missing or empty"
    for name, record in metadata.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{name} missing"
        if os.path.getsize(file) != record["size"]:
            return f"{name} has {os.path.getsize(file)} bytes, {record['size']} were written (truncated?)"
        if verify_contents and not _contents_verified(file, record):
            return f"{name} is corrupt (its CRC-32 differs from the one recorded when it was saved)"
    return None


def _contents_verified(file, record):
    key = (os.path.abspath(file), record["size"], os.stat(file).st_mtime_ns)
    if key not in _VERIFIED and file_record(file)["crc32"] == record["crc32"]:
        _VERIFIED.add(key)
    return key in _VERIFIED


def weights_file(rank_dir):
    """`(path, format)` of a rank folder's weights file (None if missing or empty)."""
    for fmt in FORMATS:
        path = os.path.join(rank_dir, f"{WEIGHTS}.{fmt}")
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            return path, fmt
    return None


def complete_iterations(save):
    """Iterations of the complete checkpoints under `save` (every file there, at its size), ascending."""
    found = []
    for name in os.listdir(save) if os.path.isdir(save) else []:
        if name.startswith("iter_") and name[5:].isdigit():
            if checkpoint_problem(os.path.join(save, name)) is None:
                found.append(int(name[5:]))
    return sorted(found)


def best_record(save):
    """The score record ({"metric", "value", "epoch", "iteration"}) of the best checkpoint a
    Finetuner keeps under `<save>/best/` (None when there is none yet)."""
    directory = os.path.join(save, BEST)
    return read_metadata(find_checkpoint(directory)).get("best") if has_checkpoint(directory) else None


def has_checkpoint(directory):
    """Whether `directory` holds a checkpoint, complete or not (a `latest` file, an `iter_*`
    directory, or it is one itself): a run resumes from it rather than start afresh."""
    if not os.path.isdir(directory):
        return False
    return (os.path.isfile(os.path.join(directory, METADATA)) or os.path.isfile(os.path.join(directory, LATEST))
            or any(name.startswith("iter_") for name in os.listdir(directory)))


def start_checkpoint(args):
    """`(flag, directory)` of the checkpoint this run starts from, as Megatron decides it: --load
    when it holds a checkpoint (resume), else --pretrained-checkpoint (weights only), else none:
    `(None, None)`, a fresh start (so `--save DIR --load DIR` both starts and resumes a job).
    --skip-train has nothing to evaluate without one: --load then fails, saying none is there."""
    pretrained = getattr(args, "pretrained_checkpoint", None)
    if args.load and (has_checkpoint(args.load) or (args.skip_train and not pretrained)):
        return "--load", args.load
    if pretrained:
        return "--pretrained-checkpoint", pretrained
    return None, None


def find_checkpoint(load, logger=None, flag="--load"):
    """The checkpoint directory to load from `load` (given as `flag`): the one `latest` names if it
    verifies (every file at its recorded size and CRC-32), else the newest one that does, with a
    warning naming the bad file. `load` may also be an iter_* directory itself (then no fallback)."""
    if os.path.isfile(os.path.join(load, METADATA)):
        problem = checkpoint_problem(load, verify_contents=True)
        if problem:
            raise CheckpointError(f"{flag} {load}: the checkpoint is unusable: {problem}")
        return load
    latest = read_latest(load)
    if latest is not None:
        problem = checkpoint_problem(iteration_dir(load, latest), verify_contents=True)
        if problem is None:
            return iteration_dir(load, latest)
        message = f"checkpoint {iteration_dir(load, latest)} named by {LATEST} is unusable: {problem}"
    else:
        message = f"{os.path.join(load, LATEST)} missing or unreadable"
    for iteration in reversed(complete_iterations(load)):
        if iteration != latest and checkpoint_problem(iteration_dir(load, iteration), verify_contents=True) is None:
            if logger is not None:
                logger.warning(f"WARNING: {message}; falling back to the newest checkpoint that verifies, "
                               f"iteration {iteration}")
            return iteration_dir(load, iteration)
    raise CheckpointError(f"{flag} {load}: no complete checkpoint found ({message})")


def read_metadata(path):
    """metadata.json of the checkpoint directory `path`. Tokenizer files recorded by name (stored
    inside the checkpoint) are returned as paths inside `path`; other paths as recorded."""
    metadata = _read_metadata_file(path)
    model = metadata.get("model") or {}
    for key in TOKENIZER_FILE_ARGS:
        value = model.get(key)
        if value and not os.path.isabs(value) and os.path.exists(os.path.join(path, value)):
            model[key] = os.path.abspath(os.path.join(path, value))
    return metadata
