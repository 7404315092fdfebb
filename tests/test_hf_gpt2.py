"""Hugging Face GPT-2 import/export: logits and loss equal to transformers', numpy reference,
bit-exact round trips, clear errors, and the converted checkpoint through the CLI tasks.

The fixture tests/fixtures/hf_gpt2_tiny/ was written by transformers itself (see
tests/fixtures/make_hf_gpt2_tiny.py, not run here): every tensor random, vocabulary 300 (padded to
384 inside RapidGPT), with HF's logits and loss on fixed token ids.
"""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

import rapidgpt
from rapidgpt.data.indexed_dataset import IndexedDatasetBuilder, data_file_path, index_file_path
from rapidgpt.models.generation import generate
from rapidgpt.models.hf_files import read_safetensors, write_safetensors
from rapidgpt.tokenizer import GPT2BPETokenizer

from hf_conversion import conversion_fixtures
from numpy_gpt import numpy_gpt_logits

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "hf_gpt2_tiny"
convert, expected, converted = conversion_fixtures(FIXTURE, "convert_hf_gpt2")


def params_of(model):
    return {name: p.asnumpy() for name, p in model.parameters_and_names()}


def hf_loss(logits, ids):
    """HF's loss with labels = ids: mean cross-entropy of position t predicting token t + 1."""
    logits = logits[:, :-1].astype(np.float64)
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    return -np.take_along_axis(log_probs, ids[:, 1:, None], -1).mean()


# ---- the forward equals transformers' ---------------------------------------------------------

def test_logits_and_loss_equal_transformers(converted, expected):
    ids = expected["input_ids"].astype(np.int32)
    model = rapidgpt.load_pretrained(str(converted))
    assert not model.training and model.vocab_size == 300 and model.padded_vocab_size == 384
    logits = model(Tensor(ids)).asnumpy()                       # position_ids default to 0..s-1
    assert logits.shape == (2, 16, 300)
    np.testing.assert_allclose(logits, expected["logits"], rtol=0, atol=1e-5)
    losses = model(Tensor(ids[:, :-1]), labels=Tensor(ids[:, 1:])).asnumpy()
    assert losses.mean() == pytest.approx(float(expected["loss"]), abs=1e-5)
    assert hf_loss(expected["logits"], ids) == pytest.approx(float(expected["loss"]), abs=1e-5)
    # The HF folder loads directly too (converted in memory): the very same model.
    direct = rapidgpt.load_pretrained(str(FIXTURE))
    np.testing.assert_array_equal(direct(Tensor(ids)).asnumpy(), logits)


def test_load_pretrained_leaves_an_engine_alone(converted):
    from rapidgpt.engine import RapidGPTEngine
    engine = RapidGPTEngine(argv=["--vocab-size", "50", "--seed", "5", "--no-progress-bar"])
    numpy_state, ms_state = np.random.get_state()[1].copy(), ms.get_rng_state().asnumpy().copy()
    model = rapidgpt.load_pretrained(str(converted))
    assert rapidgpt.get_args() is engine.args and engine.args.hidden_size == 256 and model.vocab_size == 300
    assert np.array_equal(np.random.get_state()[1], numpy_state)
    assert np.array_equal(ms.get_rng_state().asnumpy(), ms_state)


def test_numpy_gpt2_on_the_converted_weights(converted, expected):
    ids = expected["input_ids"].astype(np.int32)
    model = rapidgpt.load_pretrained(str(converted))
    reference = numpy_gpt_logits(params_of(model), ids, heads=4)
    assert np.all(reference[..., 300:] == 0)                    # padded rows are zeros
    np.testing.assert_allclose(model(Tensor(ids)).asnumpy(), reference[..., :300], rtol=0, atol=1e-5)
    positions = Tensor(np.tile(np.arange(16, dtype=np.int32), (2, 1)))
    np.testing.assert_array_equal(model(Tensor(ids), positions).asnumpy(), model(Tensor(ids)).asnumpy())


