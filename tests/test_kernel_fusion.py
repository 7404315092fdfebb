"""Graph kernel fusion (--graph-kernel-fusion, rapidgpt/config/kernel_fusion.py): what auto/on/off
decide from the machine, the one-line refusal, and the OpenMP settings `import rapidgpt` makes.
The fused step's numbers are checked by every equivalence test (fusion is on where available) and
set beside the unfused ones by benchmarks/bench_pretrain.py's same-model check."""
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops

from rapidgpt.config import kernel_fusion
from rapidgpt.config.kernel_fusion import (HALF_ON_CPU, KernelFusionConfig, check_kernel_fusion_backend,
                                           enable_kernel_fusion, fuses_on_cpu, missing_requirements)
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.flag_parser import ArgumentError
from rapidgpt.config.precision import PrecisionConfig
from rapidgpt.config.recompute import RecomputeConfig
from rapidgpt.models.norms import LayerNorm
from rapidgpt.models.attention import mask_scores
from rapidgpt.training.model_transforms import prepare_model

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--vocab-size", "50", "--micro-batch-size", "4", "--no-progress-bar", "--seed", "7", "--device", "cpu",
        "--train-iters", "2", "--lr", "1e-3"]


@pytest.fixture
def no_compiler(monkeypatch):
    """A machine without g++."""
    real_which = kernel_fusion.shutil.which
    monkeypatch.setattr(kernel_fusion.shutil, "which", lambda name: None if name == "g++" else real_which(name))
    yield
    switch_off()


def switch_off():
    enable_kernel_fusion(KernelFusionConfig("off"), "cpu", 0)


def test_a_missing_requirement_is_named():
    def missing_with(which, find_spec):
        saved = kernel_fusion.shutil.which, kernel_fusion.importlib.util.find_spec
        kernel_fusion.shutil.which, kernel_fusion.importlib.util.find_spec = which, find_spec
        try:
            return missing_requirements("cpu")
        finally:
            kernel_fusion.shutil.which, kernel_fusion.importlib.util.find_spec = saved

    assert missing_with(lambda name: "/usr/bin/g++", lambda name: object()) == []
    assert missing_with(lambda name: None, lambda name: None) == [
        "the decorator package (pip install decorator)", "g++ on PATH (e.g. apt-get install g++)"]
    assert missing_requirements("ascend") == []          # no kernels are built with g++ there


def test_on_without_g_plus_plus_is_refused_in_one_line(no_compiler):
    with pytest.raises(ArgumentError, match=r"--graph-kernel-fusion on: it needs g\+\+ on PATH .*; install them, "
                                            r"or use --graph-kernel-fusion auto \(on where they are present\) or off"):
        RapidGPTEngine(argv=TINY + ["--graph-kernel-fusion", "on"])


def test_auto_falls_back_to_off_and_says_why(no_compiler):
    assert check_kernel_fusion_backend(KernelFusionConfig("auto"), "cpu") is None
    assert enable_kernel_fusion(KernelFusionConfig("auto"), "cpu", 0) == "off (needs g++ on PATH (e.g. apt-get install g++))"
    assert not fuses_on_cpu()


def test_16_bit_models_stay_unfused_on_the_cpu():
    """AKG cannot build an fp16 step's fused casts (HALF_ON_CPU): auto leaves them unfused, on is refused."""
    missing = missing_requirements("cpu")
    state = enable_kernel_fusion(KernelFusionConfig("auto", half=True), "cpu", 0)
    assert state.startswith("off (needs " if missing else f"off (16-bit model: {HALF_ON_CPU})")
    assert not fuses_on_cpu()
    refusal = "it needs" if missing else "not for a 16-bit model on the CPU: MindSpore's CPU kernel compiler"
    with pytest.raises(ArgumentError, match=f"--graph-kernel-fusion on: {refusal}"):
        RapidGPTEngine(argv=TINY + ["--graph-kernel-fusion", "on", "--fp16"])


def test_auto_leaves_other_devices_to_mindspore():
    ms.set_context(enable_graph_kernel=True)            # as a user may have set it
    try:
        assert enable_kernel_fusion(KernelFusionConfig("auto"), "gpu", 0).startswith("off unless set in MindSpore")
        assert fuses_on_cpu()
    finally:
        switch_off()


