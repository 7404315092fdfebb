"""Hugging Face Llama-family folders written by transformers (tests/fixtures/make_hf_llama_fixtures.py:
random weights, every norm and bias random, 6 query heads in 2 key/value groups) against
transformers' own float64 outputs stored beside them: Llama, Llama 3.1 (RoPE scaling with an
original context of 64, checked at positions 97..120), Qwen2 (q/k/v biases, tied embeddings), Qwen3
(q/k norms, head_dim 12 != 48/6) and Mistral. (RoPE sees relative positions: the second window
checks that the model's 128 positions are all served -- a table cut or clamped short would show --
and Llama 3.1's scaled frequencies move every logit.) Converted (data_tools/convert_hf.py, and in memory by
rapidgpt.load_pretrained), the model's next-token losses equal transformers' float64 ones within
1e-5, its greedy continuation is transformers' token for token, and HF -> RapidGPT -> HF gives the
same tensors bit for bit."""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data_tools"))
import convert_hf  # noqa: E402

from rapidgpt.models.hf_files import read_safetensors  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
KINDS = ["llama", "llama31", "qwen2", "qwen3", "mistral"]


def folder(kind):
    return FIXTURES / f"hf_{kind}_tiny"


def reference(kind):
    return np.load(folder(kind) / "reference.npz")


def next_token_losses(logits, ids):
    """Cross-entropy of ids[:, 1:] under logits[:, :-1] (float64)."""
    logits = logits[:, :-1].astype(np.float64)
    logits = logits - logits.max(-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -np.take_along_axis(log_probs, ids[:, 1:, None], -1)[..., 0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{kind: a RapidGPT checkpoint folder converted by data_tools/convert_hf.py}."""
    out = {}
    for kind in KINDS:
        save = tmp_path_factory.mktemp(kind) / "ckpt"
        assert convert_hf.main(["--hf-dir", str(folder(kind)), "--save", str(save)]) == 0
        out[kind] = save
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_losses_and_greedy_generation_equal_transformers(converted, kind):
    import mindspore as ms
    import rapidgpt
    from rapidgpt.models.generation import generate_ids

    ref = reference(kind)
    ids = ref["input_ids"].astype(np.int32)
    for source in (folder(kind), converted[kind]):          # the HF folder itself and the checkpoint
        model = rapidgpt.load_pretrained(str(source))
        for start, key in ((0, "logits"), (97, "logits_from_97")):
            positions = ms.Tensor(np.tile(np.arange(start, start + ids.shape[1], dtype=np.int32), (2, 1)))
            logits = model(ms.Tensor(ids), positions).asnumpy()
            np.testing.assert_allclose(next_token_losses(logits, ids), next_token_losses(ref[key], ids),
                                       rtol=0, atol=1e-5, err_msg=f"{kind} {source.name} from position {start}")
        prompt = [int(t) for t in ref["prompt"][0]]
        greedy = generate_ids(model, prompt, 10)
        assert prompt + greedy == [int(t) for t in ref["greedy64"][0]], (kind, source.name)


@pytest.mark.parametrize("kind", KINDS)
def test_to_hf_and_back_is_bit_exact(converted, kind, tmp_path):
    out = tmp_path / "hf"
    assert convert_hf.main(["--to-hf", "--load", str(converted[kind]), "--hf-dir", str(out)]) == 0
    original, _ = read_safetensors(str(folder(kind) / "model.safetensors"))
    written, _ = read_safetensors(str(out / "model.safetensors"))
    assert sorted(written) == sorted(original)            # a tied lm_head stays unwritten (Qwen2)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    config, ours = (json.loads((d / "config.json").read_text()) for d in (folder(kind), out))
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
                "tie_word_embeddings", "rope_scaling"):
        assert ours.get(key) == config.get(key), (kind, key)
    assert ours["rope_theta"] == config.get("rope_theta", 10000.0)
    assert ours["head_dim"] == (config.get("head_dim") or 8)          # Mistral writes null: hidden / heads
    expected = {"mistral": "LlamaForCausalLM"}.get(kind, config["architectures"][0])
    assert ours["architectures"] == [expected]


def test_unsupported_configs_are_named(tmp_path, capsys):
    config = json.loads((folder("mistral") / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(dict(config, sliding_window=16)))
    (bad / "model.safetensors").write_bytes((folder("mistral") / "model.safetensors").read_bytes())
    assert convert_hf.main(["--hf-dir", str(bad), "--save", str(tmp_path / "out")]) == 1
    assert "sliding_window=16 is not supported (attention is over the whole sequence" in capsys.readouterr().err
    (bad / "config.json").write_text(json.dumps(dict(config, sliding_window=None,
                                                     rope_scaling={"rope_type": "yarn", "factor": 4.0})))
    assert convert_hf.main(["--hf-dir", str(bad), "--save", str(tmp_path / "out")]) == 1
    assert "of RoPE scalings only Llama 3.1's 'llama3' is implemented" in capsys.readouterr().err


def test_transformers_5_rope_parameters_are_read():
    """transformers 5 saves RoPE's settings as one rope_parameters dict instead of rope_theta and
    rope_scaling: the same flags."""
    from rapidgpt.models.hf_llama import flags_from_hf_config
    config = json.loads((folder("llama31") / "config.json").read_text())
    scaling = config.pop("rope_scaling")
    v5 = dict(config, rope_parameters=dict(scaling, rope_theta=config.pop("rope_theta")))
    assert flags_from_hf_config(v5) == flags_from_hf_config(json.loads((folder("llama31") / "config.json").read_text()))
    plain = json.loads((folder("llama") / "config.json").read_text())
    v5 = dict(plain, rope_parameters={"rope_type": "default", "rope_theta": plain.pop("rope_theta")})
    assert flags_from_hf_config(v5) == flags_from_hf_config(json.loads((folder("llama") / "config.json").read_text()))
