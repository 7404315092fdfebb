"""ZeRO optimizer sharding: its flags (Rapidformer's and Megatron's spellings) and its config.

    --zero-1-memory-optimization, --use-distributed-optimizer   stage 1: optimizer state sharded
    --zero-2-memory-optimization                                stage 2: also the gradients
    --zero-3-memory-optimization, --fsdp-memory-optimization,   stage 3: also the parameters
    --use-torch-fsdp2
    --use-megatron-fsdp                                         the stage its --data-parallel-sharding-strategy
                                                                names (optim: 1, optim_grads: 2,
                                                                optim_grads_params: 3, its default)

over each pipeline stage's data-parallel group (stages 1 and 2: rapidgpt/optim/distributed_optimizer.py;
stage 3: rapidgpt/parallel/fully_sharded.py, for models built of RapidGPT's layers);
data_tools/estimate_memory.py estimates what every stage holds (rapidgpt/theoretical_memory.py).
"""
from dataclasses import dataclass

STAGE_OF_FLAG = {"--zero-1-memory-optimization": 1, "--use-distributed-optimizer": 1,
                 "--zero-2-memory-optimization": 2, "--zero-3-memory-optimization": 3,
                 "--fsdp-memory-optimization": 3, "--use-torch-fsdp2": 3}


# Megatron-FSDP's sharding strategies, as ZeRO stages: what each one shards is what that stage shards.
STAGE_OF_SHARDING_STRATEGY = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
FSDP_DTYPES = ("fp32", "bf16", "fp16", "auto")


def _dest(flag):
    return flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class ZeroConfig:
    """stage: 0 (no sharding) to 3; flag: the flag that asked for it (for messages)."""
    stage: int = 0
    flag: str = ""

    @classmethod
    def from_args(cls, args):
        """The stage the flags ask for (the highest when several are given; check_zero_args
        reports a conflict)."""
        if args.use_megatron_fsdp:
            return cls(STAGE_OF_SHARDING_STRATEGY[args.data_parallel_sharding_strategy], "--use-megatron-fsdp")
        given = sorted(_given(args), key=STAGE_OF_FLAG.get)
        return cls(STAGE_OF_FLAG[given[-1]], given[-1]) if given else cls()

    def describe(self):
        return f"ZeRO stage {self.stage}" if self.stage else "no ZeRO"


def add_zero_args(parser):
    g = parser.add_argument_group(
        "ZeRO optimizer sharding",
        "Shard model states over the data-parallel ranks (stage 3 needs a model built of RapidGPT's layers; "
        "1 and 2 work with any model). data_tools/estimate_memory.py shows the memory each stage takes")
    g.add_argument("--zero-1-memory-optimization", action="store_true",
                   help="ZeRO stage 1: each data-parallel rank keeps its shard of the optimizer state")
    g.add_argument("--use-distributed-optimizer", action="store_true",
                   help="Megatron's name for ZeRO stage 1")
    g.add_argument("--zero-2-memory-optimization", action="store_true",
                   help="ZeRO stage 2: also the gradients are sharded")
    g.add_argument("--zero-3-memory-optimization", action="store_true",
                   help="ZeRO stage 3: also the parameters are sharded, each layer's gathered for its forward "
                        "and backward")
    g.add_argument("--fsdp-memory-optimization", action="store_true",
                   help="Rapidformer's FSDP switch: the same as ZeRO stage 3")
    g.add_argument("--use-torch-fsdp2", action="store_true",
                   help="Megatron's PyTorch-FSDP2 switch: FSDP2 shards the parameters, gradients and optimizer "
                        "state over the data-parallel ranks, gathering each layer's parameters for its forward "
                        "and backward: ZeRO stage 3")
    g.add_argument("--use-megatron-fsdp", action="store_true",
                   help="Megatron-FSDP: the ZeRO stage of --data-parallel-sharding-strategy (it implies "
                        "--use-distributed-optimizer, as Megatron-FSDP v1 does)")
    g.add_argument("--data-parallel-sharding-strategy", choices=list(STAGE_OF_SHARDING_STRATEGY),
                   default="optim_grads_params",
                   help="with --use-megatron-fsdp: what is sharded over the data-parallel ranks: no_shard "
                        "(nothing), optim (optimizer state: ZeRO-1), optim_grads (and gradients: ZeRO-2), "
                        "optim_grads_params (and parameters: ZeRO-3; the default)")
    g.add_argument("--megatron-fsdp-main-params-dtype", choices=FSDP_DTYPES, default="fp32",
                   help="with --use-megatron-fsdp: the main (optimizer) weights' dtype; fp32 here (auto: the "
                        "model's dtype, so fp32 runs only)")
    g.add_argument("--megatron-fsdp-main-grads-dtype", choices=FSDP_DTYPES, default="auto",
                   help="with --use-megatron-fsdp: the dtype gradients are summed over micro-batches in (auto: "
                        "the model's): fp32 in a 16-bit run is --accumulate-allreduce-grads-in-fp32, bf16 in a "
                        "bf16 run is --grad-reduce-in-bf16")
    g.add_argument("--megatron-fsdp-grad-comm-dtype", choices=FSDP_DTYPES, default="auto",
                   help="with --use-megatron-fsdp: the dtype gradients are reduced over the data-parallel ranks "
                        "in (auto: --megatron-fsdp-main-grads-dtype's); the same as the main gradients' here")


