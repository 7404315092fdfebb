"""RapidGPT: a Megatron-style white-box LLM trainer template library on MindSpore.

    from rapidgpt import RapidGPTEngine, Pretrainer, Finetuner, get_args, next_batch
    model = rapidgpt.load_pretrained(path)    # built-in GPT + weights (RapidGPT or HF GPT-2 folder)

Names are imported on first use, so data tools that only need `rapidgpt.data` do not pay for
importing MindSpore.
"""
import importlib

from rapidgpt.config.kernel_fusion import set_openmp_environment
from rapidgpt.mindspore_logs import route_records_of_this_process

# Before anything imports MindSpore, which reads both once when it loads.
set_openmp_environment()           # rapidgpt/config/kernel_fusion.py
route_records_of_this_process()    # MindSpore's log records into files (rapidgpt/mindspore_logs.py)

__version__ = "0.1.0"

_EXPORTS = {
    "RapidGPTEngine": "rapidgpt.engine",
    "Pretrainer": "rapidgpt.training.pretrainer",
    "next_batch": "rapidgpt.training.pretrainer",
    "Finetuner": "rapidgpt.training.finetuner",
    "get_args": "rapidgpt.global_vars",
    "get_logger": "rapidgpt.global_vars",
    "get_timers": "rapidgpt.global_vars",
    "get_tokenizer": "rapidgpt.global_vars",
    "get_tensorboard_writer": "rapidgpt.global_vars",
    "load_pretrained": "rapidgpt.pretrained",
}
__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rapidgpt' has no attribute {name!r}")