@pytest.mark.parametrize("activation", ["gelu", "relu2"])
def test_other_activations_load_compute_and_export_as_named(tmp_path, activation):
    """A GPT-2 folder with the exact GELU (RapidGPT's --no-bias-gelu-fusion) or the squared ReLU
    (--squared-relu): the model computes that activation (the numpy GPT with it), its checkpoint
    records the flag, and --to-hf writes the same activation_function back."""
    hf_in = _broken_copy(tmp_path / "hf_in", config_changes={"activation_function": activation})
    ckpt, hf_out = tmp_path / "rapidgpt", tmp_path / "hf_out"
    assert convert.main(["--hf-dir", str(hf_in), "--save", str(ckpt)]) == 0
    ids = np.random.default_rng(4).integers(0, 300, (2, 16)).astype(np.int32)
    for source in (hf_in, ckpt):
        model = rapidgpt.load_pretrained(str(source))
        reference = numpy_gpt_logits(params_of(model), ids, heads=4, activation=activation)[..., :300]
        np.testing.assert_allclose(model(Tensor(ids)).asnumpy(), reference, rtol=0, atol=1e-5, err_msg=str(source))
    assert model.config.activation == {"gelu": "gelu", "relu2": "squared_relu"}[activation]
    assert convert.main(["--to-hf", "--load", str(ckpt), "--hf-dir", str(hf_out)]) == 0
    assert json.loads((hf_out / "config.json").read_text())["activation_function"] == activation


# ---- round trips ------------------------------------------------------------------------------

def _untied_hf_folder(folder):
    """The fixture with its own lm_head (tie_word_embeddings false), as HF would save it."""
    folder.mkdir()
    tensors, _ = read_safetensors(FIXTURE / "model.safetensors")
    tensors["lm_head.weight"] = np.random.default_rng(0).normal(0, 0.2, (300, 32)).astype(np.float32)
    write_safetensors(folder / "model.safetensors", tensors, {"format": "pt"})
    config = json.loads((FIXTURE / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=False)))
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(FIXTURE / name, folder / name)
    return folder


@pytest.mark.parametrize("tied", [True, False])
def test_round_trips_are_bit_exact(tmp_path, tied):
    hf_in = FIXTURE if tied else _untied_hf_folder(tmp_path / "hf_in")
    first, hf_out, second = tmp_path / "rapidgpt1", tmp_path / "hf_out", tmp_path / "rapidgpt2"
    assert convert.main(["--hf-dir", str(hf_in), "--save", str(first), "--ckpt-format", "safetensors"]) == 0
    assert convert.main(["--to-hf", "--load", str(first), "--hf-dir", str(hf_out)]) == 0
    assert convert.main(["--hf-dir", str(hf_out), "--save", str(second)]) == 0
    # RapidGPT -> HF -> RapidGPT: every parameter identical (padded rows included).
    a, b = (params_of(rapidgpt.load_pretrained(str(d))) for d in (first, second))
    assert sorted(a) == sorted(b) and ("output_layer.weight" in a) == (not tied)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    # HF -> RapidGPT -> HF: the same tensors (a tied lm_head is not stored, as HF saves it).
    original, _ = read_safetensors(hf_in / "model.safetensors")
    exported, _ = read_safetensors(hf_out / "model.safetensors")
    assert sorted(original) == sorted(exported) and ("lm_head.weight" in exported) == (not tied)
    for name in original:
        assert exported[name].dtype == np.float32
        np.testing.assert_array_equal(original[name], exported[name], err_msg=name)
    config = json.loads((hf_out / "config.json").read_text())
    assert config["tie_word_embeddings"] == tied and config["activation_function"] == "gelu_new"
    assert (config["n_layer"], config["n_embd"], config["n_head"], config["vocab_size"]) == (2, 32, 4, 300)
    assert config["eos_token_id"] == 0 and (hf_out / "vocab.json").read_bytes() == (FIXTURE / "vocab.json").read_bytes()


