"""Instruction finetuning as a user runs it: `--sft` on every layout (the same run as one process within
1e-5, fp32, dropout on, 12 iterations), resumed exactly from a sharded checkpoint, `--task sft` from a
Hugging Face folder at TP=2 x DP=2 with ZeRO-2 and fp16 (the loss on answers falls; the exported folder
answers as the run's checkpoint does), and `--chat` generation against transformers' own answers."""
import json
import re
import sys
from pathlib import Path

import pytest

from batched_runs import msrun
from test_parallel import TINY, assert_same_run, assert_same_weights, checkpoint_of, single, values

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
CHATS = FIXTURES / "sft_chat"
MODEL = FIXTURES / "hf_chat_qwen_model"           # a tiny random Qwen2 with a ChatML tokenizer (reference.json)

# The TINY runs' schedule (tests/test_parallel.py: 12 iterations, dropout 0.1, validation every 6) on
# conversations: a Llama-style model (RoPE: the per-conversation position ids matter) with the Qwen2.5
# template's tokenizer, rows of 128 positions (several conversations cut, some packed together).
SFT = ("--sft", "--data-path", str(CHATS / "messages.jsonl"), str(CHATS / "alpaca.jsonl"),
       "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(FIXTURES / "hf_chat_qwen"),
       "--seq-length", "128", "--max-position-embeddings", "128", "--hidden-size", "48", "--num-attention-heads",
       "6", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
       "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights")
LAYOUTS = {"tp2-sp": (2, 2, "--sequence-parallel"), "pp2": (2, 1, "--pipeline-model-parallel-size", "2"),
           "dp2-zero3": (2, 1, "--zero-3-memory-optimization")}
SFT_RUNS = [(1, 1, *SFT)] + [(nproc, tp, *SFT, *flags) for nproc, tp, *flags in LAYOUTS.values()]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sft_layouts_print_the_single_process_run(sft_runs, layout):
    """lm loss (the mean over each iteration's answer tokens), grad norm and validation loss of 12
    iterations within 1e-5, and the same weights at the end."""
    from rapidgpt.training.checkpointing import gathered_tensors
    nproc, tp, *flags = LAYOUTS[layout]
    found, save, log = sft_runs(nproc, tp, *SFT, *flags)
    reference, single_save, single_log = sft_runs(1, 1, *SFT)
    data_line = re.search(r"> SFT data, template .*", single_log).group(0)
    assert re.search(r"train \d+ conversations in \d+ rows of 128 positions \(\d+ answer tokens\)", data_line)
    assert re.search(r"of 100 conversations [1-9]\d* cut to --seq-length 128, \d+ left out", data_line)
    assert data_line in log                                       # every layout reads the same data
    assert_same_run(found, reference)
    vocab_size = json.loads(Path(save, "iter_0000012", "metadata.json").read_text())["vocab_size"]
    assert_same_weights(gathered_tensors(save), gathered_tensors(single_save), vocab_size)


def test_sft_resumes_exactly_from_a_zero3_checkpoint_in_the_megatron_user_script(sft_runs, env, tmp_path):
    """The DP=2 ZeRO-3 run's iteration-6 checkpoint, resumed in one process by
    user_scripts/pretrain_gpt.py --sft (Megatron's pretrain_gpt.py), prints the black-box run's
    iterations 7..12 (the packed rows continue where they stopped)."""
    _, save, _ = sft_runs(2, 1, *SFT, *LAYOUTS["dp2-zero3"][2:])
    reference, _, _ = sft_runs(1, 1, *SFT)
    status, log = single(["--user-script", "user_scripts/pretrain_gpt.py", *TINY, *SFT, "--load", checkpoint_of(save, 6, tmp_path / "load"),
                                 "--tensorboard-dir", str(tmp_path / "tb")], env)
    assert status == 0, log[-3000:]
    assert_same_run(values(log, tmp_path / "tb"), reference[13:])    # iterations 7..12, the last 2 validations