def _given(args):
    return [flag for flag in STAGE_OF_FLAG if getattr(args, _dest(flag))]


def _check_one_stage(args, check):
    given = _given(args)
    check.require(len({STAGE_OF_FLAG[flag] for flag in given}) <= 1,
                  f"{given[-1] if given else ''}: {', '.join(given)} ask for different ZeRO stages; give one")


def _model_dtype(args):
    return "fp16" if args.fp16 or args.mixed_precision else "bf16" if args.bf16 else "fp32"


def _check_megatron_fsdp(args, check):
    """Megatron-FSDP's flags as the ZeRO stage and the precision flags that do what they ask.
    Runs before the precision flags are checked: it sets --accumulate-allreduce-grads-in-fp32 or
    --grad-reduce-in-bf16, the gradient dtypes Megatron-FSDP's buffers would hold."""
    fsdp_only = {"--data-parallel-sharding-strategy": "optim_grads_params", "--megatron-fsdp-main-params-dtype": "fp32",
                 "--megatron-fsdp-main-grads-dtype": "auto", "--megatron-fsdp-grad-comm-dtype": "auto"}
    if not args.use_megatron_fsdp:
        for flag, default in fsdp_only.items():
            check.require(getattr(args, _dest(flag)) == default,
                          f"{flag}: takes effect with --use-megatron-fsdp only (Megatron ignores it without); "
                          f"add --use-megatron-fsdp or remove {flag}")
        return
    others = [flag for flag in _given(args) if flag != "--use-distributed-optimizer"]    # FSDP v1 implies it
    check.require(not others, f"--use-megatron-fsdp: {', '.join(others)} also set a ZeRO stage; give "
                              f"--data-parallel-sharding-strategy with --use-megatron-fsdp, or the other flag alone")
    model = _model_dtype(args)
    params = model if args.megatron_fsdp_main_params_dtype == "auto" else args.megatron_fsdp_main_params_dtype
    check.require(params == "fp32", f"--megatron-fsdp-main-params-dtype: {params} main weights are not built (the "
                                    f"optimizer updates fp32 main weights); give fp32")
    grads = model if args.megatron_fsdp_main_grads_dtype == "auto" else args.megatron_fsdp_main_grads_dtype
    comm = grads if args.megatron_fsdp_grad_comm_dtype == "auto" else args.megatron_fsdp_grad_comm_dtype
    if grads != comm or grads not in ("fp32", model):
        check.add(f"--megatron-fsdp-main-grads-dtype: gradients summed in {grads} and reduced in {comm} in a {model} "
                  f"run are not built: RapidGPT sums and reduces them in one dtype, fp32 or the model's; give "
                  f"--megatron-fsdp-main-grads-dtype fp32 (or auto) and leave --megatron-fsdp-grad-comm-dtype auto")
        return
    strategy = args.data_parallel_sharding_strategy
    args.megatron_flag_lines = [*getattr(args, "megatron_flag_lines", ()),      # one start-up line
                                f" > --use-megatron-fsdp --data-parallel-sharding-strategy {strategy}: ZeRO stage "
                                f"{STAGE_OF_SHARDING_STRATEGY[strategy]}, gradients summed and reduced in {grads}"]
    if grads == "fp32":
        check.require(not args.grad_reduce_in_bf16, "--grad-reduce-in-bf16: Megatron-FSDP's gradients are fp32 "
                                                    "(--megatron-fsdp-main-grads-dtype); give one or the other")
        args.accumulate_allreduce_grads_in_fp32 = True
    elif model == "fp16":
        check.require(not args.accumulate_allreduce_grads_in_fp32,
                      "--accumulate-allreduce-grads-in-fp32: Megatron-FSDP's gradients are fp16 "
                      "(--megatron-fsdp-main-grads-dtype auto); give --megatron-fsdp-main-grads-dtype fp32 instead")
    elif model == "bf16":
        args.grad_reduce_in_bf16 = True


def check_zero_args(args, check):
    """Validate into `check` (a flag_parser.Problems) and set `args.zero` (a ZeroConfig). Before the
    precision flags' check (see _check_megatron_fsdp)."""
    _check_megatron_fsdp(args, check)
    if not args.use_megatron_fsdp:
        _check_one_stage(args, check)
    args.zero = ZeroConfig.from_args(args)
    # Measured (MindSpore 2.10, CPU): TP=2 x DP=2 with ZeRO-3 stopped at the first step in a ring
    # all-reduce of mismatched sizes ("Memcpy error, dest size is 96, src size is 3072"): the TP
    # group's sequence gathers and scatters and the DP group's weight gathers, independent branches
    # of the backward, met out of order. ZeRO-1 with it ran (by hand, TP=2 x DP=2).
    check.require(not (args.zero.stage == 3 and args.sequence_parallel),
                  f"--sequence-parallel: not with ZeRO-3 ({args.zero.flag}) in this build (their collectives met "
                  f"out of order on MindSpore 2.10); use ZeRO-1 or ZeRO-2 with it, or ZeRO-3 without it")
