"""Instruction-finetuning data: conversations read in three shapes, rendered with the model's own chat
template to the ids transformers' apply_chat_template gives, answer masks equal to the masks transformers
derives from `{% generation %}`-tagged copies of the templates, packing that changes no per-token loss.

The references (tests/fixtures/sft_chat/reference.json) and the tokenizer folders with the chat templates
of Qwen2.5 (ChatML), Llama 3.1 and Qwen3-Thinking come from tests/fixtures/make_hf_chat_fixtures.py
(transformers 4.57.6, not a test dependency)."""
import json
import os

import numpy as np
import pytest

from rapidgpt.data.chat_data import ChatDataError, read_conversations
from rapidgpt.data.sft_dataset import SFTDataConfig, SFTDataset, cached_encoding, encode_files, pack_rows
from rapidgpt.tokenizer.chat_template import ChatTemplate, ChatTemplateError, encode_conversation
from rapidgpt.tokenizer.hf_tokenizer import HuggingFaceTokenizer

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
CHATS = os.path.join(FIXTURES, "sft_chat")
FOLDERS = ("hf_chat_qwen", "hf_chat_llama3", "hf_chat_qwen3")
SHAPES = ("messages", "sharegpt", "alpaca")


@pytest.fixture(scope="module")
def reference():
    with open(os.path.join(CHATS, "reference.json"), encoding="utf-8") as f:
        return json.load(f)


def folder_and_template(name):
    folder = os.path.join(FIXTURES, name)
    return HuggingFaceTokenizer(folder), ChatTemplate.from_flags(folder)


@pytest.mark.parametrize("name", FOLDERS)
def test_ids_and_answer_masks_equal_transformers_on_50_conversations_of_each_shape(reference, name):
    tokenizer, template = folder_and_template(name)
    for shape in SHAPES:
        conversations = read_conversations(os.path.join(CHATS, f"{shape}.jsonl")).conversations
        expected = reference[name][shape]
        assert len(conversations) == len(expected) == 50
        for conversation, ref in zip(conversations, expected):
            ids, answer = encode_conversation(template, tokenizer, conversation.messages)
            assert ids.tolist() == ref["ids"], conversation.where
            assert answer.astype(int).tolist() == ref["answer"], conversation.where
            # the generation prompt (what --chat sends the model) too
            assert tokenizer.text_to_ids(template.render(ref["prompt"], add_generation_prompt=True)) == ref["prompt_ids"]


def test_answers_hold_the_end_of_turn_token_and_no_prompt_token():
    """The pitfalls: an answer mask without the end-of-turn token (the model never learns to stop), a
    header in the answer, a second BOS."""
    for name, end in (("hf_chat_qwen", "<|im_end|>"), ("hf_chat_llama3", "<|eot_id|>"), ("hf_chat_qwen3", "<|im_end|>")):
        tokenizer, template = folder_and_template(name)
        user = [{"role": "user", "content": "q"}]
        header = tokenizer.text_to_ids(template.render(user, True)[len(template.render(user)):])
        end_id = tokenizer.token_to_id(end)
        for conversation in read_conversations(os.path.join(CHATS, "messages.jsonl")).conversations:
            ids, answer = encode_conversation(template, tokenizer, conversation.messages)
            last = np.flatnonzero(answer & ~np.append(answer[1:], False))        # each span's last token
            closing = ids[last] if name == "hf_chat_llama3" else ids[last - 1]  # (Qwen: "<|im_end|>" "\n")
            assert np.all(closing == end_id) and len(last) == sum(m["role"] == "assistant" for m in conversation.messages)
            first = np.flatnonzero(answer & ~np.insert(answer[:-1], 0, False))   # each span's first token
            assert not np.isin(ids[first], header[-1:]).any()                   # not the header's last token
            if tokenizer.bos is not None:
                assert np.sum(ids == tokenizer.bos) == 1 and ids[0] == tokenizer.bos


