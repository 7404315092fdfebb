"""Tokenizer tests: byte-level BPE (trainer + tokenizer), BERT WordPiece, build_tokenizer, CLI.

The BPE vocabulary is trained here on the English docs of `pydoc_data.topics`, and the
tokenizer is checked token for token against two independent implementations: GPT-2's
original readable algorithm (written below) and HF tokenizers' Rust ByteLevelBPETokenizer.
"""
import base64
import json
import os
import shutil
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import regex
from pydoc_data.topics import topics
from tokenizers import ByteLevelBPETokenizer

from rapidgpt.tokenizer import (BertWordPieceTokenizer, GPT2BPETokenizer, build_tokenizer,
                                save_gpt2_format, train_byte_level_bpe)
from rapidgpt.tokenizer import bpe_trainer
from rapidgpt.tokenizer.gpt2_bpe import bytes_to_unicode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "data_tools"))
import train_tokenizer  # noqa: E402

TOPIC_TEXTS = [topics[k] for k in sorted(topics)]
EDGE_CASES = [
    "I'm, you're, it's, we'll, they'd, can't",
    "I'M WE'LL 'S 's'",
    "runs    of     spaces  ",
    "a\t\tb\n\n  c   \n",
    "3.14159 2026 1,000,000",
    "naïve café — 日本語のテキスト 😀👍🏽",
    "\x00\x01\x7f\u00a0\u00ad control bytes",
    "-" * 3000,  # long words exercise the heap-based merge loop
    " " * 2000 + "x",
    "",
]
ALL_TEXTS = TOPIC_TEXTS + EDGE_CASES
VOCAB_SIZE = 2000


@pytest.fixture(scope="session")
def bpe_files(tmp_path_factory):
    vocab, merges = train_byte_level_bpe(TOPIC_TEXTS, VOCAB_SIZE)
    return save_gpt2_format(vocab, merges, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="session")
def gpt2(bpe_files):
    return GPT2BPETokenizer(*bpe_files)


# --- reference implementations -------------------------------------------------------------

