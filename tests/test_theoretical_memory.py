"""The memory estimator (rapidgpt/theoretical_memory.py, data_tools/estimate_memory.py) against
the papers' formulas and against the parameters the built-in GPT really has."""
import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data_tools"))
import estimate_memory  # noqa: E402

from rapidgpt.theoretical_memory import (GPTShape, RunLayout, layer_activation_bytes,  # noqa: E402
                                         megatron_paper_parameters, model_state_bytes, stage_parameters)

# Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters"), Table 1:
# (billions of parameters as printed, attention heads, hidden size, layers); V = 51,200, s = 2,048.
MEGATRON_TABLE_1 = [(1.7, 24, 2304, 24), (3.6, 32, 3072, 30), (7.5, 32, 4096, 36), (18.4, 48, 6144, 40),
                    (39.1, 64, 8192, 48), (76.1, 80, 10240, 60), (145.6, 96, 12288, 80), (310.1, 128, 16384, 96),
                    (529.6, 128, 20480, 105), (1008.0, 160, 25600, 128)]


def estimate_json(capsys, *flags):
    assert estimate_memory.main([*flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def paper_formula(l, h, V, s):
    """P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)), written as in the paper."""
    return 12 * l * h ** 2 * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


@pytest.mark.parametrize("billions, heads, hidden, layers", MEGATRON_TABLE_1)
def test_parameters_of_the_megatron_table_1_models(capsys, billions, heads, hidden, layers):
    found = estimate_json(capsys, "--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads",
                          str(heads), "--seq-length", "2048", "--vocab-size", "51200", "--world-size", "1")
    formula = paper_formula(layers, hidden, 51200, 2048)
    assert round(formula / 1e9, 1) == pytest.approx(billions, abs=0.11)      # the table's rounding
    assert megatron_paper_parameters(layers, hidden, 51200, 2048) == round(formula)
    # The formula leaves out the final LayerNorm (2h); everything else is counted alike.
    assert found["parameters"] == round(formula) + 2 * hidden


def test_zero_paper_example_model_states(capsys):
    """ZeRO paper, Figure 1: Psi = 7.5B, N = 64, mixed-precision Adam (K = 12): 120 / 31.4 / 16.6 /
    1.9 GB per device for no ZeRO and stages 1, 2, 3."""
    fp16 = RunLayout(data_parallel=64, params_bytes=2, grad_bytes=2, optimizer_bytes=12)
    gigabytes = [sum(model_state_bytes(7.5e9, RunLayout(**{**fp16.__dict__, "zero_stage": z}))) / 1e9
                 for z in range(4)]
    assert [round(g, 1) for g in gigabytes] == [120.0, 31.4, 16.6, 1.9]
    # Through the command line, for a GPT of about 7.5B parameters: the paper's formulas at its Psi.
    flags = ["--num-layers", "36", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "1024",
             "--vocab-size", "51200", "--fp16", "--world-size", "64"]
    psi = estimate_json(capsys, *flags)["parameters"]
    assert psi == pytest.approx(7.5e9, rel=0.01)
    n = 64
    for formula, extra in zip((16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n),
                              ([], ["--zero-1-memory-optimization"], ["--zero-2-memory-optimization"],
                               ["--zero-3-memory-optimization"])):
        found = estimate_json(capsys, *flags, *extra)
        states = found["weight_bytes_per_rank"] + found["gradient_bytes_per_rank"] + found["optimizer_bytes_per_rank"]
        assert states == pytest.approx(formula, abs=16)           # a shard rounds up to whole elements


def test_megatron_and_fsdp_spellings_and_the_sharded_layout(capsys):
    base = ["--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "256",
            "--vocab-size", "1000", "--world-size", "8", "--tensor-model-parallel-size", "2",
            "--pipeline-model-parallel-size", "2"]
    assert estimate_json(capsys, *base, "--use-distributed-optimizer") == \
        estimate_json(capsys, *base, "--zero-1-memory-optimization")
    found = estimate_json(capsys, *base, "--fsdp-memory-optimization")
    assert found == estimate_json(capsys, *base, "--zero-3-memory-optimization")
    shape = GPTShape(8, 512, 8, 2048, 256, 256, 1024)          # 1000 padded to 128 x TP 2
    psi = [stage_parameters(shape, stage, 2, 2) for stage in (0, 1)]
    assert [st["parameters_per_model_parallel_rank"] for st in found["stages"]] == psi
    for st in found["stages"]:          # fp32 AdamW, DP = 8 / (2 x 2) = 2, everything sharded; the fp32
        shard = math.ceil(st["parameters_per_model_parallel_rank"] / 2)     # pieces are the main parameters
        assert st["parameters_per_rank"] == shard
        assert (st["weight_bytes_per_rank"], st["gradient_bytes_per_rank"], st["optimizer_bytes_per_rank"]) == \
            (4 * shard, 4 * shard, 8 * shard)


def test_activations_follow_korthikanti_et_al():
    """Reducing Activation Recomputation, Table 2: s b h (10 + 24/t) + 5 a s^2 b / t bytes per layer
    with tensor parallelism (16-bit, dropout), s b h (10 + 24/t) with selective recompute, and
    s b h 34/t + 5 a s^2 b / t with sequence parallelism."""
    shape = GPTShape(24, 2304, 24, 4 * 2304, 2048, 2048, 51200)
    s, b, h, a = 2048, 4, 2304, 24
    for t in (1, 2, 8):
        layout = RunLayout(tensor_parallel=t, micro_batch_size=b, params_bytes=2)
        assert layer_activation_bytes(shape, layout, 2) == pytest.approx(s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t)
        selective = RunLayout(**{**layout.__dict__, "recompute_granularity": "selective"})
        assert layer_activation_bytes(shape, selective, 2) == pytest.approx(s * b * h * (10 + 24 / t))
        sequence = RunLayout(**{**layout.__dict__, "sequence_parallel": True})
        assert layer_activation_bytes(shape, sequence, 2) == pytest.approx(s * b * h * 34 / t + 5 * a * s * s * b / t)


# Llama 3 8B (Megatron's examples/llama/train_llama3_8b_h100_fp8.sh) and Qwen2.5-0.5B (its
# config.json): their published parameter counts.
LLAMA3_8B = ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
             "--group-query-attention", "--num-query-groups", "8", "--kv-channels", "128", "--seq-length", "8192",
             "--max-position-embeddings", "8192", "--position-embedding-type", "rope", "--rotary-base", "500000",
             "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
             "--untie-embeddings-and-output-weights", "--vocab-size", "128256"]
QWEN25_05B = ["--num-layers", "24", "--hidden-size", "896", "--ffn-hidden-size", "4864", "--num-attention-heads", "14",
              "--group-query-attention", "--num-query-groups", "2", "--seq-length", "4096",
              "--max-position-embeddings", "32768", "--position-embedding-type", "rope", "--rotary-base", "1000000",
              "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--disable-bias-linear",
              "--add-qkv-bias", "--vocab-size", "151936"]


@pytest.mark.parametrize("flags, count", [(LLAMA3_8B, 8_030_261_248), (QWEN25_05B, 494_032_768)],
                         ids=["llama3-8b", "qwen2.5-0.5b"])
def test_parameters_of_llama_family_models(capsys, flags, count):
    assert estimate_json(capsys, *flags)["parameters"] == count


# Tiny models of each kind: GPT-2 tied and untied; Llama-style (RoPE, RMSNorm, SwiGLU, 6 heads in 2
# groups, no biases, untied); Qwen2-style (q/k/v biases, tied); Qwen3-style (q/k norms, head_dim
# 24 != 64/4, --apply-layernorm-1p with LayerNorm, learned positions off); multi-latent attention with
# both latents and their norms (GPT-2's learned positions kept), and without the query latent.
TINY_KINDS = [[], ["--untie-embeddings-and-output-weights"],
              ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--group-query-attention",
               "--num-query-groups", "2", "--num-attention-heads", "6", "--hidden-size", "48", "--disable-bias-linear",
               "--untie-embeddings-and-output-weights"],
              ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--group-query-attention",
               "--num-query-groups", "2", "--disable-bias-linear", "--add-qkv-bias"],
              ["--position-embedding-type", "none", "--qk-layernorm", "--kv-channels", "24", "--apply-layernorm-1p",
               "--group-query-attention", "--num-query-groups", "1"],
              ["--multi-latent-attention", "--q-lora-rank", "24", "--kv-lora-rank", "16", "--qk-head-dim", "8",
               "--qk-pos-emb-head-dim", "4", "--v-head-dim", "12", "--qk-layernorm"],
              ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
               "--v-head-dim", "12", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear"]]


