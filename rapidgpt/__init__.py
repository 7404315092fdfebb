"""RapidGPT: a Megatron-style white-box LLM trainer template library on MindSpore."""

__version__ = "0.1.0"
