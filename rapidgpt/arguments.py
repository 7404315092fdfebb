"""Every command-line flag, under its Megatron-LM / Rapidformer name, and their validation.

`parse_args(extra_args_provider, argv)` builds the parser (groups: model, batch, optimizer,
learning rate, data, checkpoint, logging, engine, parallel, mixed precision (rapidgpt/config/precision.py),
recompute (rapidgpt/config/recompute.py), launcher, Rapidformer), lets a user
script add its own flags, parses, then validates everything once. Every problem of the command
line is reported at once, one line each (`rapidgpt: error: <flag>: <what is wrong>; <what to
do>`, unknown flags with a "did you mean"), and the program exits with status 2 before any work
starts -- and before MindSpore is imported, so a mistyped flag costs a fraction of a second.
Derived values (data-parallel size, micro-batches per step, ...) are filled in here so that
every other module reads one settled namespace.
"""
import difflib
import glob
import math
import os
import sys

from rapidgpt.data.fim import add_fim_args, check_fim_args
from rapidgpt.data.gpt_dataset import parse_split
from rapidgpt.config.batch_size_rampup import add_batch_size_rampup_args, check_batch_size_rampup_args
from rapidgpt.config.bert import add_bert_args, check_bert_args
from rapidgpt.config.compile_cache import add_compile_cache_args, check_compile_cache_args
from rapidgpt.config.implementation_choices import (add_implementation_choice_args, check_implementation_choice_args,
                                                    values_of)
from rapidgpt.config.kernel_fusion import add_kernel_fusion_args, check_kernel_fusion_args
from rapidgpt.config.megatron_flags import add_megatron_flags, check_megatron_flags
from rapidgpt.config.distillation import add_distillation_args, check_distillation_args
from rapidgpt.config.sft import add_sft_args, check_sft_args
from rapidgpt.config.mla import add_mla_args, check_mla_args
from rapidgpt.config.mup import add_mup_args, check_mup_args
from rapidgpt.config.rerun import add_rerun_args, check_rerun_args
from rapidgpt.config.wsd_schedule import add_wsd_args, check_wsd_args
from rapidgpt.config.precision import add_precision_args, check_precision_args
from rapidgpt.config.transformer import add_architecture_args, check_architecture_args
from rapidgpt.config.wandb_logging import add_wandb_args, check_wandb_args
from rapidgpt.config.recompute import add_recompute_args, check_recompute_args
from rapidgpt.config.pipeline_split import (add_pipeline_split_args, check_interleaved_batch,
                                            check_pipeline_split_args, pipeline_split_from_args)
from rapidgpt.config.replica_checks import add_replica_check_args, check_replica_check_args
from rapidgpt.config.zero import add_zero_args, check_zero_args
from rapidgpt.flag_parser import ArgumentError, FlagParser, Problems, report_and_exit
from rapidgpt.msrun_env import launched_by_msrun, launched_world_size
from rapidgpt.tokenizer import (MODEL_TOKENIZER_TYPES, TOKENIZER_MODEL_HELP, TOKENIZER_TYPES, check_tokenizer_model,
                                inferred_tokenizer_type)
from rapidgpt.tokenizer.null_tokenizer import EOD_HELP as NULL_EOD_HELP
from rapidgpt.tokenizer.tiktoken_tokenizer import add_tiktoken_args, flag_problems as tiktoken_flag_problems

TASKS = ("pretraining", "sft", "text_generation", "sequence_classification")
DEVICES = ("cpu", "gpu", "ascend")