@pytest.mark.parametrize("kind", TINY_KINDS, ids=["gpt2", "gpt2-untied", "llama", "qwen2", "qwen3", "mla",
                                                  "mla-no-q-latent"])
def test_the_built_in_gpt_has_the_estimated_parameters(capsys, kind):
    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    flags = ["--num-layers", "3", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "48", "--ffn-hidden-size", "96", "--vocab-size", "300", *kind]
    model = build_gpt_model(parse_args(argv=flags + ["--train-iters", "1"]), 300)
    real = sum(math.prod(p.shape) for p in model.get_parameters())
    assert estimate_json(capsys, *flags)["parameters"] == real


def test_bad_flags_are_named(capsys):
    with pytest.raises(SystemExit) as exit_:
        estimate_memory.main(["--num-layers", "2", "--zero-2-memory-optimization", "--zero-3-memory-optimization",
                              "--vocab-size", "10"])
    assert exit_.value.code == 2
    assert "ask for different ZeRO stages; give one" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        estimate_memory.main(["--num-layers", "2"])
    assert "--vocab-size: give it, or the tokenizer flags" in capsys.readouterr().err


def test_startup_line_says_which_stage_its_figures_are(capsys):
    """At PP 2 rank 0 (stage 0) prints, as Megatron's report_theoretical_memory does, the most loaded
    stage's figures (here the last stage's: the output layer and the logits), saying that they are
    that stage's, and its own stage's total beside them."""
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.theoretical_memory import estimate, format_bytes, layout_from_args, shape_from_args, startup_line
    flags = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "1000", "--train-iters", "1"]
    args = validate_args(build_parser().parse_args(flags + ["--pipeline-model-parallel-size", "2"]), world_size=2)
    result = estimate(shape_from_args(args, 1000), layout_from_args(args))
    assert result.largest_stage == 1
    line = startup_line(args, 1000)
    assert line.startswith(" > theoretical memory per rank of the most loaded pipeline stage (stage 1 of 2, TP=1, "
                           "DP=1, ZeRO stage 0): "), line
    assert f"total {format_bytes(result.stages[1]['total_bytes_per_rank'])}; " in line
    assert f"this rank's stage 0: total {format_bytes(result.stages[0]['total_bytes_per_rank'])}; " in line
    # Without pipelining there is one stage: the line is unchanged.
    single = validate_args(build_parser().parse_args(flags), world_size=1)
    assert startup_line(single, 1000).startswith(" > theoretical memory per rank (stage 0 of 1, TP=1, DP=1, "
                                                 "ZeRO stage 0): weights ")


