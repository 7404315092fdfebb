"""The flags of Megatron's replica checks (rapidgpt/training/replica_checks.py: what they compare and how)."""


def add_replica_check_args(parser):
    g = parser.add_argument_group("replica checks", "Megatron's checks that the ranks' copies of a weight agree")
    g.add_argument("--test-mode", action="store_true",
                   help="after every iteration, check that the q/k norm weights (--qk-layernorm), and multi-latent "
                        "attention's down projections and latent norms, are the same on every tensor- and "
                        "data-parallel rank (Megatron's real-time test)")
    g.add_argument("--check-weight-hash-across-dp-replicas-interval", type=int, default=None,
                   help="every N iterations, check that every model weight is the same on each data-parallel rank")


def check_replica_check_args(args, check):
    interval = args.check_weight_hash_across_dp_replicas_interval
    check.require(interval is None or interval > 0,
                  f"--check-weight-hash-across-dp-replicas-interval: must be positive, got {interval}")
    check.require(interval is None or args.zero.stage != 3,
                  "--check-weight-hash-across-dp-replicas-interval: under ZeRO-3 the data-parallel ranks hold "
                  "different pieces of each weight, not copies; drop one of the two")
