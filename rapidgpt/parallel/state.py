"""The parallel layout: one object that owns TP x PP x DP and every rank's coordinates.

Ranks are laid out as Megatron lays them out, tensor-parallel fastest, then data-parallel,
then pipeline: `rank = tp_rank + tp * (dp_rank + dp * pp_rank)`. So the TP group of a rank is a
block of consecutive ranks (the cheapest links), and a pipeline stage is a block of tp*dp ranks.
The layout is validated against the world size once, when it is built; every other module asks
it (through the Megatron-style accessors below) instead of redoing rank math.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelState:
    world_size: int = 1
    rank: int = 0
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1

    def __post_init__(self):
        tp, pp = self.tensor_model_parallel_size, self.pipeline_model_parallel_size
        if tp < 1 or pp < 1 or self.world_size % (tp * pp):
            raise ValueError(
                f"world size {self.world_size} is not divisible by --tensor-model-parallel-size {tp} "
                f"x --pipeline-model-parallel-size {pp}; choose sizes whose product divides the "
                f"number of processes")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    @property
    def data_parallel_size(self):
        return self.world_size // (self.tensor_model_parallel_size * self.pipeline_model_parallel_size)

    def coordinates(self, rank=None):
        """(tp_rank, dp_rank, pp_rank) of `rank` (default: this process)."""
        rank = self.rank if rank is None else rank
        tp, dp = self.tensor_model_parallel_size, self.data_parallel_size
        return rank % tp, (rank // tp) % dp, rank // (tp * dp)

    def rank_of(self, tp_rank, dp_rank, pp_rank):
        tp, dp = self.tensor_model_parallel_size, self.data_parallel_size
        return tp_rank + tp * (dp_rank + dp * pp_rank)

    def tensor_parallel_ranks(self, rank=None):
        """The ranks of `rank`'s TP group, in TP-rank order."""
        _, dp_rank, pp_rank = self.coordinates(rank)
        return [self.rank_of(t, dp_rank, pp_rank) for t in range(self.tensor_model_parallel_size)]

    def data_parallel_ranks(self, rank=None):
        tp_rank, _, pp_rank = self.coordinates(rank)
        return [self.rank_of(tp_rank, d, pp_rank) for d in range(self.data_parallel_size)]

    def pipeline_parallel_ranks(self, rank=None):
        tp_rank, dp_rank, _ = self.coordinates(rank)
        return [self.rank_of(tp_rank, dp_rank, p) for p in range(self.pipeline_model_parallel_size)]

    def model_parallel_ranks(self, rank=None):
        """The ranks holding one copy of the whole model (all TP and PP ranks of `rank`'s DP rank):
        the gradient norm and the overflow decision are summed over them."""
        _, dp_rank, _ = self.coordinates(rank)
        return [self.rank_of(t, dp_rank, p) for p in range(self.pipeline_model_parallel_size)
                for t in range(self.tensor_model_parallel_size)]

    def embedding_ranks(self, rank=None):
        """The first and last pipeline stages of `rank`'s pipeline (they both hold the tied word
        embeddings: input on the first, output layer on the last); one rank without PP. Middle
        stages are not members."""
        ranks = self.pipeline_parallel_ranks(rank)
        return sorted({ranks[0], ranks[-1]})

    def pipeline_pairs(self, rank=None):
        """(previous, next) neighbour pairs of `rank`'s stage as rank lists in stage order, None
        at the pipeline's ends."""
        ranks, pp_rank = self.pipeline_parallel_ranks(rank), self.coordinates(rank)[2]
        prev = ranks[pp_rank - 1:pp_rank + 1] if pp_rank > 0 else None
        nxt = ranks[pp_rank:pp_rank + 2] if pp_rank < len(ranks) - 1 else None
        return prev, nxt

    def pipeline_wrap_pair(self, rank=None):
        """The last and first stages of `rank`'s pipeline (in rank order), which the interleaved
        schedule's ring joins (the last stage's chunk v feeds the first stage's chunk v + 1); None
        for a rank between them or without pipeline stages."""
        ranks = self.pipeline_parallel_ranks(rank)
        rank = self.rank if rank is None else rank
        return sorted({ranks[0], ranks[-1]}) if len(ranks) > 1 and rank in (ranks[0], ranks[-1]) else None


_STATE = ParallelState()
# This rank's communication groups (rapidgpt.parallel.comm.Group, None for a group of one),
# created once by the engine from the layout above.
_GROUP_NAMES = ("tensor", "data", "pipeline", "model", "embedding", "pipeline_prev", "pipeline_next",
                "pipeline_wrap")
_GROUPS = dict.fromkeys(_GROUP_NAMES)


def initialize_parallel_state(state, groups=None):
    global _STATE
    _STATE = state
    _GROUPS.update(dict.fromkeys(_GROUP_NAMES))
    _GROUPS.update(groups or {})


def get_parallel_state():
    return _STATE


def get_tensor_model_parallel_group():
    return _GROUPS["tensor"]


def get_data_parallel_group():
    return _GROUPS["data"]


def get_pipeline_model_parallel_group():
    return _GROUPS["pipeline"]


def get_model_parallel_group():
    """All TP x PP ranks of this DP rank (one copy of the model)."""
    return _GROUPS["model"]


def get_embedding_group():
    """The first and last pipeline stages (Megatron's embedding group); None without PP."""
    return _GROUPS["embedding"]


def get_pipeline_neighbour_groups(ring=False):
    """(the 2-rank group with the previous stage, with the next stage), None at the ends; with
    `ring` (the interleaved schedule) the first and last stages' group closes the ring instead."""
    prev, nxt = _GROUPS["pipeline_prev"], _GROUPS["pipeline_next"]
    if ring:
        first, last = is_pipeline_first_stage(), is_pipeline_last_stage()
        prev, nxt = (_GROUPS["pipeline_wrap"] if first else prev), (_GROUPS["pipeline_wrap"] if last else nxt)
    return prev, nxt


def get_tensor_model_parallel_world_size():
    return _STATE.tensor_model_parallel_size


def get_tensor_model_parallel_rank():
    return _STATE.coordinates()[0]


def get_data_parallel_world_size():
    return _STATE.data_parallel_size


def get_data_parallel_rank():
    return _STATE.coordinates()[1]


def get_pipeline_model_parallel_world_size():
    return _STATE.pipeline_model_parallel_size


def get_pipeline_model_parallel_rank():
    return _STATE.coordinates()[2]


def is_pipeline_first_stage():
    return get_pipeline_model_parallel_rank() == 0


def is_pipeline_last_stage():
    return get_pipeline_model_parallel_rank() == _STATE.pipeline_model_parallel_size - 1