def test_zero_3_parameters_per_rank_are_the_shard(capsys):
    """Under ZeRO-3 a rank holds 1/DP of its stage's parameters (outside the layer being gathered):
    parameters_per_rank and the table's parameters/rank are that shard; the unsharded count is
    labelled apart."""
    flags = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "1000", "--world-size", "4"]
    whole = estimate_json(capsys, *flags)["parameters_per_rank"]
    found = estimate_json(capsys, *flags, "--zero-3-memory-optimization")
    shard = math.ceil(whole / 4)
    assert found["parameters_per_rank"] == shard and found["parameters_per_model_parallel_rank"] == whole
    assert found["weight_bytes_per_rank"] == 4 * shard
    assert estimate_memory.main(flags + ["--zero-3-memory-optimization"]) == 0
    header, row = capsys.readouterr().out.splitlines()[-2:]
    assert header.split()[:3] == ["stage", "parameters/rank", "before-ZeRO-3"]
    assert row.split()[:3] == ["0", f"{shard:,}", f"{whole:,}"]
    assert estimate_memory.main(flags) == 0                     # without ZeRO-3 there is one count
    header, row = capsys.readouterr().out.splitlines()[-2:]
    assert header.split()[:3] == ["stage", "parameters/rank", "weights"] and row.split()[1] == f"{whole:,}"