def test_gpt2model_names_and_old_mask_buffers_are_read(tmp_path, converted):
    """Files saved from GPT2Model (no `transformer.` prefix) by older transformers, which also
    stored each layer's causal-mask buffers, give the same model."""
    folder = tmp_path / "old"
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    tensors, _ = read_safetensors(FIXTURE / "model.safetensors")
    tensors = {name[len("transformer."):]: value for name, value in tensors.items()}
    for i in range(2):
        tensors[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        tensors[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    write_safetensors(folder / "model.safetensors", tensors)
    old, new = (params_of(rapidgpt.load_pretrained(str(d))) for d in (folder, converted))
    assert all(np.array_equal(old[name], new[name]) for name in new)


def test_safetensors_files_agree_with_the_reference_library(tmp_path):
    import safetensors.numpy as safetensors_numpy      # installed with MindSpore: never skipped
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(5, np.float16),
               "c": np.array([[1, -2]], np.int64)}
    write_safetensors(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    theirs = safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))
    ours, dtypes = read_safetensors(tmp_path / "x.safetensors")
    assert dtypes == {"a": "F32", "b": "F16", "c": "I64"}
    for name, value in tensors.items():
        np.testing.assert_array_equal(theirs[name], value)
        np.testing.assert_array_equal(ours[name], value)
    reference = safetensors_numpy.load_file(str(FIXTURE / "model.safetensors"))
    fixture, _ = read_safetensors(FIXTURE / "model.safetensors")
    assert all(np.array_equal(reference[k], fixture[k]) for k in reference) and sorted(reference) == sorted(fixture)


def _half_precision_copy(folder, kind):
    """The fixture with every weight stored as fp16 or bf16 (bf16 written by hand: numpy lacks it)."""
    folder.mkdir()
    for name in ("config.json", "vocab.json", "merges.txt"):
        shutil.copy(FIXTURE / name, folder / name)
    tensors, _ = read_safetensors(FIXTURE / "model.safetensors")
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        raw = (value.astype(np.float16) if kind == "F16" else
               (value.view(np.uint32) >> 16).astype(np.uint16)).tobytes()      # bf16: truncate
        header[name] = {"dtype": kind, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(len(encoded).to_bytes(8, "little") + encoded + b"".join(blobs))
    widened = {n: (v.astype(np.float16).astype(np.float32) if kind == "F16"
                   else ((v.view(np.uint32) >> 16) << 16).view(np.float32)) for n, v in tensors.items()}
    return folder, widened


@pytest.mark.parametrize("kind", ["F16", "BF16"])
def test_half_precision_weights_become_fp32_with_a_note(tmp_path, capsys, kind):
    folder, widened = _half_precision_copy(tmp_path / "hf", kind)
    assert convert.main(["--hf-dir", str(folder), "--save", str(tmp_path / "ckpt")]) == 0
    assert f"note: {kind.lower()} weights converted to fp32" in capsys.readouterr().err
    assert convert.main(["--to-hf", "--load", str(tmp_path / "ckpt"), "--hf-dir", str(tmp_path / "out")]) == 0
    exported, dtypes = read_safetensors(tmp_path / "out" / "model.safetensors")
    assert set(dtypes.values()) == {"F32"}
    for name, value in widened.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)


# ---- errors -----------------------------------------------------------------------------------

def _broken_copy(folder, config_changes=None, drop=None, extra_file=None, remove=None):
    folder.mkdir()
    for item in FIXTURE.iterdir():
        if item.name != remove:
            shutil.copy(item, folder / item.name)
    if config_changes:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, **config_changes)))
    if drop:
        tensors, _ = read_safetensors(FIXTURE / "model.safetensors")
        write_safetensors(folder / "model.safetensors", {k: v for k, v in tensors.items() if k != drop})
    if extra_file:
        (folder / extra_file[0]).write_bytes(extra_file[1])
    return folder