class ReferenceGPT2:
    """GPT-2's original encoder algorithm, kept readable: no cache, O(n^2) merge loop."""

    def __init__(self, vocab_file, merges_file):
        with open(vocab_file, encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_file, encoding="utf-8") as f:
            lines = f.read().split("\n")[1:]
        self.ranks = {tuple(line.split()): i for i, line in enumerate(l for l in lines if l)}
        printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                     + list(range(ord("®"), ord("ÿ") + 1)))
        chars, n = printable[:], 0
        for b in range(256):
            if b not in printable:
                printable.append(b)
                chars.append(256 + n)
                n += 1
        self.byte_encoder = dict(zip(printable, map(chr, chars)))
        self.pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+"""
                                     r"""| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

    def bpe(self, token):
        word = tuple(token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            new_word, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == bigram:
                    new_word.append(word[i] + word[i + 1])
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        return word

    def encode(self, text):
        ids = []
        for token in self.pattern.findall(text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            ids += [self.encoder[t] for t in self.bpe(token)]
        return ids


def reference_train(texts, num_merges):
    """Textbook BPE training: recount every pair after every merge."""
    byte_encoder = bytes_to_unicode()
    counts = Counter(w for t in texts for w in regex.findall(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""", t))
    words = {tuple(byte_encoder[b] for b in w.encode("utf-8")): c for w, c in counts.items()}
    merges = []
    for _ in range(num_merges):
        pairs = Counter()
        for word, c in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
        for word, c in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = c
        words = merged
    return merges


# --- GPT-2 BPE tokenizer -------------------------------------------------------------------

def test_roundtrip(gpt2):
    for text in ALL_TEXTS:
        assert gpt2.detokenize(gpt2.tokenize(text)) == text
    assert gpt2.tokenize("") == []


def test_matches_reference_gpt2_algorithm(gpt2, bpe_files):
    reference = ReferenceGPT2(*bpe_files)
    for text in ALL_TEXTS:
        assert gpt2.tokenize(text) == reference.encode(text), text[:80]


def test_matches_hf_tokenizers(gpt2, bpe_files):
    hf = ByteLevelBPETokenizer(*[str(p) for p in bpe_files])
    for text in ALL_TEXTS:
        assert gpt2.tokenize(text) == hf.encode(text).ids, text[:80]


def test_properties(gpt2):
    assert gpt2.vocab_size == VOCAB_SIZE == len(gpt2.vocab)
    assert gpt2.eod == gpt2.eod_id == gpt2.pad == gpt2.vocab["<|endoftext|>"] == VOCAB_SIZE - 1
    assert all(gpt2.inv_vocab[i] == tok for tok, i in gpt2.vocab.items())
    assert gpt2.detokenize([gpt2.eod]) == "<|endoftext|>"
    # Tokens are sequences of bytes: a lone UTF-8 lead byte decodes to U+FFFD.
    assert gpt2.detokenize([gpt2.vocab[bytes_to_unicode()[0xF0]]]) == "\ufffd"


def test_merges_header_is_optional(gpt2, bpe_files, tmp_path):
    vocab_file, merges_file = bpe_files
    with open(merges_file, encoding="utf-8") as f:
        lines = f.read().split("\n")
    headerless = tmp_path / "merges.txt"
    headerless.write_text("\n".join(lines[1:]), encoding="utf-8")
    other = GPT2BPETokenizer(vocab_file, headerless)
    assert other.tokenize(TOPIC_TEXTS[0]) == gpt2.tokenize(TOPIC_TEXTS[0])


def test_file_errors(bpe_files, tmp_path):
    vocab_file, merges_file = bpe_files
    with pytest.raises(FileNotFoundError, match="vocab file not found.*nope.json"):
        GPT2BPETokenizer(tmp_path / "nope.json", merges_file)
    with pytest.raises(FileNotFoundError, match="merges file not found.*nope.txt"):
        GPT2BPETokenizer(vocab_file, tmp_path / "nope.txt")

    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.json.* is not valid JSON"):
        GPT2BPETokenizer(bad_json, merges_file)

    with open(vocab_file, encoding="utf-8") as f:
        vocab = json.load(f)
    del vocab["<|endoftext|>"]
    no_eod = tmp_path / "no_eod.json"
    no_eod.write_text(json.dumps(vocab), encoding="utf-8")
    with pytest.raises(ValueError, match=r"no_eod.json.*<\|endoftext\|>"):
        GPT2BPETokenizer(no_eod, merges_file)

    bad_merges = tmp_path / "bad_merges.txt"
    bad_merges.write_text("#version: 0.2\nĠ t\nĠ t h\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad_merges.txt.*line 3: expected two"):
        GPT2BPETokenizer(vocab_file, bad_merges)


# --- BPE trainer ---------------------------------------------------------------------------

def test_trainer_vocab_layout(bpe_files):
    vocab_file, merges_file = bpe_files
    with open(vocab_file, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_file, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0] == "#version: 0.2"
    merges = [tuple(line.split(" ")) for line in lines[1:]]
    assert len(vocab) == VOCAB_SIZE and len(merges) == VOCAB_SIZE - 257
    by_id = sorted(vocab, key=vocab.get)
    assert by_id[:256] == list(bytes_to_unicode().values())  # GPT-2's byte order: "!" is 0
    assert by_id[256:-1] == [a + b for a, b in merges]  # one id per merge, in merge order
    assert by_id[-1] == "<|endoftext|>"


def test_trainer_matches_reference_training():
    texts = TOPIC_TEXTS[:10]
    _, merges = train_byte_level_bpe(texts, 256 + 150 + 1)
    assert merges == reference_train(texts, 150)


def test_trainer_is_deterministic(monkeypatch):
    texts = TOPIC_TEXTS[:20]
    first = train_byte_level_bpe(texts, 800)
    assert train_byte_level_bpe(texts, 800) == first
    # Small batches so that both workers really count part of the corpus.
    monkeypatch.setattr(bpe_trainer, "_BATCH_CHARS", 5000)
    assert train_byte_level_bpe(texts, 800, workers=2) == first


def test_trainer_stops_when_out_of_pairs():
    vocab, merges = train_byte_level_bpe(["ab ab abc"], 1000, special_tokens=("<s>", "</s>"))
    # Words "ab", " ab", " abc" become single tokens after 3 merges; then no pairs are left.
    assert merges == [("a", "b"), ("Ġ", "ab"), ("Ġab", "c")]
    assert len(vocab) == 256 + 3 + 2
    assert vocab["<s>"] == 259 and vocab["</s>"] == 260


def test_trainer_rejects_small_vocab():
    with pytest.raises(ValueError, match="vocab_size=256 is too small.*at least 257"):
        train_byte_level_bpe(["text"], 256)


# --- BERT WordPiece ------------------------------------------------------------------------

BERT_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "Hello", "world",
              "un", "##aff", "##able", ",", "!", "'", "naive", "cafe", "日", "本", "a", "##a"]


@pytest.fixture
def bert_vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(BERT_VOCAB) + "\n", encoding="utf-8")
    return path


def _pieces(tokenizer, text):
    return [tokenizer.inv_vocab[i] for i in tokenizer.tokenize(text)]


def test_bert_lower_case(bert_vocab_file):
    bert = BertWordPieceTokenizer(bert_vocab_file, lower_case=True)
    assert _pieces(bert, "Hello, WORLD!") == ["hello", ",", "world", "!"]
    assert _pieces(bert, "Naïve CAFÉ") == ["naive", "cafe"]  # accents stripped
    assert _pieces(bert, "unaffable") == ["un", "##aff", "##able"]
    assert _pieces(bert, "unaffablex hello") == ["[UNK]", "hello"]  # unsplittable word
    assert _pieces(bert, "hello日本world") == ["hello", "日", "本", "world"]
    assert _pieces(bert, "hel\x00lo\u200b\tworld") == ["hello", "world"]  # controls dropped
    assert bert.tokenize("a" * 100) == [bert.vocab["a"]] + [bert.vocab["##a"]] * 99
    assert bert.tokenize("a" * 101) == [bert.unk]
    assert bert.detokenize(bert.tokenize("Hello, unaffable world!")) == \
        "hello , unaffable world !"


def test_bert_cased(bert_vocab_file):
    bert = BertWordPieceTokenizer(bert_vocab_file, lower_case=False)
    assert _pieces(bert, "Hello hello World") == ["Hello", "hello", "[UNK]"]
    assert _pieces(bert, "naïve naive") == ["[UNK]", "naive"]  # accents kept when cased
    assert _pieces(bert, "world's") == ["world", "'", "[UNK]"]


def test_bert_special_ids(bert_vocab_file, tmp_path):
    bert = BertWordPieceTokenizer(bert_vocab_file)
    assert (bert.pad, bert.unk, bert.cls, bert.sep, bert.mask) == (0, 1, 2, 3, 4)
    assert bert.eod == bert.sep
    assert bert.vocab_size == len(BERT_VOCAB)
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("\n".join(t for t in BERT_VOCAB if t != "[MASK]"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"no_mask.txt.*\[MASK\]"):
        BertWordPieceTokenizer(no_mask)


# --- build_tokenizer -----------------------------------------------------------------------

def test_build_tokenizer(bpe_files, bert_vocab_file):
    vocab_file, merges_file = bpe_files
    gpt2 = build_tokenizer(SimpleNamespace(tokenizer_type="GPT2BPETokenizer",
                                           vocab_file=vocab_file, merge_file=merges_file))
    assert isinstance(gpt2, GPT2BPETokenizer)
    cased = build_tokenizer(SimpleNamespace(tokenizer_type="BertWordPieceCase",
                                            vocab_file=bert_vocab_file))
    assert isinstance(cased, BertWordPieceTokenizer) and not cased.lower_case
    lower = build_tokenizer(SimpleNamespace(tokenizer_type="BertWordPieceLowerCase",
                                            vocab_file=bert_vocab_file))
    assert lower.lower_case


def test_build_tokenizer_errors(bpe_files, tmp_path):
    vocab_file, _ = bpe_files
    with pytest.raises(ValueError, match="unknown --tokenizer-type 'SentencePiece': choose "
                                         "one of GPT2BPETokenizer"):
        build_tokenizer(SimpleNamespace(tokenizer_type="SentencePiece", vocab_file=vocab_file))
    with pytest.raises(ValueError, match="--merge-file is required for --tokenizer-type "
                                         "GPT2BPETokenizer: pass the merges.txt"):
        build_tokenizer(SimpleNamespace(tokenizer_type="GPT2BPETokenizer", vocab_file=vocab_file))
    with pytest.raises(ValueError, match="--vocab-file is required"):
        build_tokenizer(SimpleNamespace(tokenizer_type="BertWordPieceCase"))
    with pytest.raises(FileNotFoundError, match="BERT vocab file not found.*missing.txt"):
        build_tokenizer(SimpleNamespace(tokenizer_type="BertWordPieceCase",
                                        vocab_file=str(tmp_path / "missing.txt")))


# --- data_tools/train_tokenizer.py ---------------------------------------------------------

def test_cli_trains_from_jsonl(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as f:
        for text in TOPIC_TEXTS[:15]:
            f.write(json.dumps({"text": text, "id": 1}) + "\n")
    out = tmp_path / "tok"
    assert train_tokenizer.main(["--input", str(corpus), "--vocab-size", "600",
                                 "--output-dir", str(out), "--workers", "2"]) == 0
    assert "learned 343 merges" in capsys.readouterr().out
    tokenizer = GPT2BPETokenizer(out / "vocab.json", out / "merges.txt")
    assert tokenizer.vocab_size == 600
    assert tokenizer.detokenize(tokenizer.tokenize(TOPIC_TEXTS[0])) == TOPIC_TEXTS[0]
    # Same corpus as plain text gives the same kind of vocabulary.
    text_corpus = tmp_path / "corpus.txt"
    text_corpus.write_text("".join(TOPIC_TEXTS[:15]), encoding="utf-8")
    assert train_tokenizer.main(["--input", str(text_corpus), "--vocab-size", "600",
                                 "--output-dir", str(tmp_path / "tok_txt")]) == 0
    assert GPT2BPETokenizer(tmp_path / "tok_txt" / "vocab.json",
                            tmp_path / "tok_txt" / "merges.txt").vocab_size == 600


def test_cli_bad_json_line(tmp_path):
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"text": "ok"}\n{"text": "fine"}\n{"text": broken}\n', encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        train_tokenizer.main(["--input", str(corpus), "--vocab-size", "300",
                              "--output-dir", str(tmp_path / "out")])
    assert exit_info.value.code != 0
    assert f"{corpus}:3: invalid JSON line" in str(exit_info.value.code)
    assert not (tmp_path / "out").exists()

    corpus.write_text('{"body": "no text key"}\n', encoding="utf-8")
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: .*string field 'text'"):
        train_tokenizer.main(["--input", str(corpus), "--vocab-size", "300",
                              "--output-dir", str(tmp_path / "out")])


@pytest.mark.parametrize("kind", ["BertWordPieceLowerCase", "BertWordPieceCase"])
def test_cli_makes_a_bert_wordpiece_vocab_that_hf_tokenizers_reads_alike(tmp_path, capsys, kind):
    """--tokenizer-type BertWordPiece*: a vocab.txt that RapidGPT's BERT tokenizer and HF
    tokenizers' BertWordPieceTokenizer both load and split into the same ids."""
    from tokenizers import BertWordPieceTokenizer as HFBertWordPieceTokenizer
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TOPIC_TEXTS[:15]), encoding="utf-8")
    out = tmp_path / "tok"
    assert train_tokenizer.main(["--input", str(corpus), "--vocab-size", "800", "--output-dir", str(out),
                                 "--tokenizer-type", kind]) == 0
    assert f"made a WordPiece vocabulary of 800 tokens for {kind}" in capsys.readouterr().out
    lower_case = kind == "BertWordPieceLowerCase"
    ours = BertWordPieceTokenizer(out / "vocab.txt", lower_case=lower_case)
    theirs = HFBertWordPieceTokenizer(str(out / "vocab.txt"), lowercase=lower_case)
    assert ours.vocab_size == theirs.get_vocab_size() == 800
    assert (ours.pad, ours.unk, ours.cls, ours.sep, ours.mask) == (0, 1, 2, 3, 4)
    assert ("The" in ours.vocab) is not lower_case and "the" in ours.vocab
    sentence = "The assert statement: if __debug__, Naïve CAFÉ x = 12_000 raises AssertionError! 日本"
    ids = ours.tokenize(sentence)
    assert ids == theirs.encode(sentence, add_special_tokens=False).ids
    assert ours.detokenize(ids).startswith("the assert statement :" if lower_case else "The assert statement :")
    for text in TOPIC_TEXTS[:15]:
        assert ours.tokenize(text) == theirs.encode(text, add_special_tokens=False).ids


# ---- Hugging Face tokenizer folders (--tokenizer-type HuggingFaceTokenizer) ---------------------
# tests/fixtures/hf_tokenizer_tiny: a byte-level BPE saved by transformers with a Llama-3-style
# BOS post-processor, and transformers' AutoTokenizer results on it (make_hf_tokenizer_tiny.py).
HF_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf_tokenizer_tiny")


def test_hugging_face_tokenizer_folder_gives_autotokenizers_ids():
    from rapidgpt.tokenizer import HuggingFaceTokenizer
    with open(os.path.join(HF_TOKENIZER, "reference.json"), encoding="utf-8") as f:
        reference = json.load(f)
    tokenizer = build_tokenizer(SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=HF_TOKENIZER))
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    assert tokenizer.vocab_size == reference["vocab_size"] and tokenizer.eod == reference["eos_token_id"]
    for text, ids, plain, decoded in zip(reference["texts"], reference["ids"], reference["ids_no_special"],
                                         reference["decoded"]):
        assert tokenizer.tokenize(text) == ids, text
        assert tokenizer.detokenize(plain) == decoded, text


@pytest.mark.parametrize("files, message", [
    ([], "has no tokenizer.json; give a folder a fast tokenizer was saved to"),
    (["tokenizer.json"], "no eos_token in tokenizer_config.json"),
])
def test_hugging_face_tokenizer_folder_errors(tmp_path, files, message):
    from rapidgpt.tokenizer.hf_tokenizer import TokenizerError
    for name in files:
        with open(os.path.join(HF_TOKENIZER, name), "rb") as source:
            (tmp_path / name).write_bytes(source.read())
    with pytest.raises(TokenizerError, match=message):
        build_tokenizer(SimpleNamespace(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(tmp_path)))


# ---- SentencePiece models (--tokenizer-type GPTSentencePieceTokenizer / Llama2Tokenizer) ---------
# tests/fixtures/sentencepiece_tiny: a SentencePiece BPE model with Llama 2's settings, saved by
# transformers, and transformers' slow LlamaTokenizer results on it (make_sentencepiece_tiny.py).
SENTENCEPIECE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "sentencepiece_tiny")


