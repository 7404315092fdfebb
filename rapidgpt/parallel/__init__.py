"""Parallel building blocks: layout (state), tensor-parallel layers and loss, seeded initialisation
and dropout. Collectives: rapidgpt.parallel.comm; checkpoint resharding: rapidgpt.parallel.resharding."""
from rapidgpt.parallel.cross_entropy import VocabParallelCrossEntropy
from rapidgpt.parallel.layers import (ColumnParallelLinear, ReplicatedLinear, RowParallelLinear,
                                      VocabParallelEmbedding)
from rapidgpt.parallel.random import Dropout
from rapidgpt.parallel.state import ParallelState, get_parallel_state

__all__ = ["ColumnParallelLinear", "Dropout", "ReplicatedLinear", "RowParallelLinear", "VocabParallelCrossEntropy",
           "VocabParallelEmbedding", "ParallelState", "get_parallel_state"]