def test_qwen3_think_blocks_are_found_where_the_turn_renders_otherwise_when_last(reference):
    """Qwen3 writes an assistant turn with a think block only while no user turn follows it: the answer
    spans of earlier turns come from the end-of-turn text, not from re-rendering the shorter conversation."""
    tokenizer, template = folder_and_template("hf_chat_qwen3")
    conversation = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
                    {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    text = template.render(conversation)
    spans = template.answer_spans(conversation, text)
    assert [text[s:e] for s, e in spans] == ["b<|im_end|>\n", "\n</think>\n\nd<|im_end|>\n"]


def test_builtin_formats_render_as_the_families_do():
    tokenizer, _ = folder_and_template("hf_chat_llama3")
    folder = os.path.join(FIXTURES, "hf_chat_llama3")
    conversation = [{"role": "system", "content": "S"}, {"role": "user", "content": " U "},
                    {"role": "assistant", "content": "A"}]
    chatml = ChatTemplate.from_flags(folder, "chatml")
    assert chatml.render(conversation, add_generation_prompt=False) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n U <|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    llama3 = ChatTemplate.from_flags(folder, "llama3")
    assert llama3.render(conversation[:2], add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
        "<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    text = llama3.render(conversation)
    assert [text[s:e] for s, e in llama3.answer_spans(conversation, text)] == ["A<|eot_id|>"]
    # --chat-template over everything, as text or as a file
    assert ChatTemplate.from_flags(folder, "chatml", "{{ messages[0]['content'] }}").render(conversation) == "S"
    with pytest.raises(ChatTemplateError, match="no chat_template; name a format with --sft-tokenizer-prompt-format"):
        ChatTemplate.from_flags(os.path.join(FIXTURES, "hf_tokenizer_tiny"))
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        ChatTemplate.from_flags(folder, chat_template="{% for %}")


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return str(path)


BAD_LINES = [
    ('{"messages": [{"role": "user", "content": "hi"}]}', "the line has no assistant turn with content"),
    ('{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", '
     '"content": "a"}, {"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}',
     "conversation 2 of the line \\(from its system turn\\) has no assistant turn"),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "turn 1: role 'robot' is not one of"),
    ('{"conversations": [{"from": "human", "value": 3}]}', "turn 1's 'value' must be a string"),
    ('{"instruction": "x"}', "'output' must be a string"),
    ('{"text": "plain"}', "no 'messages', 'conversations'"),
    ('[1, 2]', "expected a JSON object"),
    ('{"messages": [', "Expecting value"),
]


@pytest.mark.parametrize("line,problem", BAD_LINES)
def test_a_bad_line_is_named_and_refused(tmp_path, line, problem):
    good = '{"instruction": "a", "output": "b"}'
    path = write_lines(tmp_path / "d.jsonl", [good, "", line])
    with pytest.raises(ChatDataError, match=f"d.jsonl:3: .*{problem}.*--sft-bad-lines skip"):
        read_conversations(path)


def test_bad_lines_are_skipped_and_counted_on_request(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", ['{"instruction": "a", "input": "c", "output": "b"}']
                       + [line for line, _ in BAD_LINES]
                       + ['{"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, '
                          '{"from": "gpt", "value": "r"}]}'])
    chat_file = read_conversations(path, bad_lines="skip")
    assert [c.messages for c in chat_file.conversations] == [
        [{"role": "user", "content": "a\n\nc"}, {"role": "assistant", "content": "b"}],
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]]
    assert [p.split(": ")[0] for p in chat_file.skipped] == [f"{path}:{n}" for n in range(2, 2 + len(BAD_LINES))]


def test_a_messages_line_holds_several_conversations_each_opened_by_its_system_turn(tmp_path):
    """Megatron's SFT lines: [system, user, assistant, system, user, assistant] is two conversations."""
    turns = [{"role": r, "content": c} for r, c in (("system", "s1"), ("user", "q1"), ("assistant", "a1"),
                                                     ("system", "s2"), ("user", "q2"), ("assistant", "a2"))]
    path = write_lines(tmp_path / "d.jsonl", [json.dumps({"messages": turns})])
    conversations = read_conversations(path).conversations
    assert [c.messages for c in conversations] == [turns[:3], turns[3:]]
    assert [c.where for c in conversations] == [f"{path}:1"] * 2