def _model_args(parser):
    g = parser.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=4)
    g.add_argument("--hidden-size", type=int, default=256)
    g.add_argument("--num-attention-heads", type=int, default=4)
    g.add_argument("--ffn-hidden-size", type=int, default=None,
                   help="default: 4 * hidden size (with --swiglu: int(8/3 * hidden / 64) * 64)")
    g.add_argument("--seq-length", type=int, default=128)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: seq length")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="vocabulary size when no tokenizer is given, NullTokenizer's (token ids must be "
                        "below it), or TikTokenizer's (default 131072: the special tokens, then the vocabulary)")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128,
                   help="pad the embedding rows to a multiple of this (times TP size) for speed; "
                        "padded rows never take part in the loss or the returned logits")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--embedding-init-method-std", type=float, default=None,
                   help="std of the embeddings' normal init (word, position, token type; with --use-mup also an "
                        "untied output layer); default --init-method-std")
    g.add_argument("--layernorm-epsilon", "--norm-epsilon", dest="layernorm_epsilon", type=float, default=1e-5,
                   help="epsilon of every LayerNorm/RMSNorm (Megatron's --norm-epsilon)")
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
    g.add_argument("--iterations-to-skip", nargs="+", type=int, default=[],
                   help="Megatron's: these iterations (numbered from 1) consume their samples without a step, "
                        "e.g. past a batch that spiked the loss")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="Megatron's: the step's loss is the mean over all its tokens (every micro-batch and "
                        "data-parallel rank), not the mean of per-micro-batch means; the loss function returns "
                        "(loss summed over its tokens, number of tokens)")


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
    g.add_argument("--apply-wd-to-qk-layernorm", action="store_true",
                   help="decay the q/k norms' weights too (Megatron's Qwen3-Next rule; other norms and biases "
                        "never decay)")
    g.add_argument("--no-weight-decay-cond-type", choices=["apply_wd_to_qk_layernorm"], default=None,
                   help="Megatron's deprecated spelling of --apply-wd-to-qk-layernorm")
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--sgd-momentum", type=float, default=0.9)
    g.add_argument("--clip-grad", type=float, default=1.0, help="global grad-norm clip; 0 disables")
    g = parser.add_argument_group("learning rate")
    g.add_argument("--lr", type=float, default=None)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-decay-style", choices=["constant", "linear", "cosine", "inverse-square-root", "WSD"],
                   default="linear", help="WSD: warmup, stable, then annealed at the end (rapidgpt/config/"
                                          "wsd_schedule.py)")
    g.add_argument("--lr-decay-iters", type=int, default=None, help="default: --train-iters")
    g.add_argument("--lr-decay-samples", type=int, default=None)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-samples", type=int, default=0)
    g.add_argument("--lr-warmup-fraction", type=float, default=None)
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="learning rate the warmup starts from")
    g.add_argument("--decoupled-lr", type=float, default=None,
                   help="the learning rate of the input embedding and the output layer (parameters named "
                        "*word_embeddings.weight, *output_layer.weight), on the same warmup and decay as --lr")
    g.add_argument("--decoupled-min-lr", type=float, default=None,
                   help="with --decoupled-lr: where their rate decays to (default --min-lr)")


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
    g.add_argument("--mock-data", action="store_true",
                   help="no data: Megatron's mock GPT documents (tokens 1, 2, ... then the end-of-document id; "
                        "rapidgpt/data/mock_dataset.py), e.g. with --tokenizer-type NullTokenizer --vocab-size N")
    g.add_argument("--data-impl", "--dataset-impl", dest="data_impl", choices=["mmap", "infer"],
                   default="mmap", help="accepted for compatibility; Megatron's mmap format is read")
    g.add_argument("--tokenizer-type", default=None, choices=TOKENIZER_TYPES)
    g.add_argument("--tokenizer-model", default=None, metavar="PATH", help=TOKENIZER_MODEL_HELP)
    g.add_argument("--vocab-file", default=None)
    g.add_argument("--merge-file", default=None)
    g.add_argument("--null-tokenizer-eod-id", type=int, default=None, help=NULL_EOD_HELP)
    add_tiktoken_args(g)
    g.add_argument("--eod-mask-loss", action="store_true")
    g.add_argument("--reset-position-ids", action="store_true")
    g.add_argument("--reset-attention-mask", action="store_true")
    g.add_argument("--num-workers", type=int, default=2, help="background threads preparing batches")
    g.add_argument("--seed", type=int, default=1234)


def _parallel_args(parser):
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="split every layer's matrices over this many ranks (Megatron TP); the data-"
                        "parallel size is the number of processes / (TP x PP)")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                   help="split the decoder's layers into this many stages run as Megatron's 1F1B "
                        "pipeline (each stage a block of DP ranks); evenly unless the pipeline split flags "
                        "say otherwise (see README, Pipeline parallelism)")


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
    g.add_argument("--distributed-timeout-minutes", type=float, default=10,
                   help="how long a rank's collective waits for the other ranks before the job fails "
                        "(Megatron's flag, default 10): a rank still compiling its step, or slowed by a busy "
                        "machine, makes the others wait. On the CPU it sets MindSpore's "
                        "MS_CPU_COMM_OP_TIMEOUT (MindSpore's own default: 30 s; a value set in the "
                        "environment is kept); on Ascend/GPU HCCL/NCCL's own time-outs apply")


# Rapidformer flags that fetch from a hub. RapidGPT downloads nothing: refused with the way out.
HUB_FLAGS = {
    "--data-name": "names a Hugging Face datasets-hub dataset",
    "--dataset-name": "names a Hugging Face datasets-hub dataset",
    "--dataset-config-name": "names a Hugging Face datasets-hub configuration",
}


def _rapidformer_args(parser):
    g = parser.add_argument_group("Rapidformer compatibility")
    g.add_argument("--pretrained-model-name-or-path", default=None, metavar="DIR",
                   help="a local Hugging Face GPT-2 folder (config.json, model.safetensors, "
                        "vocab.json, merges.txt) or a RapidGPT checkpoint: start from its weights, "
                        "taking the model and tokenizer flags from it. Nothing is downloaded: hub "
                        "names are refused")
    for flag in HUB_FLAGS:
        g.add_argument(flag, default=None, help="refused: nothing is downloaded (give local files)")


def _checkpoint_args(parser):
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, help="directory for checkpoints (Megatron layout)")
    g.add_argument("--save-interval", "--persistent-save-interval", type=int, default=None,
                   help="save every this many iterations")
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
    g.add_argument("--ckpt-format", choices=values_of("--ckpt-format", ["ckpt", "safetensors"]), default="ckpt",
                   help="the weights files: MindSpore's .ckpt or .safetensors")
    g.add_argument("--keep-last-n-checkpoints", type=int, default=None,
                   help="delete older checkpoints once a newer one is complete")
    g.add_argument("--save-retain-interval", type=int, default=None, metavar="N",
                   help="Megatron's: keep the checkpoints of iterations that are multiples of N (a multiple of "
                        "--save-interval) and the latest; each completed save deletes the one before it otherwise")
    g.add_argument("--skip-train", action="store_true", help="with --load: only evaluate")
    g.add_argument("--override-opt_param-scheduler", "--override-opt-param-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="on --load, continue with this run's LR schedule flags instead of the "
                        "checkpoint's (e.g. after changing --train-iters)")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="on --load, continue with the checkpoint's LR schedule, whatever this run's "
                        "LR flags say")


