"""Packaging for RapidGPT: the `rapidgpt` library and its console script."""
import re
from pathlib import Path

from setuptools import find_packages, setup

VERSION = re.search(r'__version__ = "([^"]+)"',
                    (Path(__file__).parent / "rapidgpt" / "__init__.py").read_text()).group(1)

setup(
    name="rapidgpt",
    version=VERSION,
    description="Megatron-style white-box LLM trainer template library on MindSpore",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["rapidgpt", "rapidgpt.*"]),
    install_requires=[
        "mindspore==2.10.0",
        "numpy<2",          # MindSpore 2.10's compiled modules break with numpy 2.x
        "regex",            # GPT-2's pre-tokenization pattern needs \p{L}/\p{N}
        "tqdm",
        "tensorboardX",
        "nltk",             # Punkt, the sentence splitter of preprocess_data.py --split-sentences (as Megatron's)
        "psutil",           # the launcher finds msrun's workers and stops the job (also a MindSpore dependency)
        "decorator",        # MindSpore's kernel compiler (AKG) imports it: graph kernel fusion on CPU (also needs g++)
        "tokenizers",       # --tokenizer-type HuggingFaceTokenizer reads tokenizer.json with it (and the tests
                            # check our GPT-2 byte-level BPE against it)
        "pyyaml",           # Megatron's distillation settings and teacher model config (--export-kd-*) are YAML
        "jinja2",           # --sft renders the model's chat template as transformers' apply_chat_template does
    ],
    extras_require={
        # torch: the Megatron-LM checkpoint tests (the CPU build 2.13.0 lies on the CI machines' disk).
        # pytest < 9.2: pytest 9.2 derives a test's node id from a structured id, so pytest-xdist 3.8's
        # --dist loadgroup (make test), which appends the group to `_nodeid`, groups nothing there.
        "test": ["pytest<9.2", "pytest-xdist", "sentencepiece", "tiktoken", "torch==2.13.0"],
        # data_tools/convert_megatron.py reads Megatron-LM's torch checkpoints with it (not Megatron itself).
        "megatron": ["torch"],
        # --tokenizer-type GPTSentencePieceTokenizer / Llama2Tokenizer (a tokenizer.model file).
        "sentencepiece": ["sentencepiece"],
        # --tokenizer-type TikTokenizer (a tiktoken vocabulary .json).
        "tiktoken": ["tiktoken"],
        # --wandb-project (Weights & Biases logging).
        "wandb": ["wandb"],
        # Only benchmarks/bench_pretrain.py's PyTorch eager side; never imported by rapidgpt.
        "bench": ["torch==2.13.0"],
    },
    entry_points={"console_scripts": ["rapidgpt = rapidgpt.cli:main"]},
)