@pytest.mark.parametrize("kind", ["Llama2Tokenizer", "GPTSentencePieceTokenizer"])
def test_sentencepiece_model_gives_llama_tokenizers_ids(kind):
    """Llama2Tokenizer: LlamaTokenizer's ids (BOS first); GPTSentencePieceTokenizer: its ids without
    special tokens; both decode as it does. Text spelling a special token is text here (Megatron's
    meaning), where LlamaTokenizer splits the token out."""
    import sentencepiece
    with open(os.path.join(SENTENCEPIECE, "reference.json"), encoding="utf-8") as f:
        reference = json.load(f)
    model = os.path.join(SENTENCEPIECE, "tokenizer.model")
    tokenizer = build_tokenizer(SimpleNamespace(tokenizer_type=kind, tokenizer_model=model))
    assert tokenizer.vocab_size == reference["vocab_size"] and tokenizer.eod == reference["eos_token_id"]
    special = 0
    for text, ids, plain, decoded in zip(reference["texts"], reference["ids"], reference["ids_no_special"],
                                         reference["decoded"]):
        if "</s>" in text:
            special += 1
            literal = sentencepiece.SentencePieceProcessor(model_file=model).encode(text)
            assert reference["eos_token_id"] not in literal and reference["eos_token_id"] in plain
            plain, ids = literal, [reference["bos_token_id"], *literal]
        assert tokenizer.tokenize(text) == (ids if kind == "Llama2Tokenizer" else plain), text
        assert tokenizer.detokenize(plain).lstrip(" ") == decoded.lstrip(" "), text
    assert special == 1