def _logging_args(parser):
    g = parser.add_argument_group("logging and evaluation")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--tensorboard-log-interval", type=int, default=1)
    g.add_argument("--log-memory-to-tensorboard", action="store_true",
                   help="Megatron's: TensorBoard gets the memory in use every --tensorboard-log-interval: on "
                        "GPU/Ascend mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes (MindSpore's "
                        "device pool); on the CPU mem-rss-bytes and mem-max-rss-bytes (the process's memory)")
    g.add_argument("--log-timers-to-tensorboard", action="store_true",
                   help="Megatron's: at each --log-interval, TensorBoard gets iteration-time (seconds, from the "
                        "second interval on) and every timer --timing-log-level measures as <name>-time (the "
                        "slowest rank's seconds per iteration)")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="Megatron's: the iteration line shows 'num zeros', the number of gradient elements equal to 0 "
                        "(after unscaling and clipping, over the whole model), and TensorBoard gets num-zeros")
    g.add_argument("--log-params-norm", action="store_true",
                   help="Megatron's: the iteration line shows 'params norm', the L2 norm of the (fp32 main) "
                        "parameters after the step, and TensorBoard gets params-norm")
    g.add_argument("--log-dir", default=None,
                   help="also write each rank's log lines to LOG_DIR/rank_N.log. With several processes "
                        "LOG_DIR also keeps msrun's worker_N.log (everything rank N printed), "
                        "scheduler.log and msrun_nodeR.log; default then: ./rapidgpt_logs/DATE-TIME")
    g.add_argument("--no-progress-bar", action="store_true", help="no tqdm bar (e.g. in CI logs)")
    g.add_argument("--log-throughput", action="store_true",
                   help="Megatron's 'throughput per GPU (TFLOP/s/GPU)' in the iteration line: its FLOPs formula "
                        "for the model flags, per second and rank")
    g.add_argument("--timing-log-level", type=int, choices=[0, 1, 2], default=0,
                   help="Megatron's timers: 0 the set-up phases (model, data, checkpoint load) at "
                        "start and each save; 1 also, at every log line, the batch generator, the "
                        "step and evaluation; 2 the same as 1 (the step is one compiled graph: its "
                        "forward, backward and update are not timed apart)")
    g.add_argument("--timing-log-option", choices=["max", "minmax", "all"], default="minmax",
                   help="over several ranks: the slowest rank's time, min and max, or every rank's")
    g.add_argument("--predictions-file", default=None, metavar="FILE",
                   help="sequence_classification: write one jsonl line of prediction per validation "
                        "example")


def _engine_args(parser):
    g = parser.add_argument_group("engine")
    g.add_argument("--user-script", default=None, help="Python file with your Pretrainer/Finetuner")
    g.add_argument("--task", default=None, metavar="{" + ",".join(TASKS) + "}",
                   help="black-box task, no user file; with --user-script, any name, handed to the script as "
                        "args.task (as Rapidformer's EasyNLP scripts pass one)")
    g.add_argument("--device", choices=DEVICES, default=None, help="default: the best available")
    g.add_argument("--no-jit", dest="jit", action="store_false",
                   help="run the step eagerly (PyNative) instead of compiling it: 2-3x slower, "
                        "but any Python works inside run_forward_step (a pipeline stage still compiles its "
                        "layers and tensor-parallel cells: MindSpore runs their custom backwards and "
                        "recompute only inside a graph)")
    g.add_argument("--cpu-threads", type=int, default=None, help="MindSpore CPU threads per process (default: this node's cores divided by its processes)")
    g.add_argument("--prompt", default=None, help="text to continue (text_generation; after pretraining)")
    g.add_argument("--prompts-file", default=None, help="text_generation: one prompt per line")
    g.add_argument("--max-new-tokens", type=int, default=48)
    g.add_argument("--top-k", type=int, default=0, help="generation: sample among the k likeliest "
                                                         "tokens (0: greedy)")
    g.add_argument("--top-p", type=float, default=0.0, help="generation: nucleus sampling over the "
                                                             "likeliest tokens holding this probability (0: off)")
    g.add_argument("--temperature", type=float, default=1.0, help="generation: softmax temperature")


def build_parser(extra_args_provider=None, megatron_flags=True):
    """Every RapidGPT flag (and a user script's, from `extra_args_provider`); `megatron_flags`: also
    Megatron-LM's flags that RapidGPT answers without defining them (rapidgpt/config/megatron_flags.py)."""
    parser = FlagParser(description="Megatron-style LLM training on MindSpore. Flags keep Megatron-LM's "
                                    "and Rapidformer's names.")
    for add in (_model_args, add_architecture_args, add_bert_args, _batch_args, add_batch_size_rampup_args,
                _finetuning_args, _optimizer_args, _data_args, _checkpoint_args,
                _logging_args, _engine_args, _parallel_args, add_precision_args, add_recompute_args,
                add_zero_args, add_replica_check_args, add_kernel_fusion_args, add_compile_cache_args,
                add_implementation_choice_args,
                _launcher_args, _rapidformer_args, add_pipeline_split_args, add_wandb_args, add_fim_args, add_mup_args,
                add_mla_args, add_wsd_args, add_rerun_args, add_distillation_args, add_sft_args):
        add(parser)
    if extra_args_provider is not None:
        extra_args_provider(parser)
    if megatron_flags:
        add_megatron_flags(parser)      # last: a flag defined above (or by a user script) is not Megatron's
    return parser


