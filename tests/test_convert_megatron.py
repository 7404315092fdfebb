"""data_tools/convert_megatron.py: Megatron-LM checkpoints (written by Megatron-LM's own code,
tests/fixtures/make_megatron_checkpoints.py) become RapidGPT checkpoints whose model computes
Megatron's own per-token losses on the batch recorded beside each, and that train on."""
import json
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from batched_runs import BatchedRuns
from rapidgpt.data.indexed_dataset import IndexedDatasetBuilder, data_file_path, index_file_path
from test_parallel import REPO

FIXTURES = REPO / "tests" / "fixtures" / "megatron_checkpoints"
# legacy TP2 and torch_dist TP2 x PP2 of a GPT-2 style model, the same formats the other way round of
# a Llama-style one (legacy also under Transformer Engine's names), the GPT with Megatron's
# unfused (exact) GELU, with --squared-relu and with --use-mup, and both models saved with virtual pipeline stages
# (PP2 x VP2: each rank holds two chunks, layers 0 and 2 or 1 and 3); the GPT with multi-latent attention at
# TP2, in the local spec's names (down projections split over TP) and Transformer Engine's (whole on each rank,
# the latent norms fused into the up projections)
CHECKPOINTS = ("gpt_torch_tp2", "gpt_torch_dist_tp2_pp2", "llama_torch_tp2_pp2", "llama_te_names_torch_tp2_pp2",
               "llama_torch_dist_tp2", "gpt_exact_gelu_torch_tp1", "llama_torch_tp1_pp2_vp2",
               "gpt_torch_dist_tp1_pp2_vp2", "gpt_squared_relu_torch_tp1", "gpt_mup_torch_tp1", "mla_torch_tp2",
               "mla_te_names_torch_tp2")
# Runs the converter's command line once per (source, output) in one process (torch and MindSpore
# imported once); prints each exit status and output between markers.
DRIVER = """
import contextlib, io, json, sys
sys.path.insert(0, "data_tools")
import convert_megatron
results = {}
for name, load, save in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = convert_megatron.main(["--load", load, "--save", save])
    results[name] = [status, out.getvalue()]
print("RESULTS" + json.dumps(results))
"""


def convert(jobs, env):
    """{name: (exit status, output)} of convert_megatron.py's `main` for each (name, load, save)."""
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], env=env, cwd=REPO, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and "RESULTS" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.split("RESULTS", 1)[1])