def encoded(tmp_path, config, lines=None):
    tokenizer, template = folder_and_template("hf_chat_qwen")
    paths = [write_lines(tmp_path / "d.jsonl", lines)] if lines else [os.path.join(CHATS, "messages.jsonl")]
    return encode_files(paths, template, tokenizer, config), tokenizer, template


def test_rows_shift_labels_once_and_mask_all_but_the_answers(tmp_path, reference):
    config = SFTDataConfig(seq_length=512, seed=3, pad=0)
    encoding, _, _ = encoded(tmp_path, config)
    ds = SFTDataset(encoding, np.arange(50), None, config)
    seen = 0
    for i in range(len(ds)):
        sample = ds[i]
        starts, end = np.flatnonzero(sample["position_ids"] == 0), 0
        for c, start in zip(ds.rows[int(ds.shuffle_index[i])], starts):
            ref = reference["hf_chat_qwen"]["messages"][c]
            n = len(ref["ids"]) - 1
            assert sample["tokens"][start:start + n].tolist() == ref["ids"][:-1]
            assert sample["labels"][start:start + n].tolist() == ref["ids"][1:]       # shifted once
            assert sample["loss_mask"][start:start + n].tolist() == ref["answer"][1:]
            assert sample["position_ids"][start:start + n].tolist() == list(range(n))
            block = sample["attention_mask"][0, start:start + n]
            assert not block[:, start:start + n][np.tril(np.ones((n, n), bool))].any()   # causal inside
            assert block[:, :start].all() and block[:, start + n:].all()                   # nothing outside
            seen, end = seen + 1, start + n
        assert sample["loss_mask"][end:].sum() == 0 and (end == 512 or sample["position_ids"][end] == 0)   # padding
    assert seen == 50 and len(ds) < 50                     # packed: several conversations per row


def test_long_conversations_are_cut_and_counted_or_refused(tmp_path):
    long_prompt = '{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "ok"}]}' % ("word " * 200)
    long_answer = '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "%s"}]}' % ("word " * 200)
    lines = [long_prompt, long_answer, '{"instruction": "a", "output": "b"}']
    encoding, _, _ = encoded(tmp_path, SFTDataConfig(seq_length=128), lines)
    assert encoding["counts"].tolist() == [3, 0, 2, 1]           # read, skipped, cut, left out (no answer left)
    assert np.diff(encoding["offsets"]).tolist() == [129, 82]    # the long answer cut, the short one whole
    assert encoding["answer"][1:129].any()
    with pytest.raises(ChatDataError, match="d.jsonl:1: the conversation is 683 tokens, longer than --seq-length 128"):
        encoded(tmp_path, SFTDataConfig(seq_length=128, too_long="refuse"), lines)


def test_the_encoding_is_cached_under_a_key_of_files_tokenizer_and_template(tmp_path):
    tokenizer, template = folder_and_template("hf_chat_qwen")
    path = write_lines(tmp_path / "d.jsonl", ['{"instruction": "a", "output": "b"}'])
    config = SFTDataConfig(seq_length=128, data_cache_path=str(tmp_path / "cache"))
    first = cached_encoding([path], template, tokenizer, [], config)
    assert len(os.listdir(tmp_path / "cache" / "SFTDataset")) == 5
    assert cached_encoding([path], template, tokenizer, [], config)["ids"].tolist() == first["ids"].tolist()
    write_lines(tmp_path / "d.jsonl", ['{"instruction": "a", "output": "c"}'])          # edited: a new encoding
    assert cached_encoding([path], template, tokenizer, [], config)["ids"].tolist() != first["ids"].tolist()
    other = ChatTemplate.from_flags(os.path.join(FIXTURES, "hf_chat_qwen"), "chatml")
    cached_encoding([path], other, tokenizer, [], config)
    assert len(os.listdir(tmp_path / "cache" / "SFTDataset")) == 15


