"""Every flag of Megatron-LM's arguments.py has an answer (rapidgpt/config/megatron_flags.py): a
RapidGPT flag, an implementation choice (accepted, one start-up line) or a refusal naming the
feature; none is "unknown". The README's section is the table's own text."""
from pathlib import Path

import pytest

from rapidgpt.arguments import parse_args
from rapidgpt.config.implementation_choices import implementation_choice_lines
from rapidgpt.config.megatron_flag_shapes import SHAPES
from rapidgpt.config.megatron_flags import answer, answers, markdown, rapidgpt_flags

README = Path(__file__).resolve().parent.parent / "README.md"
BASE = ["--task", "pretraining", "--train-iters", "4"]


def given(options, kind, nargs, value_type):
    """A command line giving the flag a value other than Megatron's default."""
    if kind != "store":
        return [options[0]]
    value = {"int": "7", "float": "0.25"}.get(value_type, "other")
    return [options[0]] + [value] * (nargs if isinstance(nargs, int) else 1)


TABLE_FLAGS = [row for row in SHAPES if not rapidgpt_flags().intersection(row[0])]


def test_every_megatron_flag_is_answered():
    table = answers(rapidgpt_flags())
    assert len(table) == sum(len(row[0]) for row in SHAPES) > 800
    assert [flag for flag, verdict in table.items() if verdict is None] == []
    kinds = {kind for kind, _ in table.values()}
    assert kinds == {"rapidgpt", "implementation", "refused"}


def test_each_flag_given_is_accepted_with_a_line_or_refused_with_its_reason(capsys):
    """All of the table's flags at once, each with a value other than Megatron's default: one line
    per refused flag, naming it and the feature; one start-up line per implementation choice; no
    flag unknown."""
    argv = BASE + [item for options, kind, nargs, value_type, _, _ in TABLE_FLAGS
                   for item in given(options, kind, nargs, value_type)]
    with pytest.raises(SystemExit) as e:
        parse_args(argv=argv)
    assert e.value.code == 2
    errors = capsys.readouterr().err.strip().split("\n")[:-1]
    refused = [row for row in TABLE_FLAGS if answer(row[0][0], row[5])[0] == "refused"]
    expected = [f"rapidgpt: error: {options[0]}: refused: {answer(options[0], group)[1]}; remove it"
                for options, _, _, _, _, group in refused]
    assert sorted(errors) == sorted(expected)
    assert not any("unknown flag" in line for line in errors)


def test_implementation_choices_are_accepted_with_one_line_and_leave_no_trace():
    choices = [row for row in TABLE_FLAGS if answer(row[0][0], row[5])[0] == "implementation"]
    argv = BASE + [item for options, kind, nargs, value_type, _, _ in choices
                   for item in given(options, kind, nargs, value_type)]
    args = parse_args(argv=argv)
    lines = implementation_choice_lines(args)
    for options, _, _, _, _, group in choices:
        assert f" > {options[0]}: accepted; {answer(options[0], group)[1]}" in lines
    assert not [name for name in vars(args) if name.startswith("megatron_flag__")]    # not in checkpoints


@pytest.mark.parametrize("argv", [["--exit-signal", "SIGTERM"], ["--moe-router-topk", "2"],
                                  ["--num-dataset-builder-threads", "1"], ["--mid-level-dataset-surplus", "0.005"]])
def test_a_refused_flag_given_megatrons_default_passes(argv):
    args = parse_args(argv=BASE + argv)
    assert not [line for line in implementation_choice_lines(args) if argv[0] in line]


def test_values_of_refused_flags_that_ask_for_what_rapidgpt_does_are_accepted_with_one_line(capsys):
    """--spec local (the built-in layers); its other values stay refused."""
    args = parse_args(argv=BASE + ["--spec", "local"])
    lines = implementation_choice_lines(args)
    assert [line.split(":")[0] for line in lines] == [" > --spec local"]
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--spec", "my.module", "my_spec"])
    err = capsys.readouterr().err
    assert "--spec: refused: custom layer" in err


def test_megatrons_other_checkpoint_formats_get_a_reason_not_a_choices_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--ckpt-format", "torch_dcp"])
    err = capsys.readouterr().err
    assert "--ckpt-format torch_dcp: refused: " in err and "not one of the choices" not in err


def test_recompute_num_layers_without_a_granularity_is_ignored_as_megatron_does():
    """Megatron accepts it alone and does nothing with it (a functional-test config gives it so)."""
    args = parse_args(argv=BASE + ["--recompute-num-layers", "1"])
    assert args.recompute.granularity is None
    assert " > --recompute-num-layers: accepted; no effect without --recompute-granularity full, as in " \
           "Megatron" in implementation_choice_lines(args)


