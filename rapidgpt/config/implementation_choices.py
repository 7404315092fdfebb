"""Megatron-LM and Rapidformer flags that choose an implementation RapidGPT does not have a second
of: accepted, so existing command lines run, each with one start-up line saying what it means
here (`implementation_choice_lines`). None of them changes a number the run computes.
"""

# flag -> (argparse keyword arguments, what the flag means on this backend)
CHOICES = {
    "--use-mcore-models": (
        dict(action="store_true"),
        "the built-in GPT is RapidGPT's equivalent of Megatron-core's GPTModel; there is no legacy model"),
    "--transformer-impl": (
        dict(choices=["local", "transformer_engine", "inference_optimized"], default=None),
        "the layers are RapidGPT's own MindSpore implementation (there is no Transformer Engine)"),
    "--attention-backend": (
        dict(choices=["auto", "flash", "fused", "unfused", "local"], default=None),
        "attention is RapidGPT's softmax attention, compiled and fused by MindSpore"),
    "--cross-entropy-loss-fusion": (
        dict(action="store_true"),
        "the loss is part of the compiled step, whose kernels MindSpore fuses"),
    "--manual-gc": (
        dict(action="store_true"),
        "the step is one compiled graph; Python's garbage collector does not run inside it"),
    "--empty-unused-memory-level": (
        dict(type=int, choices=[0, 1, 2], default=0),
        "MindSpore's runtime manages its memory pool; there is no allocator cache to empty"),
    "--distributed-backend": (
        dict(choices=["nccl", "gloo", "hccl", "ccl"], default=None),
        "collectives use MindSpore's communication for the device (HCCL on Ascend, NCCL on GPU, its own "
        "collectives on CPU)"),
    "--overlap-grad-reduce": (
        dict(action="store_true"),
        "the step is one compiled graph whose runtime schedules its gradient all-reduces or reduce-scatters; "
        "they are not issued by hand during the backward, and the numbers are the same"),
    "--overlap-param-gather": (
        dict(action="store_true"),
        "ZeRO's parameter all-gathers run inside the compiled step, scheduled by MindSpore's runtime; the "
        "numbers are the same"),
    "--onnx-runtime-training": (
        dict(action="store_true"),
        "RapidGPT always compiles the training step (mindspore.jit), the role ONNX Runtime training plays in "
        "Rapidformer"),
}


def _dest(flag):
    return flag.lstrip("-").replace("-", "_")


def add_implementation_choice_args(parser):
    g = parser.add_argument_group("accepted implementation choices (one start-up line each says what they mean here)")
    for flag, (kwargs, meaning) in CHOICES.items():
        g.add_argument(flag, help=f"accepted: {meaning}", **kwargs)


def implementation_choice_lines(args):
    """One info line for each of these flags the command line gave."""
    return [f" > {flag}: accepted; {meaning}" for flag, (kwargs, meaning) in CHOICES.items()
            if getattr(args, _dest(flag), None) not in (None, False, kwargs.get("default"))]