def test_sentencepiece_problems_are_one_line(tmp_path, monkeypatch):
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    from rapidgpt.tokenizer.sentencepiece_tokenizer import SentencePieceError, model_file_problem
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(["--tokenizer-type", "GPTSentencePieceTokenizer", "--train-iters", "1"]))
    assert ("--tokenizer-model: required for --tokenizer-type GPTSentencePieceTokenizer; give the SentencePiece "
            "model file") in error.value.problems
    assert "no such file (a folder: give its tokenizer.model)" in model_file_problem("Llama2Tokenizer", str(tmp_path))
    bad = tmp_path / "tokenizer.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(SentencePieceError, match="not a SentencePiece model"):
        build_tokenizer(SimpleNamespace(tokenizer_type="Llama2Tokenizer", tokenizer_model=str(bad)))
    monkeypatch.setitem(sys.modules, "sentencepiece", None)        # as if it were not installed
    model = os.path.join(SENTENCEPIECE, "tokenizer.model")
    message = "--tokenizer-type Llama2Tokenizer needs the `sentencepiece` library; pip install sentencepiece"
    assert model_file_problem("Llama2Tokenizer", model).startswith(message)
    with pytest.raises(SentencePieceError, match=message.replace("`", ".")):
        build_tokenizer(SimpleNamespace(tokenizer_type="Llama2Tokenizer", tokenizer_model=model))


