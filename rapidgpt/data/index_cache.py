"""On-disk cache of dataset index arrays (`.npy`), keyed by a hash of every setting that shapes them.

Index arrays (document/sample/shuffle/blending indices) take seconds to minutes to build for a
large corpus, so they are built once and memory-mapped afterwards. In a multi-rank run one rank
builds while the others wait at a barrier, then everyone maps the same files.
"""
import hashlib
import json
import os

import numpy as np


def description_hash(description):
    """md5 of the JSON of `description`: equal settings give equal cache names, any change a new one."""
    text = json.dumps(description, sort_keys=True, indent=1)
    return hashlib.md5(text.encode("utf-8")).hexdigest(), text


def _save_atomically(path, array):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)   # readers never see a half-written .npy


def _write_description(cache_dir, name, text):
    try:
        os.makedirs(cache_dir, exist_ok=True)
        with open(os.path.join(cache_dir, name), "w") as f:
            f.write(text)
    except OSError as e:
        raise OSError(f"cannot write the dataset index cache in {cache_dir} ({e.strerror}); "
                      f"point --data-cache-path at a writable directory") from e


def cached_arrays(cache_dir, kind, description, names, build, build_on_this_rank=True, barrier=None):
    """Return `{name: array}` for `names`, memory-mapped from `cache_dir`, building them if missing.

    `build()` returns the dict of arrays; it runs only on the building rank and only when some
    file is missing. Every rank calls `barrier()` exactly once, whether or not it built (or its
    build failed), so the collective stays matched even when ranks see the cache differently.
    Returns `(arrays, key, built)`: the mapped arrays, the settings hash that names them, and
    whether this call built them.
    """
    digest, text = description_hash(description)
    paths = {name: os.path.join(cache_dir, f"{digest}-{kind}-{name}.npy") for name in names}
    built = False
    try:
        if build_on_this_rank and not all(os.path.isfile(p) for p in paths.values()):
            _write_description(cache_dir, f"{digest}-{kind}-description.txt", text)
            arrays = build()
            for name in names:
                _save_atomically(paths[name], arrays[name])
            built = True
    finally:
        # Also when building failed: the waiting ranks then stop with the error below instead of
        # waiting for a rank that has gone.
        if barrier is not None:
            barrier()
    missing = [p for p in paths.values() if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(
            f"dataset index cache file {missing[0]} was not built: the building rank failed, or "
            f"does not share this directory with this rank (point --data-cache-path at a "
            f"directory every rank sees: with several nodes, one on a shared filesystem)")
    # np.asarray drops the np.memmap subclass (whose per-element indexing is ~10x slower) but keeps
    # the file mapping underneath.
    arrays = {name: np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
              for name, path in paths.items()}
    return arrays, digest, built
