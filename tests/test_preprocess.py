"""data_tools: preprocess_data (workers, bad lines, output), merge_datasets, inspect_dataset; demo corpus."""
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rapidgpt.data.demo_corpus import demo_corpus, demo_documents
from rapidgpt.data.indexed_dataset import IndexedDataset
from rapidgpt.data.preprocess import main as preprocess_main
from rapidgpt.tokenizer import GPT2BPETokenizer, save_gpt2_format, train_byte_level_bpe

TOOLS = Path(__file__).resolve().parents[1] / "data_tools"


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    vocab, merges = train_byte_level_bpe(demo_documents()[:20], 600)
    save_gpt2_format(vocab, merges, str(folder))
    return str(folder / "vocab.json"), str(folder / "merges.txt")


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    docs = demo_documents()
    with open(path, "w", encoding="utf-8") as f:
        for i, text in enumerate(docs * 3):
            f.write(json.dumps({"text": text, "title": f"doc {i}", "n": i}) + "\n")
        f.write(json.dumps({"text": "", "title": "empty"}) + "\n")             # empty document
        f.write(json.dumps({"text": ["First sentence.", "Second one."], "title": "list"}) + "\n")
    return str(path)


def run_preprocess(bpe, input_path, prefix, *extra):
    return preprocess_main(["--input", input_path, "--output-prefix", prefix,
                            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", bpe[0],
                            "--merge-file", bpe[1], "--no-progress-bar", *extra])