# ---- NullTokenizer: token ids written as text (Megatron's, for data that already is ids) ----------

class MegatronNullTokenizer:
    """A port of Megatron-LM's NullTokenizer (megatron/core/tokenizers/text/libraries/null_tokenizer.py,
    d98e8a6): the reference."""

    def __init__(self, vocab_size, eod_id=None):
        self.vocab_size = int(vocab_size)
        self.eod = int(eod_id) if eod_id is not None else self.vocab_size - 1

    def text_to_ids(self, text):
        return [int(x) for x in text.split(' ')]

    def ids_to_text(self, ids):
        return ' '.join(str(x) for x in ids)


@pytest.mark.parametrize("eod_id", [None, 0])
def test_null_tokenizer_is_megatrons(eod_id):
    ours = build_tokenizer(SimpleNamespace(tokenizer_type="NullTokenizer", vocab_size=100, null_tokenizer_eod_id=eod_id))
    reference = MegatronNullTokenizer(100, eod_id)
    for text in ("17 4 2 99", "0", "5 5 5"):
        assert ours.tokenize(text) == reference.text_to_ids(text)
        assert ours.detokenize(ours.tokenize(text)) == reference.ids_to_text(reference.text_to_ids(text)) == text
    assert (ours.vocab_size, ours.eod) == (reference.vocab_size, reference.eod) == (100, 99 if eod_id is None else 0)


