"""Every command-line flag, under its Megatron-LM / Rapidformer name, and their validation.

`parse_args(extra_args_provider, argv)` builds the parser (groups: model, batch, optimizer,
learning rate, data, checkpoint, logging, engine, parallel, precision, recompute), lets a user
script add its own flags, parses, then validates everything once: each problem is reported as
one message that names the flag and the fix, and the program exits with status 2 before any
work starts. Derived values (padded vocabulary, data-parallel size, micro-batches per step,
...) are filled in here so that every other module reads one settled namespace.
"""
import argparse
import math
import os
import sys

from rapidgpt.data.gpt_dataset import parse_split
from rapidgpt.parallel.comm import launched_by_msrun, launched_world_size

TASKS = ("pretraining", "text_generation", "sequence_classification")
DEVICES = ("cpu", "gpu", "ascend")


class ArgumentError(ValueError):
    """A flag (or combination of flags) that cannot work; the message says which and what to do."""


def _model_args(parser):
    g = parser.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--num-attention-heads", type=int, default=4)
    g.add_argument("--ffn-hidden-size", type=int, default=None, help="default: 4 * hidden size")
    g.add_argument("--seq-length", type=int, default=128)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: seq length")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size when no tokenizer is given (token ids must be below it)")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the embedding rows to a multiple of this (times TP size) for speed; "
                        "padded rows never take part in the loss or the returned logits")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--layernorm-epsilon", type=float, default=1e-5)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="separate output layer instead of reusing the word embeddings")


def _batch_args(parser):
    g = parser.add_argument_group("batch and length")
    g.add_argument("--micro-batch-size", type=int, default=8)
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="samples per optimizer step; default micro batch x data-parallel size. "
                        "Larger values accumulate gradients over several micro-batches")
    g.add_argument("--train-iters", type=int, default=None)
    g.add_argument("--train-samples", type=int, default=None)
    g.add_argument("--epochs", type=int, default=None, help="finetuning: passes over the train set")


def _finetuning_args(parser):
    g = parser.add_argument_group("finetuning")
    g.add_argument("--num-classes", type=int, default=None,
                   help="sequence classification: number of labels (default: as many as the training "
                        "data has; if given, it must match)")
    g.add_argument("--best-metric", default=None,
                   help="validation metric (higher is better) that picks the checkpoint kept under "
                        "SAVE/best/; default: the first one run_compute_metrics returns (accuracy "
                        "for --task sequence_classification)")
    # A classifier's label names, class id = index: set from the training data, recorded in
    # checkpoints and restored from them (rapidgpt/data/classification.py). No flag.
    parser.set_defaults(labels=None)


def _optimizer_args(parser):
    g = parser.add_argument_group("optimizer")
    g.add_argument("--optimizer", choices=["adam", "sgd"], default="adam",
                   help="adam = AdamW (decoupled weight decay, bias-corrected, as Megatron)")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--sgd-momentum", type=float, default=0.9)
    g.add_argument("--clip-grad", type=float, default=1.0, help="global grad-norm clip; 0 disables")
    g = parser.add_argument_group("learning rate")
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "inverse-square-root"],
                   default="linear")
    g.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    g.add_argument("--lr-decay-samples", type=int, default=None)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-samples", type=int, default=0)
    g.add_argument("--lr-warmup-fraction", type=float, default=None)