def parse_args(extra_args_provider=None, argv=None, launcher=False, user_script=False):
    """Parse and validate; any problem exits with status 2, every problem on its own line.

    The world size validated against is the job's in a process msrun started, else the one the
    flags ask for (--nproc-per-node x --nnodes). `launcher`: this is the `rapidgpt` command,
    which starts the ranks itself when several are asked for. `user_script`: the flags are for a
    user script, whose own flags are not known yet and pass (the script's engine checks them)."""
    # Before a user script has added its own flags (the launcher's check), a Megatron flag may be one
    # of them: it passes here as any flag of the script does, and the script's engine answers it.
    parser = build_parser(extra_args_provider, megatron_flags=not user_script)
    argv = sys.argv[1:] if argv is None else list(argv)
    args, problems = parser.parse(argv, tolerate_unknown=user_script)
    check = Problems()
    check.messages += problems
    try:
        _resolve_pretrained_model(args, check)
        given = given_flags(parser, argv)
        check.require(args.step_batch_size_schedule is None or "global_batch_size" not in given,
                      "--global-batch-size: not with --step-batch-size-schedule, whose entries are the global "
                      "batch sizes (Megatron refuses the pair too)")
        if args.load or args.pretrained_checkpoint:
            apply_checkpoint_args(args, given, check)
        check.require(args.task != "pretraining" or args.data_path or args.train_data_path or args.mock_data
                      or args.sft or not given & {"tokenizer_type", "vocab_file", "merge_file"},
                      "--tokenizer-type: without --data-path, --task pretraining trains on the embedded demo "
                      "corpus, which comes with its own tokenizer; give --data-path for your tokenizer's data, "
                      "or drop the tokenizer flags")
        requested = args.nproc_per_node * (args.nnodes or 1)      # None: a bad value, reported
        validate_args(args, world_size=launched_world_size() if launched_by_msrun() else requested,
                      check=check)
        check.require(launcher or launched_by_msrun() or requested == 1,
                      f"--nproc-per-node: {args.nproc_per_node} x --nnodes {args.nnodes} processes are "
                      f"started by the rapidgpt command, which launches them with msrun; run "
                      f"'rapidgpt --user-script FILE ...' instead of python FILE")
    except ArgumentError as e:
        check.messages += [m for m in e.problems if m not in check.messages]
    if check.messages:
        report_and_exit(check.messages)
    return args


def given_flags(parser, argv):
    """Destinations of the options that appear on the command line (`--flag v` or `--flag=v`)."""
    written = {item.split("=", 1)[0] for item in argv if item.startswith("--")}
    return {action.dest for action in parser._actions if written & set(action.option_strings)}


def _resolve_pretrained_model(args, check):
    """Rapidformer's --pretrained-model-name-or-path: a local folder, used as --pretrained-checkpoint
    (a Hugging Face GPT-2, BERT or Llama-family folder is read as one, see rapidgpt/models/hf_*.py)."""
    path = args.pretrained_model_name_or_path
    if path is None:
        return
    if not os.path.isdir(path):
        check.add(f"--pretrained-model-name-or-path: {path} is not a local folder, and RapidGPT downloads "
                  f"nothing from a model hub; download the model first (e.g. huggingface-cli download "
                  f"{path} --local-dir DIR) and give DIR")
    elif check.require(not args.pretrained_checkpoint,
                       "--pretrained-model-name-or-path: give it or --pretrained-checkpoint, not both; "
                       "both name the weights to start from"):
        args.pretrained_checkpoint = path


def checkpoint_model_flags(directory, flag="--load"):
    """`(model flags, where)` recorded by the checkpoint or Hugging Face folder `directory`
    (given as `flag`)."""
    from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata
    if os.path.isfile(os.path.join(directory, "config.json")):
        from rapidgpt.models.hf_files import converter_for
        return converter_for(directory).hf_folder_model_flags(directory), os.path.join(directory, "config.json")
    path = find_checkpoint(directory, flag=flag)
    return read_metadata(path)["model"], path


def apply_checkpoint_args(args, given, check=None):
    """Megatron's --use-checkpoint-args, by default: model flags not given come from the checkpoint
    the run starts from (--load when it holds one, else --pretrained-checkpoint); a given
    architecture flag that contradicts it is an error (all of them are reported)."""
    from rapidgpt.training.checkpoint_files import ARCHITECTURE_ARGS, CheckpointError, start_checkpoint
    own = check is None
    check = check or Problems()
    source, directory = start_checkpoint(args)
    if source is None:
        return                                  # --load holds no checkpoint yet: a fresh start
    if source == "--pretrained-checkpoint" and args.pretrained_model_name_or_path:
        source = "--pretrained-model-name-or-path"             # as the user wrote it
    try:
        saved, where = checkpoint_model_flags(directory, source)
    except (CheckpointError, OSError, ValueError) as e:      # HFConversionError is a ValueError
        check.add(str(e) if str(e).startswith(source) else f"{source}: {e}")
        saved = {}
    for name, value in saved.items():
        flag = "--" + name.replace("_", "-")
        if name not in given:
            setattr(args, name, value)
        elif name in ARCHITECTURE_ARGS and getattr(args, name) != value:
            check.add(f"{flag}: {getattr(args, name)} contradicts the checkpoint under {source} {directory}, "
                      f"which has {value}; drop {flag} to use the checkpoint's value")
    if saved and args.tokenizer_type:
        for key in ("vocab_file", "merge_file", "tokenizer_model"):
            path = getattr(args, key)
            check.require(path is None or key in given or os.path.exists(path),
                          f"--{key.replace('_', '-')}: the checkpoint {where} records {path}, which does "
                          f"not exist (a checkpoint saved before tokenizer files were stored inside "
                          f"it); give --{key.replace('_', '-')}")
    if own:
        check.raise_if_any()