def test_null_tokenizer_from_preprocessing_to_the_training_flags(tmp_path, capsys):
    """preprocess_data.py writes the ids (and the EOD) as they are; a line that is not ids is named by
    its number; the training flags need --vocab-size."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.data.indexed_dataset import IndexedDataset
    from rapidgpt.data.preprocess import main as preprocess
    corpus = tmp_path / "ids.jsonl"
    corpus.write_text('{"text": "3 1 4 1 5"}\n{"text": "9 2 6"}\n')
    flags = ["--tokenizer-type", "NullTokenizer", "--vocab-size", "10"]
    assert preprocess(["--input", str(corpus), "--output-prefix", str(tmp_path / "ids"), *flags, "--append-eod",
                       "--no-progress-bar"]) == 0
    data = IndexedDataset(str(tmp_path / "ids_text_document"))
    assert [list(data[i]) for i in range(len(data))] == [[3, 1, 4, 1, 5, 9], [9, 2, 6, 9]]
    corpus.write_text('{"text": "3 1"}\n{"text": "three one"}\n')
    assert preprocess(["--input", str(corpus), "--output-prefix", str(tmp_path / "bad"), *flags,
                       "--no-progress-bar"]) == 1
    assert (f"{corpus}:2: NullTokenizer reads token ids separated by single spaces, e.g. '17 4 2051'; got "
            f"'three one'") in capsys.readouterr().err
    args = parse_args(argv=["--task", "pretraining", "--train-iters", "2", "--data-path",
                            str(tmp_path / "ids_text_document"), *flags])
    assert build_tokenizer(args).vocab_size == 10
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "pretraining", "--train-iters", "2", "--data-path", str(tmp_path / "ids_text_document"),
                         "--tokenizer-type", "NullTokenizer"])
    assert ("--vocab-size: required for --tokenizer-type NullTokenizer (the data's token ids are below it); give "
            "--vocab-size N") in capsys.readouterr().err


# ---- TikTokenizer: a tiktoken vocabulary .json (Megatron's, through the optional tiktoken library) ------

MEGATRON_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"]
TIKTOKEN_TEXTS = EDGE_CASES + TOPIC_TEXTS[:3] + [
    "HelloWorld and getValue() in camelCase",
    "the end.</s><s>the next document<pad><pad>",
    "<|im_start|>user\nhi<SPECIAL_9></s",
    "digits 0123456789, ٣٤٥ and ½ of 2026",
    "tabs\tand\r\nwindows line ends\r\n\r\n  ",
    "mixed 한국어 Ελληνικά русский العربية",
    "naïve café — 日本語のテキスト\n\n\n",
]


class MegatronTikToken:
    """A port of Megatron-LM's TikTokenTokenizer (megatron/core/tokenizers/text/libraries/
    tiktoken_tokenizer.py, d98e8a6) with the arguments its build_tokenizer gives it: the reference."""

    PATTERNS = {    # _PATTERN_TIKTOKEN_V1 and _V2
        "v1": r"[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
        "v2": "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}"
              "\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
              "[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    }

    def __init__(self, path, special_tokens=None, num_special_tokens=1000, pattern="v2", vocab_size=2 ** 17):
        import tiktoken
        special_tokens = special_tokens or MEGATRON_SPECIAL_TOKENS
        self.bos, self.eod, self.pad = (special_tokens.index(t) for t in ("<s>", "</s>", "<pad>"))
        special_tokens = special_tokens + [f"<SPECIAL_{i}>" for i in range(len(special_tokens), num_special_tokens)]
        with open(path) as f:
            vocab = json.load(f)[:vocab_size - num_special_tokens]
        ranks = {base64.b64decode(x["token_bytes"]): x["rank"] + num_special_tokens for x in vocab}
        self.vocab_size = vocab_size
        self.encoding = tiktoken.Encoding(name="reference", pat_str=self.PATTERNS[pattern], mergeable_ranks=ranks,
                                          special_tokens={t: i for i, t in enumerate(special_tokens)})

    def text_to_ids(self, text):
        return self.encoding.encode(text, allowed_special="all")

    def ids_to_text(self, ids):
        return self.encoding.decode(ids)


@pytest.fixture(scope="module")
def tiktoken_json(tmp_path_factory):
    """(path, number of tokens) of a tiktoken vocabulary: the 256 bytes, 48 byte-level BPE merges
    learned on docs and multi-byte text, then a hand-made chain to HelloWorld, which only v1 keeps
    in one piece (v2 cuts before a capital)."""
    texts = TOPIC_TEXTS[:20] + ["naïve café 日本語のテキスト 2026 😀"] * 200
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    _, merges = train_byte_level_bpe(texts, 256 + 1 + 48)
    learned = [bytes(byte_of[c] for c in a + b) for a, b in merges]
    tokens = [bytes([i]) for i in range(256)] + learned + [b"He", b"Hel", b"Hello", b"Wor", b"World", b"HelloWorld"]
    assert len(set(tokens)) == len(tokens) == 256 + 48 + 6
    path = tmp_path_factory.mktemp("tiktoken") / "vocab.json"
    path.write_text(json.dumps([{"rank": i, "token_bytes": base64.b64encode(t).decode("ascii"),
                                 "token_str": t.decode("utf-8", errors="replace")} for i, t in enumerate(tokens)]))
    return str(path), len(tokens)


def tiktoken_flags(path, *flags):
    """The tokenizer preprocess_data.py builds from TikTokenizer `flags` (Megatron's defaults for the others)."""
    from rapidgpt.data.preprocess import get_args
    return build_tokenizer(get_args(["--input", "-", "--output-prefix", "-", "--tokenizer-type", "TikTokenizer",
                                     "--tokenizer-model", path, *flags]))


@pytest.mark.parametrize("flags, reference, merges", [
    ([], {}, None),
    (["--tiktoken-pattern", "v1", "--tiktoken-num-special-tokens", "12", "--tokenizer-special-tokens", "<s>", "</s>",
      "<|im_start|>", "<unk>", "<mask>", "<cls>", "<pad>", "<sep>"],
     {"pattern": "v1", "num_special_tokens": 12,
      "special_tokens": ["<s>", "</s>", "<|im_start|>", "<unk>", "<mask>", "<cls>", "<pad>", "<sep>"]}, None),
    (["--tiktoken-pattern", "v2", "--tiktoken-num-special-tokens", "7"], {"num_special_tokens": 7}, 20),
], ids=["defaults", "v1-own-special-tokens", "cut-vocabulary"])
def test_tiktokenizer_is_megatrons(tiktoken_json, flags, reference, merges):
    """The ids, text back, and special ids of Megatron's TikTokenizer with the same flags, on text with
    unicode, digits, whitespace runs and special tokens written out; --vocab-size takes the whole
    vocabulary, or its bytes and first `merges` merges."""
    path, size = tiktoken_json
    num_special = reference.get("num_special_tokens", 1000)
    vocab_size = num_special + (size if merges is None else 256 + merges)
    ours = tiktoken_flags(path, *flags, "--vocab-size", str(vocab_size))
    theirs = MegatronTikToken(path, vocab_size=vocab_size, **reference)
    assert (ours.vocab_size, ours.eod, ours.bos, ours.pad) == (theirs.vocab_size, theirs.eod, theirs.bos, theirs.pad)
    for text in TIKTOKEN_TEXTS:
        ids = ours.tokenize(text)
        assert ids == theirs.text_to_ids(text), text
        assert ours.detokenize(ids) == theirs.ids_to_text(ids) == text, text
        assert all(0 <= i < vocab_size for i in ids)
    docs = "".join(TOPIC_TEXTS[:3])
    assert len(ours.tokenize(docs)) < 0.85 * len(docs.encode("utf-8"))          # merges happen
    assert ours.tokenize("a") == [num_special + ord("a")]
    assert ours.tokenize("the end.</s><s>")[-2:] == [ours.eod, ours.bos]
    if not flags:
        assert (ours.eod, ours.bos, ours.pad) == (2, 1, 4)
    if "<|im_start|>" in flags:                          # the given special tokens, then fillers up to 12
        assert ours.tokenize("<|im_start|><SPECIAL_9>") == [2, 9] and (ours.eod, ours.bos, ours.pad) == (1, 0, 6)


def test_tiktoken_patterns_v1_and_v2(tiktoken_json):
    """v1 keeps a run of letters whole, v2 (Megatron's default) cuts it before a capital."""
    path, size = tiktoken_json
    v1, v2, default = (tiktoken_flags(path, *flags, "--vocab-size", str(1000 + size))
                       for flags in (["--tiktoken-pattern", "v1"], ["--tiktoken-pattern", "v2"], []))
    assert len(v1.tokenize("HelloWorld")) == 1
    assert v2.tokenize("HelloWorld") == v2.tokenize("Hello") + v2.tokenize("World") == default.tokenize("HelloWorld")
    assert len(v2.tokenize("HelloWorld")) == 2
    for text in ("the cat and the dog in a line\n", TOPIC_TEXTS[0].lower()):
        assert v1.tokenize(text) == v2.tokenize(text)


def test_tiktoken_from_preprocessing_to_the_training_flags(tiktoken_json, tmp_path, capsys):
    """preprocess_data.py writes Megatron's ids (and its EOD); the training flags take the same
    TikTokenizer flags, each problem in one line naming its flag."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.data.indexed_dataset import IndexedDataset
    from rapidgpt.data.preprocess import main as preprocess
    path, size = tiktoken_json
    texts = TIKTOKEN_TEXTS[-6:]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", path, "--vocab-size", str(1000 + size)]
    assert preprocess(["--input", str(corpus), "--output-prefix", str(tmp_path / "tik"), *flags, "--append-eod",
                       "--no-progress-bar"]) == 0
    theirs = MegatronTikToken(path, vocab_size=1000 + size)
    data = IndexedDataset(str(tmp_path / "tik_text_document"))
    assert [list(data[i]) for i in range(len(data))] == [theirs.text_to_ids(text) + [2] for text in texts]
    assert preprocess(["--input", str(corpus), "--output-prefix", str(tmp_path / "bad"), *flags[:-2],
                       "--no-progress-bar"]) == 1
    assert (f"preprocess_data: error: --vocab-size: {path} holds {size} tokens, fewer than --vocab-size 131072 minus "
            f"the 1000 --tiktoken-num-special-tokens; give --vocab-size {size + 1000} or less"
            ) in capsys.readouterr().err

    base = ["--task", "pretraining", "--train-iters", "2", "--data-path", str(tmp_path / "tik_text_document")]
    args = parse_args(argv=base + flags)
    assert build_tokenizer(args).tokenize(texts[0]) == theirs.text_to_ids(texts[0])
    missing = str(tmp_path / "missing.json")
    seven = list(MEGATRON_SPECIAL_TOKENS)
    for given, message in [
        (["--tokenizer-model", missing],
         f"--tokenizer-model: {missing}: no such file; give the tiktoken vocabulary .json"),
        (["--tokenizer-model", path, "--tiktoken-pattern", "v3"],
         "--tiktoken-pattern: 'v3' is not one of the choices; choose one of v1, v2"),
        (["--tokenizer-model", path, "--tokenizer-special-tokens", *seven[:-1]],
         "--tokenizer-special-tokens: <sep> missing; the list must hold <unk> <s> </s> <mask> <pad> <cls> <sep>"),
        (["--tokenizer-model", path, "--tokenizer-special-tokens", *seven, "</s>"],
         "--tokenizer-special-tokens: </s> appears twice"),
        (["--tokenizer-model", path, "--tiktoken-num-special-tokens", "5"],
         "--tiktoken-num-special-tokens: 5 is fewer than the 7 --tokenizer-special-tokens; give at least 7"),
        (["--tokenizer-model", path, "--tiktoken-num-special-tokens", "2000"],
         f"--tiktoken-num-special-tokens: 2000 special tokens leave 0 ids below --vocab-size {1000 + size}, fewer "
         f"than the vocabulary's 256 single bytes; give --vocab-size 2256 or more"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv=base + ["--tokenizer-type", "TikTokenizer", "--vocab-size", str(1000 + size), *given])
        err = capsys.readouterr().err
        assert f"rapidgpt: error: {message}" in err and err.count("rapidgpt: error:") == 1, err
    with pytest.raises(SystemExit):
        parse_args(argv=base + ["--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--tokenizer-special-tokens",
                                *seven])
    assert ("rapidgpt: error: --tokenizer-special-tokens: only --tokenizer-type TikTokenizer reads it here; remove "
            "it") in capsys.readouterr().err


def test_tiktoken_is_imported_only_to_build_the_tokenizer(tiktoken_json, monkeypatch):
    """The flags are checked without importing tiktoken; without the library, the flag check and
    build_tokenizer say in one line how to install it."""
    from rapidgpt.arguments import build_parser, validate_args
    from rapidgpt.flag_parser import ArgumentError
    from rapidgpt.tokenizer.tiktoken_tokenizer import TikTokenError
    path, size = tiktoken_json
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", path, "--vocab-size", str(1000 + size),
             "--train-iters", "1"]
    monkeypatch.delitem(sys.modules, "tiktoken", raising=False)
    args = validate_args(build_parser().parse_args(flags))
    assert "tiktoken" not in sys.modules
    monkeypatch.setitem(sys.modules, "tiktoken", None)        # as if it were not installed
    message = "--tokenizer-type TikTokenizer needs the `tiktoken` library; pip install tiktoken (or rapidgpt[tiktoken])"
    with pytest.raises(ArgumentError) as error:
        validate_args(build_parser().parse_args(flags))
    assert error.value.problems == [f"--tokenizer-model: {message}"]
    with pytest.raises(TikTokenError) as error:
        build_tokenizer(args)
    assert str(error.value) == message


def test_a_tiktoken_checkpoint_generates_with_no_tokenizer_flags(tiktoken_json, tmp_path, capsys, demo_cache):
    """A run trained with TikTokenizer saves a checkpoint that carries the vocabulary and records the
    TikTokenizer flags: text generation from it needs none of them, after the original file is gone."""
    from rapidgpt.arguments import parse_args
    from rapidgpt.data.preprocess import main as preprocess
    from rapidgpt.tasks.pretraining import main as pretrain_main
    from rapidgpt.tasks.text_generation import main as generation_main
    from rapidgpt.training.checkpoint_files import find_checkpoint, read_metadata
    path, size = tiktoken_json
    vocabulary = tmp_path / "vocab.json"
    shutil.copy(path, vocabulary)
    special = ["<s>", "</s>", "<|im_start|>", "<unk>", "<mask>", "<cls>", "<pad>", "<sep>"]
    flags = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", str(vocabulary), "--tiktoken-pattern", "v1",
             "--tiktoken-num-special-tokens", "12", "--tokenizer-special-tokens", *special,
             "--vocab-size", str(12 + size)]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in TOPIC_TEXTS[:20]))
    assert preprocess(["--input", str(corpus), "--output-prefix", str(tmp_path / "tik"), *flags, "--append-eod",
                       "--no-progress-bar"]) == 0
    save = str(tmp_path / "ckpt")
    assert pretrain_main(["--task", "pretraining", "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads",
                          "2", "--seq-length", "16", "--micro-batch-size", "2", "--train-iters", "2", "--eval-iters",
                          "0", "--no-progress-bar", "--max-new-tokens", "0", "--data-path",
                          str(tmp_path / "tik_text_document"), "--save", save, *flags]) == 0
    os.remove(vocabulary)
    checkpoint = find_checkpoint(save)
    recorded = read_metadata(checkpoint)["model"]
    assert (recorded["tiktoken_pattern"], recorded["tiktoken_num_special_tokens"], recorded["special_tokens"],
            recorded["vocab_size"]) == ("v1", 12, special, 12 + size)
    assert recorded["tokenizer_model"] == os.path.join(checkpoint, "vocab.json")
    reloaded = build_tokenizer(parse_args(argv=["--task", "text_generation", "--load", save, "--prompt", "x"]))
    theirs = MegatronTikToken(path, special, 12, "v1", 12 + size)
    for text in TIKTOKEN_TEXTS:
        assert reloaded.tokenize(text) == theirs.text_to_ids(text), text
    capsys.readouterr()
    assert generation_main(["--load", save, "--prompt", "HelloWorld</s>", "--max-new-tokens", "3"]) == 0
    assert "continuation:" in capsys.readouterr().out