def _data_args(parser):
    g = parser.add_argument_group("data and tokenizer")
    g.add_argument("--data-path", nargs="*", default=None,
                   help="PREFIX, or weighted 'W1 PREFIX1 W2 PREFIX2 ...'; none: the demo corpus. "
                        "sequence_classification: the training .jsonl/.tsv file(s)")
    g.add_argument("--split", default="969, 30, 1")
    g.add_argument("--train-data-path", "--train-data", dest="train_data_path", nargs="*", default=None)
    g.add_argument("--valid-data-path", "--valid-data", dest="valid_data_path", nargs="*", default=None,
                   help="sequence_classification: the validation .jsonl/.tsv file(s)")
    g.add_argument("--test-data-path", nargs="*", default=None)
    g.add_argument("--data-cache-path", default=None)
    g.add_argument("--data-impl", "--dataset-impl", dest="data_impl", choices=["mmap", "infer"],
                   default="mmap", help="accepted for compatibility; Megatron's mmap format is read")
    g.add_argument("--tokenizer-type", default=None,
                   choices=["GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase"])
    g.add_argument("--vocab-file", default=None)
    g.add_argument("--merge-file", default=None)
    g.add_argument("--eod-mask-loss", action="store_true")
    g.add_argument("--reset-position-ids", action="store_true")
    g.add_argument("--reset-attention-mask", action="store_true")
    g.add_argument("--num-workers", type=int, default=2, help="background threads preparing batches")
    g.add_argument("--seed", type=int, default=1234)


# Flags whose feature arrives in a later release. They parse (so a Megatron launch script reads
# without surprises) and any non-default value is refused with this explanation.
NOT_YET = {
    "this build has tensor and data parallelism; pipeline and sequence parallelism arrive in a "
    "later release": [
        ("--pipeline-model-parallel-size", 1),
        ("--num-layers-per-virtual-pipeline-stage", None), ("--sequence-parallel", False)],
    "ZeRO optimizer sharding arrives with the ZeRO release": [
        ("--use-distributed-optimizer", False), ("--zero-1-memory-optimization", False),
        ("--zero-2-memory-optimization", False), ("--zero-3-memory-optimization", False)],
    "mixed precision arrives with the precision release; this build trains in fp32": [
        ("--fp16", False), ("--bf16", False), ("--mixed-precision", False), ("--loss-scale", None),
        ("--initial-loss-scale", None), ("--min-loss-scale", None), ("--loss-scale-window", None),
        ("--hysteresis", None)],
    "activation recompute arrives with the recompute release": [
        ("--recompute-granularity", None), ("--recompute-method", None),
        ("--recompute-num-layers", None), ("--checkpoint-activations", False)],
}


def _parallel_args(parser):
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="split every layer's matrices over this many ranks (Megatron TP); the data-"
                        "parallel size is the number of processes / (TP x PP)")


def _launcher_args(parser):
    g = parser.add_argument_group(
        "launching several processes",
        "With more than one process, rapidgpt starts them itself through MindSpore's msrun (each "
        "runs this same command line), shows rank 0's output, keeps every rank's log under "
        "--log-dir, and stops the job when a rank fails. Defaults come from the variables "
        "Megatron/Rapidformer launch scripts export; torchrun's spellings (--nproc_per_node, ...) "
        "are accepted")
    g.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="processes (ranks) on this node, one per device")
    g.add_argument("--nnodes", type=int, default=os.environ.get("NNODES", "1"),
                   help="number of nodes (default: $NNODES, else 1); the world size is "
                        "nproc-per-node x nnodes")
    g.add_argument("--node-rank", "--node_rank", type=int, default=os.environ.get("NODE_RANK", "0"),
                   help="this node's index, 0 .. nnodes-1 (default: $NODE_RANK, else 0)")
    g.add_argument("--master-addr", "--master_addr", default=os.environ.get("MASTER_ADDR"),
                   help="address of node 0, where msrun's scheduler runs (default: $MASTER_ADDR; "
                        "on one node 127.0.0.1)")
    g.add_argument("--master-port", "--master_port", type=int, default=os.environ.get("MASTER_PORT"),
                   help="the scheduler's port on node 0 (default: $MASTER_PORT; on one node a free port)")


def _reserved_args(parser):
    g = parser.add_argument_group("not in this build (refused with an explanation if used)")
    for flags in NOT_YET.values():
        for flag, default in flags:
            if isinstance(default, bool):
                g.add_argument(flag, action="store_true")
            else:
                g.add_argument(flag, type=int if isinstance(default, int) else str, default=default)


