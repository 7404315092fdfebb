"""Megatron-LM and Rapidformer flags that choose an implementation RapidGPT does not have a second
of: accepted, so existing command lines run, each with one start-up line saying what it means
here (`implementation_choice_lines`). None of them changes a number the run computes. The same for
a few values of flags RapidGPT has (VALUE_CHOICES, e.g. `--ckpt-format torch_dist`), which become
RapidGPT's own value, and for `--context-parallel-size 1` (context parallelism itself is refused).
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
    "--no-create-attention-mask-in-dataloader": (
        dict(action="store_true"),
        "the data loader never builds an attention mask: the model makes the causal mask itself (a shared "
        "constant, or computed per forward for long contexts)"),
    "--no-mmap-bin-files": (
        dict(action="store_true"),
        "the .bin token files are memory-mapped (numpy memmap), which reads the same tokens as reading them "
        "whole"),
    "--profile": (
        dict(action="store_true"),
        "Megatron's --profile brackets --profile-step-start..--profile-step-end for NVIDIA Nsight Systems "
        "(cudaProfilerStart/Stop); there is no such profiler hook on this backend, so nothing is recorded"),
    "--profile-step-start": (dict(type=int, default=10), "see --profile"),
    "--profile-step-end": (dict(type=int, default=12), "see --profile"),
    "--openai-gelu": (
        dict(action="store_true"),
        "Megatron-core's models ignore it too (its arguments set no activation from it): the MLP's GELU is "
        "the tanh form with --bias-gelu-fusion and biases, else the exact one, as here"),
    "--onnx-runtime-training": (
        dict(action="store_true"),
        "RapidGPT always compiles the training step (mindspore.jit), the role ONNX Runtime training plays in "
        "Rapidformer"),
}


# (flag, value) -> (RapidGPT's value it becomes, what it means here)
VALUE_CHOICES = {
    ("--ckpt-format", "torch_dist"): (
        "ckpt", "Megatron's distributed checkpoint loads at any TP/PP/DP; RapidGPT's own checkpoints do too "
                "(MindSpore .ckpt files per rank plus a layout record), so they are written; they are not "
                "PyTorch Distributed Checkpoint files"),
    ("--ckpt-format", "fsdp_dtensor"): (
        "ckpt", "Megatron-FSDP's DTensor checkpoint loads at any layout; RapidGPT's own checkpoints do too, whatever "
                "the ZeRO stage (MindSpore .ckpt files per rank plus a layout record), so they are written"),
    ("--ckpt-format", "torch"): (
        "ckpt", "Megatron's legacy per-rank torch.save files; RapidGPT writes its own layout-free checkpoints "
                "(MindSpore .ckpt files per rank plus a layout record) instead"),
}


# (flag, value) -> why Megatron's value is refused: a value the flag's choices must not answer with
# "not one of the choices" (a Megatron command line meets a reason instead).
REFUSED_VALUES = {
    ("--ckpt-format", "torch_dcp"): "PyTorch DCP checkpoints (Megatron's FSDP2 format) are not written; RapidGPT's "
                                    "own checkpoints load at any layout: use torch_dist (or ckpt)",
}


def _dest(flag):
    return flag.lstrip("-").replace("-", "_")


def values_of(flag, own):
    """The --flag choices: RapidGPT's `own` values, then Megatron's values of VALUE_CHOICES and
    REFUSED_VALUES (refused by the check, with the reason)."""
    return [*own, *(value for (name, value) in [*VALUE_CHOICES, *REFUSED_VALUES] if name == flag)]


def add_implementation_choice_args(parser):
    g = parser.add_argument_group("accepted implementation choices (one start-up line each says what they mean here)")
    for flag, (kwargs, meaning) in CHOICES.items():
        g.add_argument(flag, help=f"accepted: {meaning}", **kwargs)
    g.add_argument("--context-parallel-size", type=int, default=1,
                   help="accepted at 1; Megatron's context parallelism (the sequence split over ranks inside "
                        "attention) is not built, so a larger size is refused")


def check_implementation_choice_args(args, check):
    """Refuse what has no equivalent here; turn the accepted values of VALUE_CHOICES into RapidGPT's
    own, remembering which were given (for `implementation_choice_lines`)."""
    check.require(args.context_parallel_size == 1,
                  f"--context-parallel-size: {args.context_parallel_size} is refused: context parallelism (the "
                  f"sequence split over ranks inside attention) is not built; use 1, or --sequence-parallel with "
                  f"tensor parallelism to split activations along the sequence")
    for (flag, value), reason in REFUSED_VALUES.items():
        check.require(getattr(args, _dest(flag), None) != value, f"{flag} {value}: refused: {reason}")
    args.accepted_values = list(getattr(args, "accepted_values", ()))      # validated twice: kept
    for (flag, value), (own, _) in VALUE_CHOICES.items():
        if getattr(args, _dest(flag), None) == value:
            setattr(args, _dest(flag), own)
            args.accepted_values.append((flag, value))


def implementation_choice_lines(args):
    """One info line for each of these flags (and accepted values) the command line gave."""
    return ([f" > {flag}: accepted; {meaning}" for flag, (kwargs, meaning) in CHOICES.items()
             if getattr(args, _dest(flag), None) not in (None, False, kwargs.get("default"))]
            + [f" > {flag} {value}: accepted; {VALUE_CHOICES[flag, value][1]}"
               for flag, value in getattr(args, "accepted_values", ())]
            + list(getattr(args, "megatron_flag_lines", ())))      # rapidgpt/config/megatron_flags.py
