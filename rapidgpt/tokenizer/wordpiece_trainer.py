"""Make a BERT WordPiece vocabulary (vocab.txt) from a corpus.

The vocabulary is BERT's five special tokens, every character of the corpus alone and as a "##"
continuation (so any word made of those characters can be spelled), then the corpus's most
frequent words, as BERT's basic tokenization splits them, up to the requested size. It is read by
`BertWordPieceTokenizer` (`--tokenizer-type BertWordPieceLowerCase|BertWordPieceCase`) and by
Hugging Face's BERT tokenizers, which split text into the same ids with it.
"""
import os
from collections import Counter

from rapidgpt.tokenizer.bert_wordpiece import SPECIAL_TOKENS, BertWordPieceTokenizer

# vocab.txt's first lines, in the order of Google's BERT vocabularies: [PAD] is id 0.
SPECIAL_LINES = [SPECIAL_TOKENS[name] for name in ("pad", "unk", "cls", "sep", "mask")]


def wordpiece_vocabulary(texts, size, lower_case=True):
    """vocab.txt's lines for `texts` (an iterable of strings, read once): the special tokens,
    every character alone and as a "##" continuation, then the most frequent words up to `size`
    entries (more when the characters alone exceed it), ties in first-seen order. `lower_case`:
    lower-case and strip accents first, as BertWordPieceLowerCase does."""
    splitter = BertWordPieceTokenizer.__new__(BertWordPieceTokenizer)
    splitter.lower_case = lower_case                   # basic_tokenize reads only this
    words = Counter(w for text in texts for w in splitter.basic_tokenize(text))
    chars = sorted({c for w in words for c in w})
    lines = SPECIAL_LINES + chars + ["##" + c for c in chars]
    known = set(lines)
    for word, _ in words.most_common():
        if len(lines) >= size:
            break
        if word not in known:
            lines.append(word)
            known.add(word)
    return lines


def save_wordpiece_vocab(lines, output_dir):
    """Write `lines` as `output_dir/vocab.txt` (one token a line, id = line number); its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "vocab.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