def _checkpoint_args(parser):
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, help="directory for checkpoints (Megatron layout)")
    g.add_argument("--save-interval", type=int, default=None, help="save every this many iterations")
    g.add_argument("--load", default=None, help="resume from the latest complete checkpoint here; "
                   "model flags not given are taken from the checkpoint")
    g.add_argument("--no-save-optim", action="store_true", help="save weights only")
    g.add_argument("--no-save-rng", action="store_true")
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--finetune", action="store_true",
                   help="load weights only and start at iteration 0 with a fresh optimizer")
    g.add_argument("--pretrained-checkpoint", default=None, metavar="DIR",
                   help="finetuning: when --load holds no checkpoint yet (or is not given), start from "
                        "the model weights of this checkpoint (no optimizer, scheduler, iteration or "
                        "RNG); model flags not given are taken from it. Parameters it lacks (e.g. a "
                        "classification head) are freshly initialised; both they and its unused "
                        "tensors are listed in the log")
    g.add_argument("--exit-interval", type=int, default=None,
                   help="save and exit when the iteration is a multiple of this")
    g.add_argument("--exit-duration-in-mins", type=float, default=None,
                   help="save and exit once training has run this long")
    g.add_argument("--ckpt-format", choices=["ckpt", "safetensors"], default="ckpt")
    g.add_argument("--keep-last-n-checkpoints", type=int, default=None,
                   help="delete older checkpoints once a newer one is complete")
    g.add_argument("--skip-train", action="store_true", help="with --load: only evaluate")
    g.add_argument("--override-opt_param-scheduler", dest="override_opt_param_scheduler",
                   action="store_true", help="on --load, keep this run's LR schedule flags instead of "
                   "requiring the checkpoint's (e.g. after changing --train-iters)")


def _logging_args(parser):
    g = parser.add_argument_group("logging and evaluation")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--tensorboard-log-interval", type=int, default=1)
    g.add_argument("--log-dir", default=None,
                   help="also write each rank's log lines to LOG_DIR/rank_N.log. With several processes "
                        "LOG_DIR also keeps msrun's worker_N.log (everything rank N printed), "
                        "scheduler.log and msrun_nodeR.log; default then: ./rapidgpt_logs/DATE-TIME")
    g.add_argument("--no-progress-bar", action="store_true", help="no tqdm bar (e.g. in CI logs)")


def _engine_args(parser):
    g = parser.add_argument_group("engine")
    g.add_argument("--user-script", default=None, help="Python file with your Pretrainer/Finetuner")
    g.add_argument("--task", choices=TASKS, default=None, help="black-box task, no user file")
    g.add_argument("--device", choices=DEVICES, default=None, help="default: the best available")
    g.add_argument("--no-jit", dest="jit", action="store_false",
                   help="run the step eagerly (PyNative) instead of compiling it: 2-3x slower, "
                        "but any Python works inside run_forward_step")
    g.add_argument("--cpu-threads", type=int, default=None, help="MindSpore CPU threads per process (default: this node's cores divided by its processes)")
    g.add_argument("--prompt", default=None, help="text to continue (text_generation; after pretraining)")
    g.add_argument("--prompts-file", default=None, help="text_generation: one prompt per line")
    g.add_argument("--max-new-tokens", type=int, default=48)
    g.add_argument("--top-k", type=int, default=0, help="generation: sample among the k likeliest "
                                                         "tokens (0: greedy)")
    g.add_argument("--top-p", type=float, default=0.0, help="generation: nucleus sampling over the "
                                                             "likeliest tokens holding this probability (0: off)")
    g.add_argument("--temperature", type=float, default=1.0, help="generation: softmax temperature")


def build_parser(extra_args_provider=None):
    parser = argparse.ArgumentParser(
        prog="rapidgpt", allow_abbrev=False,
        description="Megatron-style LLM training on MindSpore. Flags keep Megatron-LM's names.")
    for add in (_model_args, _batch_args, _finetuning_args, _optimizer_args, _data_args, _checkpoint_args,
                _logging_args, _engine_args, _parallel_args, _launcher_args, _reserved_args):
        add(parser)
    if extra_args_provider is not None:
        extra_args_provider(parser)
    return parser


