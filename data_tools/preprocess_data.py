#!/usr/bin/env python
"""Megatron-compatible preprocessing: jsonl/text -> {prefix}_{key}_document.bin/.idx.

Same flags as Megatron-LM's tools/preprocess_data.py; see rapidgpt/data/preprocess.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rapidgpt.data.preprocess import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
