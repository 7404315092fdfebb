"""Typed configuration per concern, built once from the flags (Megatron-core's config objects).

Each module holds its feature's flags, their defaults and their validation, and imports no
MindSpore at import time: the command line is checked before MindSpore loads.
"""