def parse_args(extra_args_provider=None, argv=None, launcher=False):
    """Parse and validate; a bad value exits with status 2 and one message naming the flag.

    The world size validated against is the job's in a process msrun started, else the one the
    flags ask for (--nproc-per-node x --nnodes). `launcher`: this is the `rapidgpt` process about
    to start that many ranks; a user script's own flags are not known to it yet and pass."""
    parser = build_parser(extra_args_provider)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_known_args(argv)[0] if launcher else parser.parse_args(argv)
    try:
        if args.load or args.pretrained_checkpoint:
            apply_checkpoint_args(args, given_flags(parser, argv))
        requested = args.nproc_per_node * args.nnodes
        validate_args(args, world_size=launched_world_size() if launched_by_msrun() else requested)
        _require(launcher or launched_by_msrun() or requested == 1,
                 f"--nproc-per-node {args.nproc_per_node} x --nnodes {args.nnodes} processes are started "
                 f"by the rapidgpt command (rapidgpt --user-script FILE ...), which launches them with "
                 f"msrun; this process runs alone")
    except ArgumentError as e:
        parser.error(str(e))
    return args


def given_flags(parser, argv):
    """Destinations of the options that appear on the command line (`--flag v` or `--flag=v`)."""
    written = {item.split("=", 1)[0] for item in argv if item.startswith("--")}
    return {action.dest for action in parser._actions if written & set(action.option_strings)}


def apply_checkpoint_args(args, given):
    """Megatron's --use-checkpoint-args, by default: model flags not given come from the checkpoint
    the run starts from (--load when it holds one, else --pretrained-checkpoint); a given
    architecture flag that contradicts it is an error."""
    from rapidgpt.training.checkpointing import (ARCHITECTURE_ARGS, CheckpointError, find_checkpoint,
                                                 read_metadata, start_checkpoint)
    source, directory = start_checkpoint(args)
    if source is None:
        return                                  # --load holds no checkpoint yet: a fresh start
    try:
        saved = read_metadata(find_checkpoint(directory, flag=source))["model"]
    except CheckpointError as e:
        raise ArgumentError(str(e)) from None
    for name, value in saved.items():
        if name not in given:
            setattr(args, name, value)
        elif name in ARCHITECTURE_ARGS and getattr(args, name) != value:
            flag = "--" + name.replace("_", "-")
            raise ArgumentError(f"{flag} {getattr(args, name)} contradicts the checkpoint under {source} "
                                f"{directory}, which has {value}; drop {flag} to use the checkpoint's value")


def _require(condition, message):
    if not condition:
        raise ArgumentError(message)