@pytest.fixture(scope="module")
def converted(env, tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted")
    results = convert([(name, str(FIXTURES / name), str(folder / name)) for name in CHECKPOINTS], env)
    return {name: (status, log, folder / name) for name, (status, log) in results.items()}


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_the_converted_model_computes_megatrons_own_losses(converted, name):
    """Every per-token loss of Megatron's forward on the recorded batch, within 1e-5 (fp32). (The
    exact-GELU model computed with the tanh form is 9e-5 off on some tokens.)"""
    import mindspore as ms

    import rapidgpt
    status, log, save = converted[name]
    assert status == 0, log
    assert re.search(r"wrote \S+iter_0000000: 4 layers, hidden 32, 4 heads, vocabulary 1024", log), log
    reference = json.loads((FIXTURES / name / "megatron_forward.json").read_text())
    tokens = np.array(reference["tokens"], np.int32)
    model = rapidgpt.load_pretrained(str(save))
    losses = model(ms.Tensor(tokens[:, :-1]), labels=ms.Tensor(tokens[:, 1:])).asnumpy()
    np.testing.assert_allclose(losses, np.array(reference["losses"]), rtol=0, atol=1e-5)
    metadata = json.loads((save / "iter_0000000" / "metadata.json").read_text())["model"]
    # Megatron's args: no fusion without biases (the Llama-style model) or with --no-bias-gelu-fusion
    assert metadata["bias_gelu_fusion"] == name.startswith(("gpt_torch_tp2", "gpt_torch_dist", "gpt_mup", "mla"))
    assert metadata.get("squared_relu", False) == name.startswith("gpt_squared_relu")
    assert (metadata.get("use_mup", False), metadata.get("mup_base_hidden_size")) == (
        (True, 16) if name.startswith("gpt_mup") else (False, None))
    assert (metadata.get("multi_latent_attention", False), metadata.get("q_lora_rank"),
            metadata.get("rotary_scaling_factor")) == ((True, 12, 40.0) if name.startswith("mla") else (False, None, 1.0))


@pytest.mark.parametrize("name, reason", [("gpt_mup_torch_tp1", "the checkpoint's model was trained with --use-mup"),
                                          ("mla_torch_tp2", "the checkpoint's model has multi-latent attention")])
def test_what_no_hugging_face_class_computes_is_not_exported(converted, tmp_path, capsys, name, reason):
    """No Hugging Face config holds muP's multipliers, and GPT-2's and the Llama family's classes
    compute no multi-latent attention: --to-hf refuses in one line, writes nothing."""
    sys.path.insert(0, str(REPO / "data_tools"))
    import convert_hf
    hf_dir = tmp_path / "hf"
    assert convert_hf.main(["--to-hf", "--load", str(converted[name][2]), "--hf-dir", str(hf_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and reason in err, err
    assert not hf_dir.exists()


@pytest.mark.parametrize("name,value,reason", [("num_experts", 8, "mixture-of-experts layers are not built"),
                                               ("window_size", "(4096, 0)", "sliding-window attention is not built"),
                                               ("glu_linear_offset", 1.0, "an offset in the GLU is not built")])
def test_what_the_gpt_does_not_compute_is_refused_naming_it(name, value, reason):
    """A model RapidGPT's GPT would compute differently is refused, not converted into another."""
    sys.path.insert(0, str(REPO / "data_tools"))
    import convert_megatron
    plain = dict(num_layers=2, hidden_size=32, num_attention_heads=4, padded_vocab_size=128,
                 position_embedding_type="learned_absolute", glu_linear_offset=0.0)
    with pytest.raises(convert_megatron.MegatronCheckpointError) as error:
        convert_megatron.model_flags(Namespace(**dict(plain, **{name: value})), "ckpt")
    assert str(error.value) == f"ckpt: the checkpoint's model has {name}={value!r}: {reason}"
    assert convert_megatron.model_flags(Namespace(**plain), "ckpt")["vocab_size"] == 128


def token_corpus(folder, vocab_size=1000, documents=64):
    """A .bin/.idx corpus of random token ids below `vocab_size` -> its prefix."""
    prefix = str(Path(folder) / "tokens")
    builder = IndexedDatasetBuilder(data_file_path(prefix), np.uint16)
    rng = np.random.default_rng(3)
    for _ in range(documents):
        document = rng.integers(0, vocab_size - 1, rng.integers(20, 60))
        builder.add_document(document, [len(document)])
    builder.finalize(index_file_path(prefix))
    return prefix


def test_converted_checkpoints_train_on_and_finetune(converted, env, tmp_path):
    """The converted Llama-style checkpoint resumes with --load and the GPT one finetunes with
    --pretrained-checkpoint, each 2 iterations on token-id data, in one process, with neither model
    nor tokenizer flags: the checkpoints carry Megatron's (NullTokenizer over the padded vocabulary)."""
    prefix = token_corpus(tmp_path)
    common = ["--task", "pretraining", "--data-path", prefix, "--micro-batch-size", "2", "--global-batch-size", "2", "--seq-length", "16", "--lr", "1e-4",
              "--eval-interval", "2", "--eval-iters", "1", "--log-interval", "1", "--no-progress-bar"]
    lines = {"load": common + ["--load", str(converted["llama_torch_tp2_pp2"][2]), "--train-iters", "2"],
             "finetune": common + ["--pretrained-checkpoint", str(converted["gpt_torch_dist_tp2_pp2"][2]),
                                   "--train-iters", "2"]}
    runs = BatchedRuns(env, tmp_path / "runs", [(1, argv) for argv in lines.values()])
    for name, argv in lines.items():
        status, log, _ = runs(1, argv)
        assert status == 0, log[-3000:]
        assert re.findall(r" iteration\s+(\d+)/\s*2 \|", log) == ["1", "2"], log[-3000:]
        losses = [float(x) for x in re.findall(r"lm loss: (\S+) \|", log)]
        assert len(losses) == 2 and all(5 < x < 9 for x in losses), log[-3000:]


def test_bad_sources_are_one_line_each(env, tmp_path):
    """Not a checkpoint, an existing --save, torch missing: one line naming what to do, exit 1."""
    existing = tmp_path / "existing"
    (existing / "iter_0000000").mkdir(parents=True)
    (existing / "latest_checkpointed_iteration.txt").write_text("0")
    results = convert([("empty", str(tmp_path), str(tmp_path / "out")),
                       ("existing", str(FIXTURES / "gpt_torch_tp2"), str(existing))], env)
    assert results["empty"][0] == 1 and "no latest_checkpointed_iteration.txt and no Megatron checkpoint files" \
        in results["empty"][1]
    assert results["existing"][0] == 1 and "already holds a RapidGPT checkpoint" in results["existing"][1]
    no_torch = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; "
                               "sys.argv[0] = 'convert_megatron.py'; sys.path.insert(0, 'data_tools'); "
                               "import convert_megatron; sys.exit(convert_megatron.main(['--load', "
                               f"'{FIXTURES / 'gpt_torch_tp2'}', '--save', '{tmp_path / 'out2'}']))"],
                              env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert no_torch.returncode == 1
    assert no_torch.stderr.strip().splitlines() == [
        "convert_megatron.py: error: reading a Megatron-LM checkpoint needs torch (the CPU build is enough): "
        "pip install 'rapidgpt[megatron]' or pip install torch"], no_torch.stderr