def test_packing_fills_rows_in_order():
    assert pack_rows([10, 20, 30, 5, 41], 40) == [[0, 1], [2, 3], [4]]
    assert pack_rows([10, 20, 30], 40, pack=False) == [[0], [1], [2]]


def test_packed_rows_give_each_conversation_its_unpacked_per_token_losses(tmp_path):
    """8 conversations packed into rows vs one per row, through a Llama-style model (RoPE: the reset
    position ids matter; the block-diagonal mask stops conversations attending to each other)."""
    from mindspore import Tensor

    from rapidgpt.arguments import parse_args
    from rapidgpt.models.gpt import build_gpt_model
    from rapidgpt.parallel.random import initialize_parameters

    tokenizer, template = folder_and_template("hf_chat_llama3")
    paths = [os.path.join(CHATS, "sharegpt.jsonl")]
    packed_config = SFTDataConfig(seq_length=320, seed=1, pad=tokenizer.eod)
    encoding = encode_files(paths, template, tokenizer, packed_config)
    eight = np.arange(8)
    packed = SFTDataset(encoding, eight, None, packed_config)
    alone = SFTDataset(encoding, eight, None, SFTDataConfig(seq_length=320, seed=1, pad=tokenizer.eod, pack=False))
    assert len(packed) < 8 == len(alone)

    flags = ["--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "6", "--seq-length", "320",
             "--max-position-embeddings", "320", "--vocab-size", str(tokenizer.vocab_size), "--train-iters", "1",
             "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--group-query-attention",
             "--num-query-groups", "2", "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
    model = build_gpt_model(parse_args(argv=flags), tokenizer.vocab_size)
    initialize_parameters(model, 7)
    model.set_train(False)

    def losses(ds):
        """{conversation: its per-token losses where the loss mask is 1}"""
        out = {}
        for i in range(len(ds)):
            s = ds[i]
            loss = model(*(Tensor(s[k][None]) for k in ("tokens", "position_ids")), Tensor(s["attention_mask"][None]),
                         Tensor(s["labels"][None])).asnumpy()[0]
            starts = np.flatnonzero(s["position_ids"] == 0)
            for c, start in zip(ds.rows[int(ds.shuffle_index[i])], starts):
                n = int(encoding["offsets"][c + 1] - encoding["offsets"][c]) - 1
                mask = s["loss_mask"][start:start + n] > 0
                out[int(c)] = loss[start:start + n][mask]
        return out

    packed_losses, alone_losses = losses(packed), losses(alone)
    assert sorted(packed_losses) == list(range(8))
    for c in range(8):
        assert len(packed_losses[c]) > 0
        np.testing.assert_allclose(packed_losses[c], alone_losses[c], rtol=0, atol=1e-6)


@pytest.mark.parametrize("argv, message", [
    (["--task", "sft", "--train-iters", "2"], "--tokenizer-type: --sft renders conversations with a tokenizer"),
    (["--task", "sft", "--train-iters", "2", "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
      os.path.join(FIXTURES, "hf_chat_qwen"), "--data-path", os.path.join(CHATS, "reference.json"), "x.txt"],
     "--data-path x.txt: --sft reads conversations from .jsonl files"),
    (["--task", "pretraining", "--train-iters", "2", "--sft-too-long", "refuse"],
     "--sft-too-long: takes effect with --sft (or --task sft) only"),
    (["--task", "pretraining", "--train-iters", "2", "--chat"], "--chat: chat generation is --task text_generation's"),
    (["--task", "sft", "--train-iters", "2", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file",
      os.path.join(CHATS, "alpaca.jsonl")], "--tokenizer-type BertWordPieceLowerCase: --sft finds the answer tokens"),
])
def test_sft_flags_are_checked_with_one_line_each(argv, message, capsys):
    from rapidgpt.arguments import parse_args
    with pytest.raises(SystemExit):
        parse_args(argv=argv)
    assert message in capsys.readouterr().err
