"""Parallel building blocks: layout (state), layers, seeded initialisation and dropout."""
from rapidgpt.parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from rapidgpt.parallel.random import Dropout
from rapidgpt.parallel.state import ParallelState, get_parallel_state

__all__ = ["ColumnParallelLinear", "Dropout", "RowParallelLinear", "VocabParallelEmbedding", "ParallelState",
           "get_parallel_state"]
