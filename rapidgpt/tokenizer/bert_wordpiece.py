"""BERT WordPiece tokenizer (vocab.txt) with Megatron's tokenizer interface.

Two stages, as in Google's BERT:

1. Basic tokenization: drop invalid and control characters, turn every whitespace
   character into a space, surround CJK ideographs with spaces (BERT's vocabularies hold
   them as single characters, Chinese has no spaces between words), split on whitespace,
   optionally lower-case and strip accents (NFD, then drop combining marks), and split
   off every punctuation character as its own token.
2. WordPiece: each token is split greedily into the longest vocabulary entries from the
   left; pieces after the first carry a "##" prefix. A token that cannot be fully covered,
   or is longer than 100 characters, becomes a single [UNK].
"""
import unicodedata

from rapidgpt.tokenizer.gpt2_bpe import read_tokenizer_file

MAX_WORD_CHARS = 100
SPECIAL_TOKENS = {"cls": "[CLS]", "sep": "[SEP]", "pad": "[PAD]", "mask": "[MASK]",
                  "unk": "[UNK]"}


def _is_control(ch):
    # Tab, newline and carriage return are whitespace for BERT, not control characters.
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_punctuation(ch):
    # BERT counts all non-alphanumeric ASCII (e.g. "$", "^", "`") as punctuation, even
    # those Unicode classes as symbols.
    cp = ord(ch)
    return (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
            or unicodedata.category(ch).startswith("P"))


def _is_cjk(cp):
    # The CJK Unified Ideographs blocks (BERT's definition; Hangul and kana are excluded
    # because those scripts use spaces or are tokenized as words).
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F
            or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _load_vocab(path):
    """token -> id, id = line number (0-based), tokens stripped of surrounding whitespace."""
    lines = read_tokenizer_file(path, "BERT vocab file").split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline ending the last line does not start another token
    if not lines:
        raise ValueError(f"BERT vocab file {path!r} is empty")
    return {line.strip(): i for i, line in enumerate(lines)}


class BertWordPieceTokenizer:
    """BERT WordPiece tokenizer; `lower_case` selects the uncased (True) or cased model."""

    def __init__(self, vocab_file, lower_case=True):
        self.lower_case = lower_case
        self._vocab = _load_vocab(vocab_file)
        self._inv_vocab = {i: tok for tok, i in self._vocab.items()}
        missing = [tok for tok in SPECIAL_TOKENS.values() if tok not in self._vocab]
        if missing:
            raise ValueError(f"BERT vocab file {vocab_file!r} lacks the special token(s) "
                             f"{', '.join(missing)}")
        self._special = {name: self._vocab[tok] for name, tok in SPECIAL_TOKENS.items()}

    @property
    def vocab_size(self):
        return len(self._vocab)

    @property
    def vocab(self):
        return self._vocab

    @property
    def inv_vocab(self):
        return self._inv_vocab

    @property
    def cls(self):
        return self._special["cls"]

    @property
    def sep(self):
        return self._special["sep"]

    @property
    def pad(self):
        return self._special["pad"]

    @property
    def mask(self):
        return self._special["mask"]

    @property
    def unk(self):
        return self._special["unk"]

    @property
    def eod(self):
        # Megatron ends BERT documents with [SEP].
        return self.sep

    def tokenize(self, text):
        ids = []
        for word in self.basic_tokenize(text):
            ids += self._wordpiece(word)
        return ids

    def detokenize(self, ids):
        """Join the tokens with spaces and glue each "##" piece to the token before it."""
        return " ".join(self._inv_vocab[i] for i in ids).replace(" ##", "")

    def basic_tokenize(self, text):
        """Split text into words and punctuation (stage 1 of the module docstring)."""
        chars = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_whitespace(ch):
                chars.append(" ")
            elif _is_cjk(cp):
                chars += (" ", ch, " ")
            else:
                chars.append(ch)
        words = []
        for word in "".join(chars).split():
            if self.lower_case:
                word = "".join(c for c in unicodedata.normalize("NFD", word.lower())
                               if unicodedata.category(c) != "Mn")
            words += _split_punctuation(word)
        return words

    def _wordpiece(self, word):
        """Greedy longest-match-first split of one word into vocabulary ids."""
        if len(word) > MAX_WORD_CHARS:
            return [self.unk]
        ids = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self._vocab:
                    ids.append(self._vocab[piece])
                    start = end
                    break
            else:
                return [self.unk]
        return ids


def _split_punctuation(word):
    """"don't!" -> ["don", "'", "t", "!"]: every punctuation character stands alone."""
    pieces = []
    current = ""
    for ch in word:
        if _is_punctuation(ch):
            if current:
                pieces.append(current)
            pieces.append(ch)
            current = ""
        else:
            current += ch
    if current:
        pieces.append(current)
    return pieces