def test_log_throughput_uses_megatrons_flops_formula():
    """GPT-2: the Megatron-LM paper's 72 B s l h^2 (1 + s/(6h)) + 6 B s h V; Llama 3 8B's flags:
    attention (1 + g/a + s/h) per h^2 and the gated MLP's 3/2 (Megatron's num_floating_point_operations)."""
    from rapidgpt.theoretical_memory import training_flops
    shape = GPTShape(24, 2304, 24, 4 * 2304, 2048, 2048, 51200)
    b, s, l, h, v = 8, 2048, 24, 2304, 51200
    assert training_flops(shape, b) == pytest.approx(72 * b * s * l * h * h * (1 + s / (6 * h)) + 6 * b * s * h * v)
    llama = GPTShape(32, 4096, 32, 14336, 8192, 8192, 128256, num_query_groups=8, swiglu=True)
    expected = 12 * 8192 * 32 * 4096 ** 2 * ((1 + 8 / 32 + 8192 / 4096) + 14336 / 4096 * 1.5) + 6 * 8192 * 4096 * 128256
    assert training_flops(llama, 1) == pytest.approx(expected)
    # Multi-latent attention: Megatron's MLA terms (its token-linear ones; the s^2 one without the causal
    # halving, as the multi-head formula above counts it)
    from rapidgpt.config.mla import MlaConfig
    mla = MlaConfig(True, 1536, 512, 128, 64, 128)
    deepseek = GPTShape(61, 7168, 128, 18432, 4096, 4096, 129280, swiglu=True, mla=mla)
    q_term = 1536 * (7168 + 128 * 192 + 1)
    kv_term = 512 * (7168 + 128 * 256 + 1) + 7168 * 64 + 128 * 128 * 7168
    expected = (6 * 4096 * 61 * (q_term + kv_term + 4096 * 128 * (192 + 128))
                + 12 * 4096 * 61 * 7168 * 18432 * 1.5 + 6 * 4096 * 7168 * 129280)
    assert training_flops(deepseek, 1) == pytest.approx(expected)
    from rapidgpt.training.reporting import training_log_line
    line = training_log_line(3, 10, 24, 1500.0, 1e-4, 8, {"lm loss": 2.5}, 1.0, 0.5, 0, 0, 100.0, tflops_per_rank=12.34)
    assert "| elapsed time per iteration (ms): 1500.0 | throughput per GPU (TFLOP/s/GPU): 12.3 | learning rate:" in line


def test_uneven_and_interleaved_stages():
    """The estimate counts each stage's own layers (uneven stages), and under the interleaved
    schedule the chunk forwards its warm-up holds: stage 0 of P = 4 with V = 2 holds 11 of them,
    5.5 micro-batches' worth, Megatron's P (1 + (P - 1) / (P V))."""
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.theoretical_memory import estimate, layer_parameters, layout_from_args, shape_from_args
    flags = ["--num-layers", "10", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "1000", "--train-iters", "1", "--pipeline-model-parallel-size", "4",
             "--micro-batch-size", "1", "--global-batch-size", "8", "--num-virtual-stages-per-pipeline-rank", "2",
             "--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "2"]
    args = validate_args(build_parser().parse_args(flags), world_size=4)
    shape, layout = shape_from_args(args, 1000), layout_from_args(args)
    result = estimate(shape, layout)
    assert result.parameters_per_stage[1] == result.parameters_per_stage[2] == 2 * layer_parameters(shape, 1)
    assert result.parameters_per_stage[0] == stage_parameters(shape, 0, 4, 1, 4)
    assert sum(result.parameters_per_stage) - shape.padded_vocab_size * 64 == result.parameters    # the tied copy
    assert [layout.chunk_forwards_held(stage) for stage in range(4)] == [11, 9, 7, 5]
    assert [st["micro_batches_in_flight"] for st in result.stages] == [6, 5, 4, 3]