@pytest.mark.parametrize("case,message", [
    (dict(), "no such directory"),
    (dict(remove="config.json"), "no config.json; give the folder written by save_pretrained"),
    (dict(remove="model.safetensors"), "no model.safetensors"),
    (dict(remove="model.safetensors", extra_file=("pytorch_model.bin", b"x")),
     "only PyTorch/TF weight files, no model.safetensors; re-save it with"),
    (dict(extra_file=("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")),
     "not a readable safetensors file"),
    (dict(config_changes={"model_type": "llama"}), "model_type 'llama' is not 'gpt2'"),
    (dict(config_changes={"activation_function": "silu"}),
     "activation_function='silu' is not supported (RapidGPT's GPT computes gelu_new, gelu_pytorch_tanh, gelu, relu2)"),
    (dict(config_changes={"scale_attn_by_inverse_layer_idx": True}), "scale_attn_by_inverse_layer_idx=True"),
    (dict(config_changes={"scale_attn_weights": False}), "scale_attn_weights=False"),
    (dict(config_changes={"add_cross_attention": True}), "add_cross_attention=True"),
    (dict(config_changes={"n_inner": 64}), "tensor h.0.mlp.c_fc.weight has shape [32, 128], config.json "
                                           "implies [32, 64]"),
    (dict(config_changes={"n_head": 5}), "n_embd 32 is not divisible by n_head 5"),
    (dict(config_changes={"n_layer": 3}), "tensor h.2.ln_1.weight missing"),
    (dict(drop="transformer.ln_f.bias"), "tensor ln_f.bias missing"),
])
def test_bad_hf_folders_are_one_line_errors(tmp_path, capsys, case, message):
    folder = tmp_path / "hf"
    if case:
        _broken_copy(folder, **case)
    assert convert.main(["--hf-dir", str(folder), "--save", str(tmp_path / "ckpt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("convert_hf_gpt2.py: error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "ckpt").exists()


def test_other_bad_arguments(tmp_path, capsys, converted):
    assert convert.main(["--hf-dir", str(FIXTURE), "--save", str(converted)]) == 1
    assert "already holds a RapidGPT checkpoint" in capsys.readouterr().err
    assert convert.main(["--to-hf", "--load", str(tmp_path / "nothing"), "--hf-dir", str(tmp_path / "o")]) == 1
    assert "--load" in capsys.readouterr().err
    assert convert.main(["--to-hf", "--load", str(converted), "--hf-dir", str(FIXTURE)]) == 1
    assert "already holds a model.safetensors" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        convert.main(["--to-hf", "--hf-dir", str(tmp_path)])
    assert "--to-hf needs --load DIR" in capsys.readouterr().err


# ---- the converted checkpoint through the command line ----------------------------------------

def test_text_generation_cli_needs_no_architecture_flags(tmp_path, converted):
    moved = tmp_path / "moved"                     # tokenizer paths are relative to the checkpoint
    shutil.copytree(converted, moved)
    result = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--task", "text_generation", "--load",
                             str(moved), "--prompt", "The quick brown", "--max-new-tokens", "6",
                             "--no-progress-bar"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    tokenizer = GPT2BPETokenizer(str(FIXTURE / "vocab.json"), str(FIXTURE / "merges.txt"))
    greedy = generate(rapidgpt.load_pretrained(str(converted)), tokenizer, "The quick brown", 6)
    assert f"prompt: 'The quick brown'\ncontinuation: {greedy!r}" in result.stdout


# The conversion is checked to the last digits of transformers' loss, so these runs are unfused:
# graph kernel fusion's kernels round differently (rapidgpt/config/kernel_fusion.py).
UNFUSED = ("--graph-kernel-fusion", "off")


def test_pretraining_skip_train_gives_the_transformers_loss(tmp_path, converted, expected, capsys):
    from rapidgpt.tasks.pretraining import main as pretrain_main
    ids = expected["input_ids"]
    prefix = str(tmp_path / "row0_text_document")
    builder = IndexedDatasetBuilder(data_file_path(prefix), np.uint16)
    builder.add_item(ids[0])                      # one document of 16 tokens = one sample of 15 + 1
    builder.end_document()
    builder.finalize(index_file_path(prefix))
    assert pretrain_main(["--task", "pretraining", "--load", str(converted), "--skip-train", "--train-iters", "1",
                          "--train-data-path", prefix, "--valid-data-path", prefix, "--seq-length", "15",
                          "--micro-batch-size", "1", "--eval-iters", "1", "--data-cache-path", str(tmp_path),
                          "--no-progress-bar", "--max-new-tokens", "0", *UNFUSED]) == 0
    out = capsys.readouterr().out
    loss = float(re.search(r"validation loss at the end of training for val data \| lm loss value: ([\d.E+-]+)",
                           out).group(1))
    assert loss == pytest.approx(hf_loss(expected["logits"][:1], ids[:1].astype(np.int64)), rel=2e-6)


def test_rapidformer_pretrained_model_name_or_path_takes_a_local_hf_folder(tmp_path, expected, capsys):
    """Rapidformer's --pretrained-model-name-or-path: the HF folder gives the architecture, the
    tokenizer and the starting weights (an lr too small to move them: the end-of-training
    validation loss is transformers' loss)."""
    from rapidgpt.tasks.pretraining import main as pretrain_main
    ids = expected["input_ids"]
    prefix = str(tmp_path / "row0_text_document")
    builder = IndexedDatasetBuilder(data_file_path(prefix), np.uint16)
    builder.add_item(ids[0])
    builder.end_document()
    builder.finalize(index_file_path(prefix))
    assert pretrain_main(["--pretrained-model-name-or-path", str(FIXTURE), "--train-iters", "1", "--lr", "1e-30",
                          "--train-data-path", prefix, "--valid-data-path", prefix, "--seq-length", "15",
                          "--micro-batch-size", "1", "--eval-iters", "1", "--data-cache-path", str(tmp_path),
                          "--no-progress-bar", "--max-new-tokens", "0", *UNFUSED]) == 0
    out = capsys.readouterr().out
    assert re.search(r"loaded \d+ of the model's \d+ parameters from --pretrained-checkpoint", out)
    loss = float(re.search(r"validation loss at the end of training for val data \| lm loss value: ([\d.E+-]+)",
                           out).group(1))
    assert loss == pytest.approx(hf_loss(expected["logits"][:1], ids[:1].astype(np.int64)), rel=2e-6)


def test_hub_names_are_refused_because_nothing_is_downloaded():
    result = subprocess.run([sys.executable, "-m", "rapidgpt.cli", "--task", "sequence_classification",
                             "--pretrained-model-name-or-path", "bert-base-cased", "--data-name", "mrpc",
                             "--data-path", "x.jsonl", "--epochs", "1"], capture_output=True, text=True)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("rapidgpt: error:")]
    assert len(errors) == 4 and any("--data-path: 'x.jsonl': no such file" in e for e in errors)
    assert set(errors) >= {
        "rapidgpt: error: --data-name: names a Hugging Face datasets-hub dataset, and RapidGPT downloads nothing; "
        "convert the data to local files (.jsonl/.tsv for finetuning, .bin/.idx via data_tools/preprocess_data.py) "
        "and give them with --data-path / --valid-data-path",
        "rapidgpt: error: --pretrained-model-name-or-path: bert-base-cased is not a local folder, and RapidGPT "
        "downloads nothing from a model hub; download the model first (e.g. huggingface-cli download "
        "bert-base-cased --local-dir DIR) and give DIR"}
