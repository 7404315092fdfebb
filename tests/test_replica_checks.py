"""Megatron's replica checks (rapidgpt/training/replica_checks.py): which ranks must agree, and
that a differing copy is found and named. Their runs on TP=2 and DP=2: tests/test_llama.py."""
import numpy as np
import pytest

from rapidgpt.arguments import parse_args
from rapidgpt.parallel.state import ParallelState
from rapidgpt.training.replica_checks import ReplicaChecks, ReplicaMismatchError, first_mismatch


def test_the_first_differing_copy_is_found_within_a_group_only():
    rows = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [9, 9, 9, 9], [9, 9, 7, 9]], np.float64)   # 2 weights, 2 words each
    assert first_mismatch(rows, lambda r: r // 2) == (1, 2, 3)          # ranks 2 and 3, the second weight
    assert first_mismatch(rows[:3], lambda r: r // 2) is None            # ranks 0, 1 agree; 2 is alone
    assert first_mismatch(rows, lambda r: 0) == (0, 0, 2)


def groups(zero_stage):
    """[the q/k norms' group key of each rank, every weight's] on 8 ranks, TP=2 x DP=2 x PP=2."""
    class Args:
        test_mode, check_weight_hash_across_dp_replicas_interval = True, 1
        zero = type("Zero", (), {"stage": zero_stage})

    state = ParallelState(world_size=8, rank=0, tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    checks = ReplicaChecks(Args, type("Model", (), {"get_parameters": lambda self: []})(), state)
    seen = []
    checks._compare = lambda params, iteration, flag, kind, group_of: seen.append([group_of(r) for r in range(8)])
    checks.norms = ["a q/k norm"]
    checks.after_iteration(3)
    return [[r for r in range(8) if keys[r] == keys[0]] for keys in seen]      # rank 0's group of each


def test_the_groups_are_the_ranks_holding_copies():
    """The q/k norms are copied over TP and DP within a stage (under ZeRO-3 only over TP: DP ranks
    hold pieces); every weight over DP, per TP rank and stage."""
    assert groups(0) == [[0, 1, 2, 3], [0, 2]]
    assert groups(3)[0] == [0, 1]


def test_a_hash_check_under_zero_3_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "pretraining", "--train-iters", "2", "--zero-3-memory-optimization",
                         "--check-weight-hash-across-dp-replicas-interval", "5"])
    assert ("--check-weight-hash-across-dp-replicas-interval: under ZeRO-3 the data-parallel ranks hold different "
            "pieces of each weight, not copies") in capsys.readouterr().err
    assert issubclass(ReplicaMismatchError, RuntimeError)
