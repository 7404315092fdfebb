"""Megatron's checks that the copies of a weight the ranks hold are still the same, bit for bit:
- `--test-mode` (Megatron's real-time test, its attention's `run_realtime_tests`): the q/k norm
  weights of every attention layer (--qk-layernorm), which each tensor-parallel rank holds whole
  for its own heads and each data-parallel rank holds too, after every iteration; with multi-latent
  attention also its down projections and latent norms, which every tensor-parallel rank holds whole;
- `--check-weight-hash-across-dp-replicas-interval N`: every model weight, across the
  data-parallel ranks, every N iterations.
A difference (a silent hardware fault, a reduction that missed a rank) stops the run with one line
naming the weight, the iteration and the ranks. Megatron compares at each forward; the weights
change only in the update, so once per iteration, after it, finds the same differences.

How: each rank hashes each compared weight (32 bits of its SHA-256) and the hashes of every rank
meet in one host-side gather (rapidgpt.parallel.comm.gather_over_ranks); ranks that hold copies of
the same weights (the same pipeline stage; under ZeRO-3, whose data-parallel ranks hold different
pieces, also the same data-parallel rank) must agree. The flags: rapidgpt/config/replica_checks.py.
"""
import hashlib

import numpy as np

from rapidgpt.errors import UserError
from rapidgpt.parallel.comm import gather_over_ranks


# The attention weights every tensor-parallel rank holds whole: the q/k norms, and multi-latent
# attention's down projections and latent norms (rapidgpt/models/mla.py).
Q_K_NORMS = (".q_layernorm.", ".k_layernorm.")
LATENT_WEIGHTS = (".kv_layernorm.", ".linear_q_down_proj.", ".linear_kv_down_proj.")


class ReplicaMismatchError(UserError, RuntimeError):
    """Copies of a weight that should be the same are not."""


def _hash_words(param):
    """32 bits of the SHA-256 of a weight's bytes, as two float32 values (exact: each below 2^16)."""
    digest = hashlib.sha256(np.ascontiguousarray(param.asnumpy()).tobytes()).digest()
    return [float(int.from_bytes(digest[0:2], "little")), float(int.from_bytes(digest[2:4], "little"))]


def first_mismatch(rows, group_of):
    """(weight index, rank a, rank b) of the first weight whose hashes differ between two ranks of
    one group, or None. `rows[r]`: rank r's two hash words per weight; `group_of(r)`: its group's key."""
    first = {}
    for rank, row in enumerate(rows):
        other = first.setdefault(group_of(rank), rank)
        differs = np.nonzero(rows[other] != row)[0]
        if differs.size:
            return int(differs[0]) // 2, other, rank
    return None


class ReplicaChecks:
    """`after_iteration(iteration)` runs the checks the flags ask for; `describe()` is the start-up line."""

    def __init__(self, args, model, state):
        self.test_mode = args.test_mode
        self.interval = args.check_weight_hash_across_dp_replicas_interval
        self.state, self.zero3 = state, args.zero.stage == 3
        params = list(model.get_parameters())
        self.norms = [p for p in params if any(key in p.name for key in Q_K_NORMS + LATENT_WEIGHTS)]
        self.what = ("q/k norm weights" if not any(key in p.name for p in self.norms for key in LATENT_WEIGHTS)
                     else "q/k norm weights and multi-latent attention's latent weights")
        self.weights = params

    def describe(self):
        lines = []
        if self.test_mode:
            lines.append(f" > --test-mode: after every iteration, the {len(self.norms)} {self.what} of this rank are "
                         f"compared with every tensor- and data-parallel rank's" if self.norms else
                         " > --test-mode: the model has no q/k norm weights (--qk-layernorm) to compare")
        if self.interval:
            lines.append(f" > every {self.interval} iterations, every model weight is compared with each "
                         f"data-parallel rank's")
        return lines

    def after_iteration(self, iteration):
        if self.test_mode and self.norms:
            self._compare(self.norms, iteration, "--test-mode", "attention weight",
                          lambda r: self.state.coordinates(r)[1:] if self.zero3 else self.state.coordinates(r)[2])
        if self.interval and iteration % self.interval == 0:
            self._compare(self.weights, iteration, "--check-weight-hash-across-dp-replicas-interval", "weight",
                          lambda r: (self.state.coordinates(r)[0], self.state.coordinates(r)[2]))

    def _compare(self, params, iteration, flag, kind, group_of):
        words = [w for p in params for w in _hash_words(p)]
        width = int(gather_over_ranks([len(words)]).max())       # pipeline stages hold different weights
        rows = gather_over_ranks(words + [0.0] * (width - len(words)))
        mismatch = first_mismatch(rows, group_of)
        if mismatch is not None:         # every rank stops; those of the group name the weight
            index, a, b = mismatch
            name = params[index].name if group_of(self.state.rank) == group_of(a) else f"number {index}"
            raise ReplicaMismatchError(f"{flag}: at iteration {iteration} the {kind} {name} differs between ranks {a} "
                                       f"and {b}, which hold copies of it (a hardware fault, or a reduction that "
                                       f"missed a rank); the run stops here")
