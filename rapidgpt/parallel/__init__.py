"""Parallel building blocks: layout (state), layers, seeded initialisation."""
from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from rapidgpt.parallel.state import ParallelState, get_parallel_state

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelState",
           "get_parallel_state"]
