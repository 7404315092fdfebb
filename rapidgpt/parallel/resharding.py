"""Tensor-parallel shards of a checkpoint: how each tensor is split over TP ranks, and how the
shards saved at one TP size become another TP size's.

A checkpoint's `mp_rank_XX` folders hold each rank's piece of the model and optimizer state. Its
state.json records, for every saved tensor that is split over TP ranks, `[partition_dim,
vocab_rows]` ("tensor_parallel_layout"; `vocab_rows`: the true vocabulary size when dimension 0
is a padded vocabulary, else null; tensors not listed are replicated: every rank saved the same
value). Optimizer state named `<prefix>.<parameter name>` (Adam moments, SGD momentum) is split
like its parameter.

Resharding one tensor (checkpoint at TP size m, model at TP size n):
    full  = concatenate the m saved pieces along partition_dim        (the single-process tensor)
    full  = its vocabulary rows cut or zero-extended to the model's padded vocabulary
            (rows past the true vocabulary are zero and never read: the embedding is never
            looked up there and the loss never sees their logits)
    piece = the n-way split of full along partition_dim, this rank's part
"""
import numpy as np

from rapidgpt.parallel.fully_sharded import slot_name, whole_parameters


def tensor_parallel_layout(model, names):
    """{name: [partition_dim, vocab_rows]} for the tensors among `names` that are split over TP
    ranks: the model's parameters declared by the TP layers (`param_inits`, see
    rapidgpt.parallel.layers), and optimizer state named after them. A parameter flagged
    `tensor_model_parallel` whose split is not declared gets `[None, None]`: it cannot be resharded."""
    by_param = {}
    for _, cell in model.cells_and_names():
        for attr, spec in getattr(cell, "param_inits", {}).items():
            name = slot_name(cell, attr)              # (a ZeRO-3 model holds pieces of it)
            if name is not None and spec.partition_dim is not None:
                by_param[name] = [spec.partition_dim, spec.drawn_rows]
    model_names = set(whole_parameters(model))
    for param in model.get_parameters():
        if getattr(param, "tensor_model_parallel", False):
            by_param.setdefault(param.name, [None, None])
    layout = {}
    for name in names:
        owner = name.split(".", 1)[-1] if name not in model_names else name    # adam_m.<param>, ...
        if owner in by_param:
            layout[name] = by_param[owner]
    return layout


def merge_shards(name, pieces, spec):
    """The full tensor `name` from the TP ranks' `pieces` (in TP-rank order)."""
    if spec is None or len(pieces) == 1:
        return pieces[0]                                    # replicated, or saved whole
    if spec[0] is None:
        raise ValueError(f"{name} is split over tensor-parallel ranks along an undeclared dimension "
                         f"(declare it in its cell's param_inits); it cannot be resharded")
    return np.concatenate(pieces, axis=spec[0])


def split_for_rank(name, full, spec, local_shape, rank, size):
    """This rank's piece (TP rank `rank` of `size`) of the full tensor, for a parameter whose piece
    has `local_shape`; vocabulary rows are fitted to the padding that shape implies."""
    if spec is None:
        return full
    dim, vocab_rows = spec
    rows = local_shape[0] * size
    if vocab_rows and full.shape[0] != rows:
        fitted = np.zeros((rows,) + full.shape[1:], full.dtype)
        kept = min(rows, full.shape[0])
        fitted[:kept] = full[:kept]
        full = fitted
    if full.shape[dim] % size:
        raise ValueError(f"{name}: dimension {dim} of size {full.shape[dim]} cannot be split over "
                         f"{size} tensor-parallel ranks")
    return np.split(full, size, axis=dim)[rank]