@pytest.mark.parametrize("args,policy,threads", [
    ([], "passive", None),
    (["--cpu-threads", "3"], "passive", "3"),
    (["--graph-kernel-fusion=off", "--cpu-threads", "3"], None, None),
])
def test_import_rapidgpt_sets_openmp_before_mindspore_loads(args, policy, threads):
    """`import rapidgpt` (no MindSpore yet) reads the command line: passive threads and --cpu-threads
    for the fused kernels' OpenMP, nothing with --graph-kernel-fusion off or without fusion."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    code = ("import os, sys, rapidgpt; print('mindspore' in sys.modules, os.environ.get('OMP_WAIT_POLICY'), "
            "os.environ.get('OMP_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code] + args, env=env, capture_output=True, text=True, check=True)
    if missing_requirements("cpu"):
        policy = threads = None
    assert out.stdout.split() == ["False", str(policy), str(threads)]


def test_auto_is_on_where_the_requirements_are(tmp_path, monkeypatch):
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path / "kernels"))
    state = enable_kernel_fusion(KernelFusionConfig("auto"), "cpu", 0)
    try:
        if missing_requirements("cpu"):
            assert state.startswith("off (needs ")
        else:
            assert state == (f"on (MindSpore's graph kernel fusion, MS_DEV_GRAPH_KERNEL_FLAGS=--opt_level=2, "
                             f"kernels cached in {tmp_path / 'kernels'})")
            assert fuses_on_cpu()
        assert enable_kernel_fusion(KernelFusionConfig("off"), "cpu", 0) == "off (--graph-kernel-fusion off)"
        assert not fuses_on_cpu()
    finally:
        switch_off()


def test_each_rank_builds_its_kernels_in_a_cache_of_its_own(tmp_path, monkeypatch):
    """The default kernel cache is per rank (two ranks writing one cache raced: use_kernel_cache),
    another rank's starting with copies of the kernels rank 0's holds and it lacks; a user's own
    MS_COMPILER_CACHE_PATH is left as it is."""
    import mindspore as ms
    from rapidgpt.config import kernel_fusion

    monkeypatch.setenv("RAPIDGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MS_COMPILER_CACHE_PATH", raising=False)
    monkeypatch.setattr(kernel_fusion, "_CACHE_SET_HERE", None)
    base = tmp_path / "cache" / "graph_kernels" / f"mindspore-{ms.__version__}"
    assert kernel_fusion.use_kernel_cache(1) == str(base / "rank_1")
    assert kernel_fusion.use_kernel_cache(0) == str(base / "rank_0") == os.environ["MS_COMPILER_CACHE_PATH"]
    assert (base / "rank_0").is_dir() and (base / "rank_1").is_dir()
    (base / "rank_0" / "akg_kernel_meta").mkdir()
    for name, text in (("Fused_Add_1.so", "built by rank 0"), ("Fused_Add_1.info", "hash"), ("Fused_Mul_2.so", "0's")):
        (base / "rank_0" / "akg_kernel_meta" / name).write_text(text)
    (base / "rank_1" / "akg_kernel_meta").mkdir()
    (base / "rank_1" / "akg_kernel_meta" / "Fused_Mul_2.so").write_text("1's own")
    kernel_fusion.use_kernel_cache(1)
    copied = {p.name: p.read_text() for p in (base / "rank_1" / "akg_kernel_meta").iterdir()}
    assert copied == {"Fused_Add_1.so": "built by rank 0", "Fused_Add_1.info": "hash", "Fused_Mul_2.so": "1's own"}
    assert not (base / "rank_1" / "akg_kernel_meta" / "Fused_Add_1.so").samefile(
        base / "rank_0" / "akg_kernel_meta" / "Fused_Add_1.so")                      # a copy, not a link
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path / "mine"))
    assert kernel_fusion.use_kernel_cache(1) == str(tmp_path / "mine")


FUSED_COMPILE = """
import numpy as np, mindspore as ms, sys
from mindspore import ops
from rapidgpt.config.kernel_fusion import KernelFusionConfig, enable_kernel_fusion
ms.set_device("CPU")
print("state:", enable_kernel_fusion(KernelFusionConfig(sys.argv[1]), "cpu", 0), flush=True)
x = ms.Tensor(np.linspace(-2, 2, 4096, dtype=np.float32).reshape(64, 64))
def loss(x):
    return ops.gelu(x * 1.5 - 0.25, approximate="tanh").exp().sum()
print("sum:", float(ms.jit(ms.grad(loss))(x).asnumpy().astype(np.float64).sum()), flush=True)
"""


def test_fusion_compiles_quietly_with_mindspores_current_switch(tmp_path):
    """A fused compile with a cold kernel cache prints nothing of MindSpore's or AKG's (no
    deprecated enable_graph_kernel, no "Please set tiling repo path" per kernel), and it is fused:
    the fused kernels round differently from the unfused ones. On a machine that cannot fuse (no
    g++), auto's compile is as quiet and its state line says why fusion is off."""
    env = {k: v for k, v in os.environ.items() if k not in ("MS_DEV_GRAPH_KERNEL_FLAGS", "AKG_WHITE_LIST_PATH")}
    env["MS_COMPILER_CACHE_PATH"] = str(tmp_path / "kernels")

    script = tmp_path / "fused_compile.py"         # a file: MindSpore's compiler reads the function's source
    script.write_text(FUSED_COMPILE)

    def run(mode):
        out = subprocess.run([sys.executable, str(script), mode], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True)
        return out.stdout + out.stderr

    if missing_requirements("cpu"):
        lines = run("auto").splitlines()
        assert len(lines) == 2 and lines[0].startswith("state: off (needs ") and lines[1].startswith("sum: "), lines
        return
    fused, unfused = run("on"), run("off")
    for output in (fused, unfused):
        lines = output.splitlines()
        assert len(lines) == 2 and lines[0].startswith("state: ") and lines[1].startswith("sum: "), output
    assert fused.splitlines()[1] != unfused.splitlines()[1]
    assert list((tmp_path / "kernels").iterdir())            # kernels were built (cold cache), quietly


