"""Graph kernel fusion (--graph-kernel-fusion, rapidgpt/config/kernel_fusion.py): what auto/on/off
decide from the machine, the one-line refusal, and a fused step against an unfused one."""
import mindspore as ms
import pytest

from rapidgpt.config import kernel_fusion
from rapidgpt.config.kernel_fusion import (KernelFusionConfig, check_kernel_fusion_backend, enable_kernel_fusion,
                                           missing_requirements)
from rapidgpt.engine import RapidGPTEngine
from rapidgpt.flag_parser import ArgumentError

TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--vocab-size", "50", "--micro-batch-size", "4", "--no-progress-bar", "--seed", "7", "--device", "cpu",
        "--train-iters", "2", "--lr", "1e-3"]


@pytest.fixture
def no_compiler(monkeypatch):
    """A machine without g++."""
    real_which = kernel_fusion.shutil.which
    monkeypatch.setattr(kernel_fusion.shutil, "which", lambda name: None if name == "g++" else real_which(name))
    yield
    ms.set_context(enable_graph_kernel=False)


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
    assert enable_kernel_fusion(KernelFusionConfig("auto"), "cpu") == "off (needs g++ on PATH (e.g. apt-get install g++))"
    assert ms.get_context("enable_graph_kernel") is False


def test_auto_leaves_other_devices_to_mindspores_default():
    assert enable_kernel_fusion(KernelFusionConfig("auto"), "gpu").startswith("off (MindSpore's default on gpu")
    assert ms.get_context("enable_graph_kernel") is False


def test_auto_is_on_where_the_requirements_are(tmp_path, monkeypatch):
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(tmp_path / "kernels"))
    state = enable_kernel_fusion(KernelFusionConfig("auto"), "cpu")
    try:
        if missing_requirements("cpu"):
            assert state.startswith("off (needs ")
        else:
            assert state.startswith(f"on (MindSpore's enable_graph_kernel, kernels cached in {tmp_path / 'kernels'})")
            assert ms.get_context("enable_graph_kernel") is True
        assert enable_kernel_fusion(KernelFusionConfig("off"), "cpu") == "off (--graph-kernel-fusion off)"
        assert ms.get_context("enable_graph_kernel") is False
    finally:
        ms.set_context(enable_graph_kernel=False)