FSDP = ["--use-megatron-fsdp", "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]


@pytest.mark.parametrize("argv, stage, fp32_grads, bf16_grads", [
    (["--use-torch-fsdp2"], 3, True, False),
    (FSDP, 3, True, False),                                    # an fp32 run: everything in fp32
    (FSDP + ["--fp16"], 3, False, False),                      # auto: the model's fp16
    (FSDP + ["--fp16", "--megatron-fsdp-main-grads-dtype", "fp32"], 3, True, False),
    (FSDP + ["--bf16"], 3, False, True),                       # auto: the model's bf16 (Megatron's default is fp32)
    (FSDP + ["--bf16", "--megatron-fsdp-main-grads-dtype", "fp32", "--megatron-fsdp-grad-comm-dtype", "fp32"],
     3, True, False),
    (FSDP + ["--data-parallel-sharding-strategy", "optim_grads"], 2, True, False),
    (FSDP + ["--data-parallel-sharding-strategy", "optim"], 1, True, False),
    (FSDP + ["--data-parallel-sharding-strategy", "no_shard"], 0, True, False)])
def test_megatron_fsdp_is_the_zero_stage_of_its_sharding_strategy(argv, stage, fp32_grads, bf16_grads):
    """Megatron-FSDP (v1, which implies --use-distributed-optimizer) shards what its strategy names,
    the ZeRO stage that shards the same; its main-gradient dtype is the dtype the gradients are
    summed and reduced in; its checkpoint format is RapidGPT's (layout-free) one, with a line."""
    args = parse_args(argv=BASE + argv)
    assert args.zero.stage == stage
    assert (args.accumulate_allreduce_grads_in_fp32, args.grad_reduce_in_bf16) == (fp32_grads, bf16_grads)
    if "fsdp_dtensor" in argv:
        assert args.ckpt_format == "ckpt"
        lines = implementation_choice_lines(args)
        assert [line.split(":")[0] for line in lines] == [" > --ckpt-format fsdp_dtensor",
                                                          " > --use-megatron-fsdp --data-parallel-sharding-strategy "
                                                          + args.data_parallel_sharding_strategy]


@pytest.mark.parametrize("argv, message", [
    (FSDP + ["--bf16", "--megatron-fsdp-grad-comm-dtype", "fp32"],
     "--megatron-fsdp-main-grads-dtype: gradients summed in bf16 and reduced in fp32 in a bf16 run are not built"),
    (FSDP + ["--fp16", "--megatron-fsdp-main-grads-dtype", "bf16"],
     "--megatron-fsdp-main-grads-dtype: gradients summed in bf16 and reduced in bf16 in a fp16 run are not built"),
    (FSDP + ["--bf16", "--megatron-fsdp-main-params-dtype", "auto"],
     "--megatron-fsdp-main-params-dtype: bf16 main weights are not built"),
    (FSDP + ["--zero-2-memory-optimization"], "--use-megatron-fsdp: --zero-2-memory-optimization also set a ZeRO stage"),
    (FSDP + ["--fp16", "--accumulate-allreduce-grads-in-fp32"],
     "--accumulate-allreduce-grads-in-fp32: Megatron-FSDP's gradients are fp16"),
    (["--data-parallel-sharding-strategy", "optim"],
     "--data-parallel-sharding-strategy: takes effect with --use-megatron-fsdp only"),
    (FSDP + ["--nproc-per-node", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "--sequence-parallel: not with ZeRO-3 (--use-megatron-fsdp)"),
    (["--use-torch-fsdp2", "--nproc-per-node", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "--sequence-parallel: not with ZeRO-3 (--use-torch-fsdp2)"),
    (FSDP + ["--megatron-fsdp-version", "2"], "--megatron-fsdp-version: refused: this Megatron-FSDP / FSDP2 option")])
def test_what_megatron_fsdp_asks_that_is_not_built_is_refused_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + argv)
    err = capsys.readouterr().err
    assert f"rapidgpt: error: {message}" in err, err


def test_a_refused_flag_names_the_feature(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--num-experts", "8", "--fp8-format", "hybrid", "--expert-model-parallel-size", "2"])
    err = capsys.readouterr().err
    assert "--num-experts: refused: mixture of experts (MoE) is not built" in err
    assert "--expert-model-parallel-size: refused: mixture of experts (MoE) is not built" in err
    assert "--fp8-format: refused: FP8/FP4 training is not built" in err


def test_a_misspelt_flag_is_never_pointed_at_a_hidden_megatron_flag(capsys):
    with pytest.raises(SystemExit):
        parse_args(argv=BASE + ["--moe-router-topks", "2"])
    err = capsys.readouterr().err
    assert "--moe-router-topks: unknown flag; remove it, or check its spelling" in err


def test_the_readme_section_is_the_tables_text():
    section = markdown(rapidgpt_flags())
    assert section in README.read_text(encoding="utf-8"), \
        "README's Megatron-LM flags section is stale: paste `python -m rapidgpt.config.megatron_flags`"