def test_one_and_two_workers_give_identical_files(bpe, jsonl, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    assert run_preprocess(bpe, jsonl, one, "--append-eod", "--workers", "1") == 0
    assert run_preprocess(bpe, jsonl, two, "--append-eod", "--workers", "2") == 0
    for ext in (".bin", ".idx"):
        assert Path(one + "_text_document" + ext).read_bytes() == Path(two + "_text_document" + ext).read_bytes()


def test_output_decodes_to_input_with_eod(bpe, jsonl, tmp_path):
    prefix = str(tmp_path / "out")
    assert run_preprocess(bpe, jsonl, prefix, "--append-eod", "--json-keys", "text", "title") == 0
    tok = GPT2BPETokenizer(*bpe)
    ds = IndexedDataset(prefix + "_text_document")
    titles = IndexedDataset(prefix + "_title_document")
    docs = demo_documents()
    n = len(docs) * 3
    assert ds.dtype == np.uint16 and len(ds.document_indices) - 1 == n + 2
    for d in (0, 5, n - 1):
        tokens = ds[d].tolist()
        assert tokens[-1] == tok.eod and tok.detokenize(tokens[:-1]) == docs[d % len(docs)]
        assert tok.detokenize(titles[d].tolist()[:-1]) == f"doc {d}"
    # The empty document has no sequence; a list of sentences makes one sequence each, EOD on the last.
    assert ds.document_indices[n + 1] - ds.document_indices[n] == 0
    last = [ds[int(i)].tolist() for i in range(ds.document_indices[n + 1], ds.document_indices[n + 2])]
    assert [tok.detokenize(s) for s in last] == ["First sentence.", "Second one.<|endoftext|>"]


BERT_VOCAB = Path(__file__).resolve().parent / "fixtures" / "hf_bert_tiny" / "vocab.txt"
SENTENCES = [["Dr. Smith went to Washington.", "He arrived at 5 p.m. on Monday.", "The economy grew!"],
             ["One sentence only"],
             ["Is it?", "Yes, e.g. in the sun it is.", "The dog sleeps."]]


def sentences_corpus(folder):
    """SENTENCES' documents, each as one text, 40 times: enough text for Punkt to learn the
    abbreviations."""
    src = folder / "corpus.jsonl"
    with open(src, "w") as f:
        for _ in range(40):
            for sentences in SENTENCES:
                f.write(json.dumps({"text": " ".join(sentences)}) + "\n")
    return src


@pytest.mark.parametrize("workers", ["1", "2"])
def test_split_sentences_gives_one_sequence_per_sentence(tmp_path, workers):
    """--split-sentences: Punkt learned from the corpus (no download) cuts each document into its
    sentences, abbreviations (Dr., p.m., e.g.) included in them; written as _text_sentence."""
    from rapidgpt.tokenizer import BertWordPieceTokenizer
    src = sentences_corpus(tmp_path)
    prefix = str(tmp_path / "bert")
    assert preprocess_main(["--input", str(src), "--output-prefix", prefix, "--tokenizer-type",
                            "BertWordPieceLowerCase", "--vocab-file", str(BERT_VOCAB), "--split-sentences",
                            "--workers", workers, "--no-progress-bar"]) == 0
    assert not os.path.exists(prefix + "_text_document.idx")
    ds = IndexedDataset(prefix + "_text_sentence")
    tok = BertWordPieceTokenizer(str(BERT_VOCAB), lower_case=True)
    assert len(ds.document_indices) - 1 == 40 * len(SENTENCES)
    for d, sentences in enumerate(SENTENCES * 2):
        got = [ds[int(i)].tolist() for i in range(ds.document_indices[d], ds.document_indices[d + 1])]
        assert got == [tok.tokenize(s) for s in sentences], d


def test_inspect_shows_every_sentence_of_a_document(bpe, tmp_path, capsys):
    """A --split-sentences corpus holds a document as one sequence per sentence: inspect_dataset's
    `document d:` shows all of them (up to --show-tokens tokens), not the first sentence only."""
    src = sentences_corpus(tmp_path)
    prefix = str(tmp_path / "gpt")
    assert run_preprocess(bpe, str(src), prefix, "--split-sentences") == 0
    inspect = runpy.run_path(str(TOOLS / "inspect_dataset.py"))["main"]
    tokenizer = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", bpe[0], "--merge-file", bpe[1]]
    assert inspect([prefix + "_text_sentence", *tokenizer, "--show-tokens", "200"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"document 0 (3 sequences): {' | '.join(map(repr, SENTENCES[0]))}" in out, out
    assert f"document 1: {SENTENCES[1][0]!r}" in out, out            # one sentence: as before
    assert inspect([prefix + "_text_sentence", *tokenizer, "--show-tokens", "3"]) == 0     # the first 3 tokens
    first = GPT2BPETokenizer(*bpe).tokenize(SENTENCES[0][0])[:3]
    assert f"document 0 (3 sequences): {GPT2BPETokenizer(*bpe).detokenize(first)!r}" in capsys.readouterr().out


def test_plain_text_input(bpe, tmp_path):
    src = tmp_path / "lines.txt"
    src.write_text("hello world\nsecond line here\n", encoding="utf-8")
    prefix = str(tmp_path / "txt")
    assert run_preprocess(bpe, str(src), prefix, "--input-format", "text") == 0
    tok = GPT2BPETokenizer(*bpe)
    ds = IndexedDataset(prefix + "_text_document")
    assert [tok.detokenize(ds[i].tolist()) for i in range(len(ds))] == ["hello world", "second line here"]


@pytest.mark.parametrize("line,message", [
    ('{"text": "ok"', "invalid JSON (Expecting ',' delimiter: column 14)"),
    ('{"text": "unclosed', "invalid JSON (Unterminated string starting at: column 10)"),
    ('{"body": "x"}', "no key 'text' (keys: body); set --json-keys"),
    ('["text"]', "expected a JSON object, got list"),
    ('{"text": 5}', "key 'text' must be a string or a list of strings"),
    ('', "empty line where a JSON object was expected"),
])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_bad_line_names_line_and_leaves_nothing(bpe, tmp_path, capsys, line, message, workers):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n{"text": "also fine"}\n' + line + "\n", encoding="utf-8")
    prefix = str(tmp_path / "bad")
    assert run_preprocess(bpe, str(src), prefix, "--workers", workers) == 1
    err = capsys.readouterr().err
    assert f"preprocess_data: error: {src}:3: {message}" in err
    assert os.listdir(tmp_path) == ["bad.jsonl"]           # no partial or temporary output


def test_bad_utf8_line(bpe, tmp_path, capsys):
    src = tmp_path / "bin.jsonl"
    src.write_bytes(b'{"text": "\xff\xfe"}\n')
    assert run_preprocess(bpe, str(src), str(tmp_path / "x")) == 1
    assert f"{src}:1: not valid UTF-8" in capsys.readouterr().err


def test_flag_errors(bpe, tmp_path, capsys):
    assert run_preprocess(bpe, str(tmp_path / "missing.jsonl"), str(tmp_path / "x")) == 1
    assert "--input" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        run_preprocess(bpe, "x", "y", "--split-sentences", "--punkt-train-bytes", "0")
    assert e.value.code == 2 and "--punkt-train-bytes must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_preprocess(bpe, "x", "y", "--dataset-impl", "lazy")
    assert preprocess_main(["--input", __file__, "--output-prefix", str(tmp_path / "z"),
                            "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", bpe[0]]) == 1
    assert "--merge-file is required" in capsys.readouterr().err


def test_command_line_scripts(bpe, jsonl, tmp_path):
    """The data_tools scripts run as users run them: preprocess twice, merge, inspect."""
    env = {**os.environ, "PYTHONPATH": ""}
    for part in ("p0", "p1"):
        subprocess.run([sys.executable, str(TOOLS / "preprocess_data.py"), "--input", jsonl,
                        "--output-prefix", str(tmp_path / part), "--tokenizer-type", "GPT2BPETokenizer",
                        "--vocab-file", bpe[0], "--merge-file", bpe[1], "--append-eod",
                        "--workers", "2", "--log-interval", "50"], check=True, env=env,
                       capture_output=True, text=True)
    merged = str(tmp_path / "merged")
    out = subprocess.run([sys.executable, str(TOOLS / "merge_datasets.py"), "--input",
                          str(tmp_path / "p0_text_document"), str(tmp_path / "p1_text_document"),
                          "--output-prefix", merged], check=True, env=env, capture_output=True, text=True)
    assert "merged 2 datasets" in out.stdout
    a, m = IndexedDataset(str(tmp_path / "p0_text_document")), IndexedDataset(merged)
    assert len(m) == 2 * len(a) and m.num_tokens == 2 * a.num_tokens
    assert m[len(a)].tolist() == a[0].tolist()
    out = subprocess.run([sys.executable, str(TOOLS / "inspect_dataset.py"), merged, "--tokenizer-type",
                          "GPT2BPETokenizer", "--vocab-file", bpe[0], "--merge-file", bpe[1]],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"documents    {2 * (len(a.document_indices) - 1)}" in out.stdout
    assert "consistency check: ok" in out.stdout
    first_words = demo_documents()[0][:10]
    assert repr(first_words)[:-1] in out.stdout


def test_inspect_reports_corruption(tmp_path, capsys):
    fixtures = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "megatron_mmap"
    prefix = tmp_path / "ds"
    (tmp_path / "ds.bin").write_bytes((fixtures / "uint16_text_document.bin").read_bytes())
    idx = bytearray((fixtures / "uint16_text_document.idx").read_bytes())
    idx[34 + 4 * 7 + 8 * 3] += 2                        # pointer of sequence 3 off by one token
    (tmp_path / "ds.idx").write_bytes(bytes(idx))
    inspect = runpy.run_path(str(TOOLS / "inspect_dataset.py"))["main"]
    assert inspect([str(prefix)]) == 1
    out = capsys.readouterr().out
    assert "PROBLEM: 1 sequence pointers do not follow from the lengths (first: sequence 3" in out
    assert "consistency check: FAILED" in out


def test_demo_corpus_built_once(tmp_path):
    paths = demo_corpus(vocab_size=400, cache_dir=str(tmp_path))
    ds = IndexedDataset(paths["data_prefix"])
    tok = GPT2BPETokenizer(paths["vocab_file"], paths["merge_file"])
    docs = demo_documents()
    assert len(ds) == len(docs) and tok.vocab_size == 400
    assert tok.detokenize(ds[0].tolist()) == docs[0] + "<|endoftext|>"
    stamp = os.path.getmtime(paths["data_prefix"] + ".bin")
    assert demo_corpus(vocab_size=400, cache_dir=str(tmp_path)) == paths
    assert os.path.getmtime(paths["data_prefix"] + ".bin") == stamp
    assert [p for p in os.listdir(tmp_path) if p.startswith(".demo-build")] == []


def _square(x):
    return x * x


def test_bounded_imap_keeps_order_and_reads_ahead_at_most_the_bound():
    """Streaming: the workers' input is pulled lazily, never the whole corpus at once."""
    import multiprocessing
    from rapidgpt.utils import bounded_imap
    pulled = []

    def items():
        for i in range(50):
            pulled.append(i)
            yield i

    with multiprocessing.Pool(2) as pool:
        results = []
        for value in bounded_imap(pool, _square, items(), max_in_flight=4):
            results.append(value)
            assert len(pulled) - len(results) <= 4
    assert results == [i * i for i in range(50)]