def validate_args(args, world_size=1, check=None):
    """Check every flag once and fill in derived values. Raises ArgumentError listing every
    problem (`check`: a Problems collector to add to instead)."""
    own = check is None
    check = check or Problems()
    # A user script's --task is the script's own (Rapidformer's EasyNLP scripts pass one), not a
    # black-box task whose checks apply; it stays in args.task for the script.
    task, args.task = args.task, (None if args.user_script else args.task)
    _infer_tokenizer_type(args, check)
    for section in (_check_refused, _check_model, _check_launch, _check_layout, _check_schedule,
                    _check_data, _check_checkpointing, _check_task, _check_generation):
        section(args, check, world_size)
    check_batch_size_rampup_args(args, check)
    check_interleaved_batch(args, check)
    check_bert_args(args, check)
    check_fim_args(args, check)
    check_sft_args(args, check)
    check_mup_args(args, check)
    check_mla_args(args, check)
    check_distillation_args(args, check)    # after the model's: the teacher's flags are compared with them
    check_wsd_args(args, check)
    check_zero_args(args, check)            # before the precision flags: Megatron-FSDP's gradient dtypes set them
    check_precision_args(args, check)
    check_rerun_args(args, check)           # after the precision's: fp16's dynamic scale turns the NaN checks off
    check_recompute_args(args, check)
    check_replica_check_args(args, check)
    check_kernel_fusion_args(args, check)
    check_compile_cache_args(args, check)
    check_implementation_choice_args(args, check)
    check_wandb_args(args, check)
    check_megatron_flags(args, check)
    args.task = task
    if own:
        check.raise_if_any()
    return args


def _infer_tokenizer_type(args, check):
    """Old Megatron command lines give --vocab-file (and --merge-file) without --tokenizer-type:
    the type their pretrain_gpt.py / pretrain_bert.py defaulted to, said in a start-up line (a
    WordPiece vocabulary then makes the model BERT: rapidgpt/config/bert.py)."""
    if args.tokenizer_type or not (args.vocab_file or args.merge_file):
        return
    kind = inferred_tokenizer_type(args.vocab_file, args.merge_file)
    if kind is None:
        check.add(f"--merge-file: --vocab-file {args.vocab_file} is a GPT-2 vocabulary, which needs its merges; "
                  f"give --merge-file merges.txt (or --tokenizer-type)")
        return
    args.tokenizer_type = kind
    source = "--vocab-file and --merge-file" if args.merge_file else "--vocab-file (a WordPiece vocab.txt)"
    script = "pretrain_gpt.py" if kind == "GPT2BPETokenizer" else "pretrain_bert.py"
    args.megatron_flag_lines = [*getattr(args, "megatron_flag_lines", ()),
                                f" > --tokenizer-type not given: {kind}, from {source}, as Megatron's {script} "
                                f"defaulted it"]


def _flag(name):
    return "--" + name.replace("_", "-")


def _check_refused(args, check, world_size):
    for flag, what in HUB_FLAGS.items():
        check.require(getattr(args, flag.lstrip("-").replace("-", "_")) is None,
                      f"{flag}: {what}, and RapidGPT downloads nothing; convert the data to local files "
                      f"(.jsonl/.tsv for finetuning, .bin/.idx via data_tools/preprocess_data.py) and "
                      f"give them with --data-path / --valid-data-path")


def _check_model(args, check, world_size):
    if not args.user_script and args.task is not None and args.task not in TASKS:
        close = difflib.get_close_matches(args.task, TASKS, n=1)
        check.add(f"--task: {args.task} is not a task; {f'did you mean {close[0]}? ' if close else ''}choose one "
                  f"of {', '.join(TASKS)} (or run your --user-script)")
    if args.user_script:
        check.require(os.path.isfile(args.user_script),
                      f"--user-script: {args.user_script}: no such file; check the path")
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size",
                 "log_interval", "eval_interval"):
        check.require(getattr(args, name) > 0,
                      f"{_flag(name)}: must be positive, got {getattr(args, name)}; give a value >= 1")
    check.require(args.eval_iters >= 0, f"--eval-iters: must be >= 0, got {args.eval_iters}")
    for name in ("init_method_std", "embedding_init_method_std"):
        check.require(getattr(args, name) is None or getattr(args, name) > 0,
                      f"{_flag(name)}: must be positive, got {getattr(args, name)}")
    check_architecture_args(args, check)
    args.max_position_embeddings = args.max_position_embeddings or args.seq_length
    check.require(args.max_position_embeddings >= args.seq_length,
                  f"--max-position-embeddings: {args.max_position_embeddings} is smaller than --seq-length "
                  f"{args.seq_length}; raise it or shorten the sequences")
    for name in ("hidden_dropout", "attention_dropout"):
        check.require(0.0 <= getattr(args, name) < 1.0,
                      f"{_flag(name)}: must be in [0, 1), got {getattr(args, name)}")
    check.require(args.make_vocab_size_divisible_by >= 1,
                  f"--make-vocab-size-divisible-by: must be >= 1, got {args.make_vocab_size_divisible_by}")


def _check_launch(args, check, world_size):
    """Processes: nproc-per-node x nnodes (launched by rapidgpt through msrun)."""
    check.require(args.nproc_per_node >= 1, f"--nproc-per-node: must be >= 1, got {args.nproc_per_node}")
    if args.nnodes is None or args.node_rank is None:
        return                          # a value (or NNODES/NODE_RANK) that is not a number: reported
    if check.require(args.nnodes >= 1, f"--nnodes: must be >= 1 (or NNODES), got {args.nnodes}"):
        check.require(0 <= args.node_rank < args.nnodes,
                      f"--node-rank: {args.node_rank} (or NODE_RANK) is out of range for --nnodes "
                      f"{args.nnodes}; give each node its index 0 .. {args.nnodes - 1}")
    check.require(args.nnodes == 1 or (args.master_addr and args.master_port),
                  f"--master-addr: --nnodes {args.nnodes} needs node 0's address and a port (the same on "
                  f"all nodes); give --master-addr and --master-port (or MASTER_ADDR and MASTER_PORT)")
    check.require(args.master_port is None or 1024 <= args.master_port <= 65535,
                  f"--master-port: {args.master_port} (or MASTER_PORT) must be in 1024 .. 65535")
    check.require(args.cpu_threads is None or args.cpu_threads > 0,
                  f"--cpu-threads: must be positive, got {args.cpu_threads}")
    check.require(args.distributed_timeout_minutes > 0,
                  f"--distributed-timeout-minutes: must be positive, got {args.distributed_timeout_minutes}")