@pytest.mark.ranks
def test_task_sft_from_a_hugging_face_folder_at_tp2_x_dp2_zero2_fp16(env, tmp_path):
    """The loss on answers falls; the run answers --prompt with the chat template; its checkpoint,
    exported with --to-hf, is a Hugging Face folder whose greedy answer (through RapidGPT's HF loader,
    held to transformers by tests/test_hf_llama.py) equals the checkpoint's own answer."""
    sys.path.insert(0, str(REPO / "data_tools"))
    import convert_hf
    import rapidgpt
    from rapidgpt.models.generation import generate_ids
    from rapidgpt.tokenizer.chat_template import ChatTemplate
    from rapidgpt.tokenizer.hf_tokenizer import HuggingFaceTokenizer

    save, prompt = tmp_path / "sft", "what is the capital of France?"
    argv = ["--task", "sft", "--pretrained-model-name-or-path", str(MODEL), "--data-path",
            str(CHATS / "sharegpt.jsonl"), "--split", "90,10,0", "--seq-length", "256", "--micro-batch-size", "2",
            "--global-batch-size", "8", "--train-iters", "24", "--lr", "3e-3", "--lr-warmup-iters", "2",
            "--eval-interval", "12", "--eval-iters", "1", "--log-interval", "4", "--no-progress-bar",
            "--tensor-model-parallel-size", "2", "--zero-2-memory-optimization", "--fp16", "--initial-loss-scale", "8",
            "--save", str(save), "--save-interval", "24", "--prompt", prompt, "--max-new-tokens", "8"]
    status, log = msrun(4, ["rapidgpt/cli.py", *argv], tmp_path / "logs", env, timeout=600)
    assert status == 0, log[-3000:]
    losses = [float(v) for v in re.findall(r" iteration\s+\d+/.*?\| lm loss: ([\d.E+-]+)", log)]
    validation = [float(v) for v in re.findall(r"validation loss at iteration \d+ \| lm loss value: ([\d.E+-]+)", log)]
    assert len(losses) == 6 and losses[-1] < 0.8 * losses[0] and validation[1] < validation[0], (losses, validation)
    assert "answer (greedy): " in log

    # the checkpoint answers (fp32) as the exported folder does
    status, generated = single(["--task", "text_generation", "--load", str(save), "--chat", "--prompt", prompt,
                                "--max-new-tokens", "8"], env)
    assert status == 0, generated[-3000:]
    exported = tmp_path / "hf"
    assert convert_hf.main(["--to-hf", "--load", str(save), "--hf-dir", str(exported)]) == 0
    assert (exported / "chat_template.jinja").read_bytes() == (MODEL / "chat_template.jinja").read_bytes()
    tokenizer = HuggingFaceTokenizer(str(exported))
    template = ChatTemplate.from_flags(str(exported))
    new = generate_ids(rapidgpt.load_pretrained(str(exported)), template.prompt_ids(tokenizer, prompt), 8,
                       template.stop_sequences(tokenizer))
    assert f"answer: {tokenizer.detokenize(new)!r}" in generated


@pytest.mark.parametrize("source", ["folder", "checkpoint"])
def test_chat_answers_equal_transformers(source, tmp_path, capsys):
    """--chat renders the prompt with the folder's template and its generation prompt and greedy-decodes:
    the answer ids equal transformers' `generate` on the same folder (reference.json)."""
    import rapidgpt
    from rapidgpt.models.generation import generate_ids
    from rapidgpt.tasks import text_generation
    from rapidgpt.tokenizer.chat_template import ChatTemplate
    from rapidgpt.tokenizer.hf_tokenizer import HuggingFaceTokenizer

    reference = json.loads((MODEL / "reference.json").read_text())
    tokenizer, template = HuggingFaceTokenizer(str(MODEL)), ChatTemplate.from_flags(str(MODEL))
    if source == "folder":
        model = rapidgpt.load_pretrained(str(MODEL))
        for row in reference:
            ids = tokenizer.text_to_ids(template.render(row["prompt"], add_generation_prompt=True))
            assert ids == row["prompt_ids"]
            new = generate_ids(model, ids, 12, template.stop_sequences(tokenizer))
            assert new == row["answer_ids"]
        return
    sys.path.insert(0, str(REPO / "data_tools"))
    import convert_hf
    assert convert_hf.main(["--hf-dir", str(MODEL), "--save", str(tmp_path / "ckpt")]) == 0
    capsys.readouterr()
    row = next(row for row in reference if len(row["prompt"]) == 1)          # a user turn alone
    assert text_generation.main(["--task", "text_generation", "--load", str(tmp_path / "ckpt"), "--chat",
                                 "--prompt", row["prompt"][0]["content"], "--max-new-tokens", "12"]) == 0
    assert f"answer: {tokenizer.detokenize(row['answer_ids'])!r}" in capsys.readouterr().out