@pytest.mark.parametrize("dtype", [ms.float32, ms.float16])
def test_fusable_attention_mask_is_megatrons_masked_fill(dtype):
    """mask_scores writes fp32 masking as arithmetic (which fusion fuses): the same scores and the
    same gradient as masked_fill(mask, -10000), bit for bit; 16-bit scores use masked_fill itself."""
    rng = np.random.default_rng(0)
    scores = Tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32) * 30, dtype)
    mask = Tensor(np.triu(np.ones((5, 5), bool), 1).reshape(1, 1, 5, 5))
    weights = Tensor(rng.standard_normal((2, 3, 5, 5)).astype(np.float32), dtype)

    def megatron(x):
        return (ops.masked_fill(x, mask, -10000.0) * weights).sum()

    def ours(x):
        return (mask_scores(x, mask) * weights).sum()

    np.testing.assert_array_equal(mask_scores(scores, mask).asnumpy(), ops.masked_fill(scores, mask, -10000.0).asnumpy())
    for compile_ in (ms.jit, lambda fn: fn):
        np.testing.assert_array_equal(compile_(ops.grad(ours))(scores).asnumpy(),
                                      compile_(ops.grad(megatron))(scores).asnumpy())


def numpy_layer_norm(x, gamma, beta, dy, eps):
    """float64 LayerNorm over the last axis and its gradients (x, gamma, beta) for the output
    gradient `dy`, written from the formula."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    centred = x - x.mean(-1, keepdims=True)
    inv_std = 1.0 / np.sqrt((centred ** 2).mean(-1, keepdims=True) + eps)
    normed = centred * inv_std
    d_normed = dy * gamma
    dx = inv_std * (d_normed - d_normed.mean(-1, keepdims=True) - normed * (d_normed * normed).mean(-1, keepdims=True))
    tokens = tuple(range(x.ndim - 1))
    return normed * gamma + beta, dx, (dy * normed).sum(tokens), dy.sum(tokens)


def test_composite_layer_norm_is_the_layer_norm_and_is_used_where_the_step_is_fused(tmp_path, monkeypatch):
    """Where fusion is on on the CPU, prepare_model makes RapidGPT's fp32 LayerNorms composite ops
    (rapidgpt/models/transformer.py: why): the values and gradients of a float64 LayerNorm, as
    MindSpore's kernel gives them, eagerly (a pipeline stage's final LayerNorm runs op by op) and
    compiled with fusion on. A LayerNorm over other axes keeps the kernel."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 64)).astype(np.float32) * 3 + 1
    dy = rng.standard_normal(x.shape).astype(np.float32)
    gamma, beta = 1 + 0.1 * rng.standard_normal(64), 0.1 * rng.standard_normal(64)
    expected = numpy_layer_norm(x, gamma, beta, dy, 1e-5)

    def values_and_grads(norm, compile_):
        norm.gamma.set_data(Tensor(gamma, ms.float32))
        norm.beta.set_data(Tensor(beta, ms.float32))

        def loss(x):
            return (norm(x) * Tensor(dy)).sum()
        grads = compile_(ms.value_and_grad(loss, grad_position=0, weights=norm.trainable_params()))(Tensor(x))[1]
        return [norm(Tensor(x)).asnumpy(), grads[0].asnumpy(), *(g.asnumpy() for g in grads[1])]

    def check(norm, compile_):
        for ours, exact in zip(values_and_grads(norm, compile_), expected):
            np.testing.assert_allclose(ours, exact, rtol=0, atol=2e-5 * np.abs(exact).max())

    kernel, composite = LayerNorm((64,), epsilon=1e-5), LayerNorm((64,), epsilon=1e-5)
    composite.composite = True
    for norm in (kernel, composite):
        check(norm, lambda fn: fn)
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path / "kernels"))
    try:
        state = enable_kernel_fusion(KernelFusionConfig("auto"), "cpu", 0)
        other_axes = LayerNorm((16, 64), begin_norm_axis=1, begin_params_axis=1)
        model = ms.nn.SequentialCell([LayerNorm((64,), epsilon=1e-5), other_axes])
        prepare_model(model, PrecisionConfig(), RecomputeConfig())
        assert [model[0].composite, other_axes.composite] == [state.startswith("on"), False]
        check(composite, ms.jit)
    finally:
        switch_off()