def _check_layout(args, check, world_size):
    """Parallel layout: world = TP x PP x DP, DP derived; the global batch from micro-batches."""
    args.world_size = world_size
    args.pipeline_model_parallel_size = args.pipeline_model_parallel_size or 1
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if not check.require(tp >= 1, f"--tensor-model-parallel-size: must be >= 1, got {tp}"):
        tp = args.tensor_model_parallel_size = 1
    if not check.require(pp >= 1, f"--pipeline-model-parallel-size: must be >= 1, got {pp}"):
        pp = args.pipeline_model_parallel_size = 1
    model_parallel = tp * pp
    processes = (f"{world_size} process{'' if world_size == 1 else 'es'} cannot be split into groups of "
                 f"{tp} (TP) x {pp} (PP)")
    # The flag that does not fit the processes: PP when TP alone fits them, else TP.
    pipeline_misfits = world_size % model_parallel != 0 and pp > 1 and world_size % tp == 0
    plain_split = not (args.decoder_first_pipeline_num_layers or args.decoder_last_pipeline_num_layers
                       or args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split)
    if pipeline_misfits and plain_split and args.num_layers and args.num_layers % pp:   # one flag wrong twice
        check.add(f"--pipeline-model-parallel-size: {processes}, nor --num-layers {args.num_layers} into {pp} "
                  f"equal stages; choose a stage count that divides the layers and, times TP {tp}, the number "
                  f"of processes (--nproc-per-node x --nnodes)")
        args.pipeline_split = pipeline_split_from_args(args)
    else:
        check_pipeline_split_args(args, check)
        check.require(world_size % model_parallel == 0,
                      f"--{'pipeline' if pipeline_misfits else 'tensor'}-model-parallel-size: {processes}; make "
                      f"the number of processes (--nproc-per-node x --nnodes) a multiple of {model_parallel}")
    groups = [("--num-query-groups", args.num_query_groups)] if args.group_query_attention else []
    for flag, size in (("--num-attention-heads", args.num_attention_heads), *groups,
                       ("--ffn-hidden-size", args.ffn_hidden_size)):
        check.require(size % tp == 0, f"{flag}: {size} is not divisible by --tensor-model-parallel-size "
                                      f"{tp}; each TP rank holds an equal share")
    args.data_parallel_size = max(1, world_size // model_parallel)
    per_step = max(1, args.micro_batch_size) * args.data_parallel_size
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    check.require(args.global_batch_size > 0 and args.global_batch_size % per_step == 0,
                  f"--global-batch-size: {args.global_batch_size} must be a positive multiple of "
                  f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
                  f"{args.data_parallel_size} = {per_step}")
    args.num_micro_batches = max(1, args.global_batch_size // per_step)


def _check_schedule(args, check, world_size):
    """Training length, optimizer and Megatron's LR schedule flags."""
    if args.no_weight_decay_cond_type == "apply_wd_to_qk_layernorm":      # as Megatron's validate_args
        args.apply_wd_to_qk_layernorm, args.no_weight_decay_cond_type = True, None
        line = (" > --no-weight-decay-cond-type apply_wd_to_qk_layernorm: accepted; Megatron's deprecated "
                "spelling of --apply-wd-to-qk-layernorm")
        lines = list(getattr(args, "megatron_flag_lines", ()))          # shown with the Megatron flags' lines
        args.megatron_flag_lines = lines + [line] * (line not in lines)
    check.require(not (args.train_iters and args.train_samples),
                  "--train-samples: give either --train-iters or --train-samples, not both")
    for name in ("train_iters", "train_samples", "epochs", "lr_decay_iters", "lr_decay_samples"):
        value = getattr(args, name)
        check.require(value is None or value > 0, f"{_flag(name)}: must be positive, got {value}")
    for name in ("lr_warmup_iters", "lr_warmup_samples"):
        check.require(getattr(args, name) >= 0, f"{_flag(name)}: must be >= 0, got {getattr(args, name)}")
    check.require(all(i > 0 for i in args.iterations_to_skip),
                  f"--iterations-to-skip: iterations are numbered from 1, got {args.iterations_to_skip}")
    if args.train_samples and args.train_samples > 0 and args.global_batch_size > 0:
        args.train_iters = math.ceil(args.train_samples / args.global_batch_size)
    if args.lr is None:
        args.lr = 1e-4 if args.optimizer == "adam" else 1e-2
    check.require(args.lr > 0, f"--lr: must be positive, got {args.lr}")
    check.require(0 <= args.min_lr <= args.lr, f"--min-lr: {args.min_lr} must be in [0, --lr {args.lr}]")
    check.require(0 <= args.lr_warmup_init <= args.lr,
                  f"--lr-warmup-init: {args.lr_warmup_init} must be in [0, --lr {args.lr}]")
    if check.require(args.decoupled_lr is not None or args.decoupled_min_lr is None,
                     "--decoupled-min-lr: only with --decoupled-lr; add it, or remove --decoupled-min-lr") \
            and args.decoupled_lr is not None:
        decoupled_min = args.min_lr if args.decoupled_min_lr is None else args.decoupled_min_lr
        check.require(0 <= decoupled_min <= args.decoupled_lr,
                      f"--decoupled-min-lr: {decoupled_min} (default --min-lr) must be in [0, --decoupled-lr "
                      f"{args.decoupled_lr}]")
        check.require(args.lr_warmup_init <= args.decoupled_lr,
                      f"--lr-warmup-init: {args.lr_warmup_init} is above --decoupled-lr {args.decoupled_lr}")
    check.require(args.clip_grad >= 0, f"--clip-grad: must be >= 0 (0 disables clipping), got {args.clip_grad}")
    check.require(args.weight_decay >= 0, f"--weight-decay: must be >= 0, got {args.weight_decay}")
    check.require(0 <= args.adam_beta1 < 1, f"--adam-beta1: must be in [0, 1), got {args.adam_beta1}")
    check.require(0 <= args.adam_beta2 < 1, f"--adam-beta2: must be in [0, 1), got {args.adam_beta2}")
    check.require(args.lr_warmup_fraction is None or 0 <= args.lr_warmup_fraction <= 1,
                  f"--lr-warmup-fraction: must be in [0, 1], got {args.lr_warmup_fraction}")
    check.require(not (args.lr_warmup_fraction is not None and (args.lr_warmup_iters or args.lr_warmup_samples)),
                  "--lr-warmup-fraction: give either --lr-warmup-fraction or --lr-warmup-iters/"
                  "--lr-warmup-samples, not both")
    if args.train_iters and not args.train_samples and args.lr_warmup_iters:
        decay_iters = args.lr_decay_iters if args.lr_decay_iters is not None else args.train_iters
        check.require(args.lr_warmup_iters <= decay_iters,
                      f"--lr-warmup-iters: {args.lr_warmup_iters} is longer than the decay ({decay_iters} "
                      f"iterations, --lr-decay-iters or --train-iters); shorten the warmup")
    if args.train_samples and args.lr_warmup_samples:
        decay_samples = args.lr_decay_samples if args.lr_decay_samples is not None else args.train_samples
        check.require(args.lr_warmup_samples <= decay_samples,
                      f"--lr-warmup-samples: {args.lr_warmup_samples} is longer than the decay "
                      f"({decay_samples} samples); shorten the warmup")
    # Iteration-based and sample-based schedule flags do not mix (Megatron would ignore one kind).
    if args.train_samples:
        check.require(args.lr_decay_iters is None and not args.lr_warmup_iters,
                      "--lr-decay-iters: with --train-samples give the schedule in samples: "
                      "--lr-decay-samples, --lr-warmup-samples (not --lr-decay-iters/--lr-warmup-iters)")
    else:
        check.require(args.lr_decay_samples is None and not args.lr_warmup_samples,
                      "--lr-decay-samples: --lr-decay-samples/--lr-warmup-samples go with --train-samples; "
                      "with --train-iters use --lr-decay-iters/--lr-warmup-iters")
    check.require(not (args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler),
                  "--override-opt_param-scheduler: give it or --use-checkpoint-opt_param-scheduler, not "
                  "both (this run's schedule, or the checkpoint's)")


def _data_file_problem(path):
    """Why the data path `path` names nothing on disk (None when it does): a Megatron prefix
    (PREFIX.bin/.idx), a .jsonl/.tsv/.mindrecord file, or a shard of a MindRecord set (PATH0...)."""
    if path and (os.path.exists(path) or os.path.exists(path + ".idx") or glob.glob(glob.escape(path) + "[0-9]*")):
        return None
    return f"{path!r}: no such file (nor {path}.bin/.idx); check the path"


def _check_data(args, check, world_size):
    from rapidgpt.data.dataset_builder import parse_data_path
    try:
        parse_split(args.split)
    except ValueError as e:
        check.add(f"--split: {e}")
    for name in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        value = getattr(args, name)
        if not value:
            continue
        if args.task in ("sequence_classification", "sft") or args.sft:   # files, read one after the other
            paths = value.split() if isinstance(value, str) else list(value)     # (as Megatron's --valid-data)
        else:
            try:
                paths = parse_data_path(value, _flag(name))[0]
            except ValueError as e:
                check.add(f"{_flag(name)}: {e}" if not str(e).startswith(_flag(name)) else str(e))
                continue
        for path in paths:
            problem = _data_file_problem(path)
            check.require(problem is None, f"{_flag(name)}: {problem}")
    sources = [flag for flag, given in (("--mock-data", args.mock_data), ("--data-path", args.data_path),
                                        ("--train-data-path", args.train_data_path or args.valid_data_path
                                         or args.test_data_path)) if given]
    if args.mock_data:          # Megatron: "A single data source must be provided"
        check.require(len(sources) == 1, f"--mock-data: give one data source, not {' and '.join(sources)}")
        check.require(args.tokenizer_type, "--mock-data: the mock documents end with the tokenizer's "
                                           "end-of-document id; give --tokenizer-type (e.g. NullTokenizer "
                                           "--vocab-size N)")
        check.require(args.task in (None, "pretraining"),
                      f"--mock-data: Megatron's mock documents are GPT pretraining data, not --task {args.task}'s")
    if args.tokenizer_type == "NullTokenizer":
        if check.require(args.vocab_size and args.vocab_size > 0,
                         "--vocab-size: required for --tokenizer-type NullTokenizer (the data's token ids are "
                         "below it); give --vocab-size N"):
            eod = args.null_tokenizer_eod_id
            check.require(eod is None or 0 <= eod < args.vocab_size,
                          f"--null-tokenizer-eod-id: {eod} is not below --vocab-size {args.vocab_size}")
    elif args.tokenizer_type in MODEL_TOKENIZER_TYPES:
        check_tokenizer_model(args.tokenizer_type, args.tokenizer_model, check)
    elif args.tokenizer_type:
        kind = args.tokenizer_type
        if check.require(args.vocab_file, f"--vocab-file: required for --tokenizer-type {kind}; give "
                                          f"the tokenizer's {'vocab.json' if kind == 'GPT2BPETokenizer' else 'vocab.txt'}"):
            check.require(os.path.isfile(args.vocab_file), f"--vocab-file: {args.vocab_file}: no such file; "
                                                           f"check the path")
        if kind == "GPT2BPETokenizer" and check.require(
                args.merge_file, "--merge-file: required for --tokenizer-type GPT2BPETokenizer; give the "
                                 "merges.txt that goes with --vocab-file"):
            check.require(os.path.isfile(args.merge_file), f"--merge-file: {args.merge_file}: no such file; "
                                                           f"check the path")
    check.messages += tiktoken_flag_problems(args)
    check.require(args.num_workers >= 0, f"--num-workers: must be >= 0, got {args.num_workers}")


def _check_checkpointing(args, check, world_size):
    from rapidgpt.training.checkpoint_files import save_dir_problem
    if args.save:
        problem = save_dir_problem(args.save)
        check.require(problem is None, f"--save: {args.save}: {problem}")
    check.require(args.save_interval is None or (args.save_interval > 0 and args.save),
                  "--save-interval: needs --save DIR and a positive interval")
    for name in ("exit_interval", "exit_duration_in_mins", "keep_last_n_checkpoints"):
        value = getattr(args, name)
        check.require(value is None or value > 0, f"{_flag(name)}: must be positive, got {value}")
    retain = args.save_retain_interval
    check.require(retain is None or (args.save and args.save_interval and retain > 0
                                     and retain % args.save_interval == 0),
                  f"--save-retain-interval: {retain} must be a positive multiple of --save-interval "
                  f"({args.save_interval}), with --save DIR")
    check.require(not (args.skip_train and not args.load),
                  "--skip-train: evaluates a checkpoint; give --load DIR")
    check.require(not (args.finetune and not args.load), "--finetune: loads weights; give --load DIR")
    if args.predictions_file:
        folder = os.path.dirname(os.path.abspath(args.predictions_file))
        check.require(args.task == "sequence_classification",
                      "--predictions-file: written by --task sequence_classification; remove it")
        check.require(os.path.isdir(folder), f"--predictions-file: no such directory {folder}; create it "
                                             f"or write the file elsewhere")


def _check_task(args, check, world_size):
    check.require(args.num_classes is None or args.num_classes >= 2,
                  f"--num-classes: must be >= 2, got {args.num_classes}")
    check.require(not (args.calculate_per_token_loss and args.task == "sequence_classification"),
                  "--calculate-per-token-loss: --task sequence_classification's loss is a mean over samples, "
                  "not tokens; drop the flag")
    if args.task in ("pretraining", "sft"):
        check.require(args.train_iters,
                      f"--train-iters: --task {args.task} needs the training length; give --train-iters "
                      "(or --train-samples)")
        check.require(not (args.data_path or args.train_data_path) or args.tokenizer_type or args.vocab_size
                      or args.vocab_file,        # a vocab.json without merges: named by _infer_tokenizer_type
                      "--tokenizer-type: pretraining on --data-path needs its vocabulary; give --tokenizer-type "
                      "with --vocab-file (and --merge-file) or --tokenizer-model, or --vocab-size if the data "
                      "holds token ids only")
    if args.task == "text_generation":
        check.require(args.load, "--load: text generation needs the checkpoint to generate with; give --load DIR")
        check.require(args.prompt or args.prompts_file,
                      "--prompt: text generation needs --prompt TEXT or --prompts-file FILE")
    if args.task == "sequence_classification":
        evaluating = args.skip_train and args.load
        check.require(evaluating or args.data_path or args.train_data_path,
                      "--data-path: --task sequence_classification needs the training data; give "
                      "--data-path TRAIN.jsonl|.tsv (or --skip-train --load DIR to evaluate)")
        check.require(not (args.data_path and args.train_data_path),
                      "--train-data-path: give the training data with --data-path or --train-data-path, "
                      "not both")
        check.require(evaluating or args.epochs or args.train_iters,
                      "--epochs: --task sequence_classification needs --epochs N (or --train-iters)")
        check.require(not evaluating or args.valid_data_path,
                      "--valid-data-path: --skip-train evaluates on the validation data; give "
                      "--valid-data-path FILE.jsonl|.tsv")
        check.require(args.tokenizer_type,
                      "--tokenizer-type: sequence classification reads text; give --pretrained-checkpoint (or "
                      "--load) of a checkpoint that records its tokenizer, or --tokenizer-type/--vocab-file"
                      "/--merge-file")
        check.require(args.best_metric in (None, "accuracy", "f1"),
                      f"--best-metric: {args.best_metric}: sequence_classification reports accuracy and "
                      f"f1; choose one")


def _check_generation(args, check, world_size):
    check.require(args.max_new_tokens >= 0, f"--max-new-tokens: must be >= 0, got {args.max_new_tokens}")
    check.require(args.top_k >= 0, f"--top-k: must be >= 0 (0: greedy), got {args.top_k}")
    check.require(args.temperature > 0, f"--temperature: must be positive, got {args.temperature}")
    check.require(0.0 <= args.top_p <= 1.0, f"--top-p: must be in [0, 1] (0: off), got {args.top_p}")
    check.require(args.prompts_file is None or os.path.isfile(args.prompts_file),
                  f"--prompts-file: {args.prompts_file}: no such file; check the path")