def validate_args(args, world_size=1):
    """Check every flag once and fill in derived values. Raises ArgumentError."""
    for reason, flags in NOT_YET.items():
        for flag, default in flags:
            value = getattr(args, flag.lstrip("-").replace("-", "_"))
            _require(value == default, f"{flag}: not supported by this build ({reason}); remove it")

    _require(not (args.user_script and args.task), "give either --user-script or --task, not both")
    if args.user_script:
        _require(os.path.isfile(args.user_script), f"--user-script {args.user_script}: no such file")

    for flag in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                 "log_interval", "eval_interval"):
        _require(getattr(args, flag) > 0, f"--{flag.replace('_', '-')} must be positive, "
                                           f"got {getattr(args, flag)}")
    _require(args.eval_iters >= 0, f"--eval-iters must be >= 0, got {args.eval_iters}")
    _require(args.hidden_size % args.num_attention_heads == 0,
             f"--hidden-size {args.hidden_size} must be divisible by --num-attention-heads "
             f"{args.num_attention_heads}")
    args.ffn_hidden_size = args.ffn_hidden_size or 4 * args.hidden_size
    args.max_position_embeddings = args.max_position_embeddings or args.seq_length
    _require(args.max_position_embeddings >= args.seq_length,
             f"--max-position-embeddings {args.max_position_embeddings} is smaller than --seq-length "
             f"{args.seq_length}; raise it or shorten the sequences")
    for flag in ("hidden_dropout", "attention_dropout"):
        _require(0.0 <= getattr(args, flag) < 1.0, f"--{flag.replace('_', '-')} must be in [0, 1)")
    _require(args.make_vocab_size_divisible_by >= 1, "--make-vocab-size-divisible-by must be >= 1")

    # Processes: nproc-per-node x nnodes (launched by rapidgpt through msrun).
    _require(args.nproc_per_node >= 1, f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    _require(args.nnodes >= 1, f"--nnodes (or NNODES) must be >= 1, got {args.nnodes}")
    _require(0 <= args.node_rank < args.nnodes,
             f"--node-rank (or NODE_RANK) {args.node_rank} is out of range for --nnodes {args.nnodes}: "
             f"give each node its index 0 .. {args.nnodes - 1}")
    _require(args.nnodes == 1 or (args.master_addr and args.master_port),
             f"--nnodes {args.nnodes}: every node needs node 0's address and a port (the same on all "
             f"nodes); give --master-addr and --master-port (or MASTER_ADDR and MASTER_PORT)")
    _require(args.master_port is None or 1024 <= args.master_port <= 65535,
             f"--master-port (or MASTER_PORT) {args.master_port} must be in 1024 .. 65535")

    # Parallel layout: world = TP x PP x DP, DP derived.
    args.world_size = world_size
    args.pipeline_model_parallel_size = args.pipeline_model_parallel_size or 1
    tp = args.tensor_model_parallel_size
    _require(tp >= 1, f"--tensor-model-parallel-size must be >= 1, got {tp}")
    model_parallel = tp * args.pipeline_model_parallel_size
    _require(world_size % model_parallel == 0,
             f"{world_size} processes cannot be split into --tensor-model-parallel-size {tp} x "
             f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size} groups; make the "
             f"number of processes (--nproc-per-node x --nnodes) a multiple of {model_parallel}")
    for flag, size in (("--num-attention-heads", args.num_attention_heads),
                       ("--ffn-hidden-size", args.ffn_hidden_size)):
        _require(size % tp == 0, f"{flag} {size} is not divisible by --tensor-model-parallel-size "
                                 f"{tp}: each TP rank holds an equal share")
    args.data_parallel_size = world_size // model_parallel
    per_step = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    _require(args.global_batch_size > 0 and args.global_batch_size % per_step == 0,
             f"--global-batch-size {args.global_batch_size} must be a positive multiple of "
             f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
             f"{args.data_parallel_size} = {per_step}")
    args.num_micro_batches = args.global_batch_size // per_step

    _require(not (args.train_iters and args.train_samples),
             "give either --train-iters or --train-samples, not both")
    if args.train_samples:
        args.train_iters = math.ceil(args.train_samples / args.global_batch_size)
    for flag in ("train_iters", "epochs"):
        value = getattr(args, flag)
        _require(value is None or value > 0, f"--{flag.replace('_', '-')} must be positive, got {value}")

    if args.lr is None:
        args.lr = 1e-4 if args.optimizer == "adam" else 1e-2
    _require(args.lr > 0, f"--lr must be positive, got {args.lr}")
    _require(0 <= args.min_lr <= args.lr, f"--min-lr {args.min_lr} must be in [0, --lr {args.lr}]")
    _require(args.clip_grad >= 0, f"--clip-grad must be >= 0 (0 disables clipping), got {args.clip_grad}")
    _require(args.weight_decay >= 0, f"--weight-decay must be >= 0, got {args.weight_decay}")
    _require(0 <= args.adam_beta1 < 1 and 0 <= args.adam_beta2 < 1, "--adam-beta1/--adam-beta2 must be in [0, 1)")
    _require(not (args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.lr_warmup_samples)),
             "give either --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both")
    if args.train_iters and not args.train_samples and args.lr_warmup_iters:
        decay_iters = args.lr_decay_iters or args.train_iters
        _require(args.lr_warmup_iters <= decay_iters,
                 f"--lr-warmup-iters {args.lr_warmup_iters} is longer than the decay "
                 f"({decay_iters} iterations, --lr-decay-iters or --train-iters); shorten the warmup")
    if args.train_samples and args.lr_warmup_samples:
        decay_samples = args.lr_decay_samples or args.train_samples
        _require(args.lr_warmup_samples <= decay_samples,
                 f"--lr-warmup-samples {args.lr_warmup_samples} is longer than the decay "
                 f"({decay_samples} samples); shorten the warmup")
    # Iteration-based and sample-based schedule flags do not mix (Megatron would ignore one kind).
    if args.train_samples:
        _require(args.lr_decay_iters is None and not args.lr_warmup_iters,
                 "with --train-samples give the schedule in samples: --lr-decay-samples, "
                 "--lr-warmup-samples (not --lr-decay-iters/--lr-warmup-iters)")
    else:
        _require(args.lr_decay_samples is None and not args.lr_warmup_samples,
                 "--lr-decay-samples/--lr-warmup-samples go with --train-samples; with --train-iters "
                 "use --lr-decay-iters/--lr-warmup-iters")

    try:
        parse_split(args.split)
    except ValueError as e:
        raise ArgumentError(str(e)) from None
    if args.tokenizer_type:
        _require(args.vocab_file, f"--vocab-file is required for --tokenizer-type {args.tokenizer_type}")
        _require(args.tokenizer_type != "GPT2BPETokenizer" or args.merge_file,
                 "--merge-file is required for --tokenizer-type GPT2BPETokenizer")
    _require(args.save_interval is None or (args.save_interval > 0 and args.save),
             "--save-interval needs --save DIR and a positive interval")
    for flag in ("exit_interval", "exit_duration_in_mins", "keep_last_n_checkpoints"):
        value = getattr(args, flag)
        _require(value is None or value > 0, f"--{flag.replace('_', '-')} must be positive, got {value}")
    _require(not (args.skip_train and not args.load), "--skip-train evaluates a checkpoint: give --load")
    _require(not (args.finetune and not args.load), "--finetune loads weights: give --load")
    _require(args.num_classes is None or args.num_classes >= 2, f"--num-classes must be >= 2, got {args.num_classes}")
    if args.task == "sequence_classification":
        _require(args.data_path or args.train_data_path,
                 "--task sequence_classification needs the training data: --data-path TRAIN.jsonl|.tsv")
        _require(not (args.data_path and args.train_data_path),
                 "give the training data with --data-path or --train-data-path, not both")
        _require(args.epochs or args.train_iters, "--task sequence_classification needs --epochs N "
                                                  "(or --train-iters)")
        _require(args.best_metric in (None, "accuracy", "f1"),
                 f"--best-metric {args.best_metric}: sequence_classification reports accuracy and f1")
    _require(args.num_workers >= 0, f"--num-workers must be >= 0, got {args.num_workers}")
    _require(args.max_new_tokens >= 0, f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    _require(args.top_k >= 0, f"--top-k must be >= 0 (0: greedy), got {args.top_k}")
    _require(args.temperature > 0, f"--temperature must be positive, got {args.temperature}")
    _require(0.0 <= args.top_p <= 1.0, f"--top-p must be in [0, 1] (0: off), got {args.top_p}")
    _require(args.prompts_file is None or os.path.isfile(args.prompts_file),
             f"--prompts-file {args.prompts_file}: no such file")
    _require(args.cpu_threads is None or args.cpu_threads > 0, "--cpu-threads must be positive")
    return args


def padded_vocab_size(vocab_size, divisible_by, tensor_parallel_size=1):
    """Megatron's padding: round up to a multiple of divisible_by x TP (fast, evenly split GEMMs)."""
    multiple = divisible_by * tensor_parallel_size
    return int(math.ceil(vocab_size / multiple) * multiple)
