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


_STATE = ParallelState()
# This rank's communication groups (rapidgpt.parallel.comm.Group, None for a group of one),
# created once by the engine from the layout above.
_GROUPS = {"tensor": None, "data": None, "pipeline": None}


def initialize_parallel_state(state, groups=None):
    global _STATE
    _STATE = state
    _GROUPS.update(groups or {"tensor": None, "data": None, "pipeline": None})


def get_parallel_state():
    return _STATE


def get_tensor_model_parallel_group():
    return _GROUPS["tensor"]


def get_data_parallel_group():
    return _GROUPS["data"]


def get_pipeline_model_parallel_group():
    return _GROUPS["pipeline"]


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
