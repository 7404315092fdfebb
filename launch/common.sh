# Shared by the launchers in this folder (sourced, not run): finds the repository, the `rapidgpt`
# program and its Python, and the embedded demo corpus used when no data is given.
#
#   RAPIDGPT   the rapidgpt program   (default: the repository's .venv, else `rapidgpt` on PATH)
#   PYTHON     the Python it runs on  (default: the python beside RAPIDGPT, else python3)

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ -z "${RAPIDGPT:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/rapidgpt" ]]; then
        RAPIDGPT="$REPO_ROOT/.venv/bin/rapidgpt"
    else
        RAPIDGPT="$(command -v rapidgpt || true)"
    fi
fi
if [[ -z "$RAPIDGPT" ]]; then
    echo "error: no rapidgpt program: run 'make install' in $REPO_ROOT or 'pip install -e $REPO_ROOT'" >&2
    exit 1
fi
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON="$(dirname "$RAPIDGPT")/python"
    [[ -x "$PYTHON" ]] || PYTHON=python3
fi

# demo_corpus_path KEY: a path of the embedded demo corpus (data_prefix, vocab_file, merge_file),
# built once into $RAPIDGPT_CACHE_DIR (default ~/.cache/rapidgpt) on first use.
demo_corpus_path() {
    "$PYTHON" -c "from rapidgpt.data.demo_corpus import demo_corpus; print(demo_corpus()['$1'])"
}

# demo_bert_corpus_path KEY: the same documents as BERT data (data_prefix ..._text_sentence,
# vocab_file vocab.txt), built once the same way.
demo_bert_corpus_path() {
    "$PYTHON" -c "from rapidgpt.data.demo_corpus import demo_bert_corpus; print(demo_bert_corpus()['$1'])"
}

# demo_hf_corpus_path KEY: the same documents tokenized by the demo vocabulary as a Hugging Face
# tokenizer folder (data_prefix, tokenizer_model the folder), built once the same way.
demo_hf_corpus_path() {
    "$PYTHON" -c "from rapidgpt.data.demo_corpus import demo_hf_corpus; print(demo_hf_corpus()['$1'])"
}

# The small model the example launchers train: 4 layers, hidden 256, 4 heads, 128 tokens, global
# batch 16 as two micro-batches of 8 (any flag given after a launcher's name overrides these).
SMALL_MODEL_ARGS=(
    --num-layers 4
    --hidden-size 256
    --num-attention-heads 4
    --seq-length 128
    --max-position-embeddings 128
    --micro-batch-size 8
    --global-batch-size 16
)

# TENSORBOARD_ARGS: --tensorboard-dir "$TENSORBOARD_DIR" when TENSORBOARD_DIR is set, else none.
TENSORBOARD_ARGS=()
if [[ -n "${TENSORBOARD_DIR:-}" ]]; then
    TENSORBOARD_ARGS=(--tensorboard-dir "$TENSORBOARD_DIR")
fi
