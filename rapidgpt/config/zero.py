"""ZeRO optimizer sharding: its flags (Rapidformer's and Megatron's spellings) and its config.

    --zero-1-memory-optimization, --use-distributed-optimizer   stage 1: optimizer state sharded
    --zero-2-memory-optimization                                stage 2: also the gradients
    --zero-3-memory-optimization, --fsdp-memory-optimization,   stage 3: also the parameters
    --use-torch-fsdp2

over each pipeline stage's data-parallel group (stages 1 and 2: rapidgpt/optim/distributed_optimizer.py;
stage 3: rapidgpt/parallel/fully_sharded.py, for models built of RapidGPT's layers);
data_tools/estimate_memory.py estimates what every stage holds (rapidgpt/theoretical_memory.py).
"""
from dataclasses import dataclass

STAGE_OF_FLAG = {"--zero-1-memory-optimization": 1, "--use-distributed-optimizer": 1,
                 "--zero-2-memory-optimization": 2, "--zero-3-memory-optimization": 3,
                 "--fsdp-memory-optimization": 3, "--use-torch-fsdp2": 3}


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


def _given(args):
    return [flag for flag in STAGE_OF_FLAG if getattr(args, _dest(flag))]


def _check_one_stage(args, check):
    given = _given(args)
    check.require(len({STAGE_OF_FLAG[flag] for flag in given}) <= 1,
                  f"{given[-1] if given else ''}: {', '.join(given)} ask for different ZeRO stages; give one")


def check_zero_args(args, check):
    """Validate into `check` (a flag_parser.Problems) and set `args.zero` (a ZeroConfig)."""
    _check_one_stage(args, check)
    args.zero = ZeroConfig.from_args(args)
