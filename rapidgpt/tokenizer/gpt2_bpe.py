"""GPT-2 byte-level BPE tokenizer with Megatron's tokenizer interface.

Encoding runs in three steps, exactly as GPT-2's original encoder:

1. Pre-tokenization: ``GPT2_PATTERN`` splits text into words (letter runs, digit runs,
   punctuation runs and whitespace, each optionally with one leading space, plus English
   contractions). BPE merges never cross these boundaries.
2. Byte mapping: each word's UTF-8 bytes become printable characters via
   ``bytes_to_unicode()``, so any input (any script, emoji, control bytes) is
   representable with a 256-symbol base alphabet and there is never an unknown token.
3. BPE: adjacent symbols are merged repeatedly, always the pair ranked lowest in
   merges.txt, until no ranked pair is left; the resulting symbols are looked up in vocab.json.

Words repeat heavily in real corpora, so every distinct word is encoded once and cached.
"""
import json
from functools import lru_cache
from heapq import heapify, heappop, heappush

import regex

# GPT-2's pre-tokenization pattern, verbatim; compiled once at import.
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

EOD_TOKEN = "<|endoftext|>"


@lru_cache(maxsize=None)
def bytes_to_unicode():
    """Return GPT-2's byte -> printable-character map, as a dict in GPT-2's byte order.

    Bytes that are already printable, non-space Latin-1 characters map to themselves; the
    remaining 68 bytes (controls, space, DEL, NBSP, soft hyphen...) map to chr(256 + n) in
    byte order. This keeps vocab.json and merges.txt free of whitespace and control
    characters, so merges.txt can be space-separated. The dict's iteration order (the
    printable bytes first) is the order GPT-2 assigns ids 0..255 to byte symbols.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    mapping = {b: chr(b) for b in printable}
    mapping.update((b, chr(256 + n)) for n, b in enumerate(others))
    return mapping


def read_tokenizer_file(path, what):
    """Return the UTF-8 text of a tokenizer file, with errors that name `what` and `path`.

    Shared by all tokenizers so that a wrong --vocab-file/--merge-file reads as one clear
    message instead of a bare OSError or UnicodeDecodeError.
    """
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found: {path!r}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {what} {path!r}: {e}") from None


def _load_vocab(path):
    text = read_tokenizer_file(path, "GPT-2 vocab file")
    try:
        vocab = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"GPT-2 vocab file {path!r} is not valid JSON: {e}") from None
    if not isinstance(vocab, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
        raise ValueError(f"GPT-2 vocab file {path!r} must be a JSON object mapping "
                         f"token strings to integer ids")
    missing = [s for s in bytes_to_unicode().values() if s not in vocab]
    if missing:
        raise ValueError(f"GPT-2 vocab file {path!r} lacks {len(missing)} of the 256 byte "
                         f"symbols (e.g. {missing[0]!r}); it is not a byte-level BPE vocab")
    return vocab


def _load_merges(path, vocab):
    """Return {(left, right): rank}, rank = order in the file (the "#version" header skipped)."""
    lines = read_tokenizer_file(path, "GPT-2 merges file").split("\n")
    ranks = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or (lineno == 1 and line.startswith("#version")):
            continue
        # Byte-mapped symbols never contain whitespace, so a plain split is unambiguous.
        pair = tuple(line.split())
        if len(pair) != 2:
            raise ValueError(f"GPT-2 merges file {path!r}, line {lineno}: expected two "
                             f"space-separated symbols, got {line!r}")
        if pair[0] + pair[1] not in vocab:
            raise ValueError(f"GPT-2 merges file {path!r}, line {lineno}: merge result "
                             f"{pair[0] + pair[1]!r} is not in the vocab file; the two files "
                             f"do not belong together")
        ranks.setdefault(pair, len(ranks))
    return ranks


class GPT2BPETokenizer:
    """GPT-2 byte-level BPE (vocab.json + merges.txt) with Megatron's tokenizer interface.

    Like GPT-2 and Megatron, `tokenize` treats "<|endoftext|>" in the text as ordinary
    characters; documents are separated by appending `eod` ids, not by writing the string.
    """

    def __init__(self, vocab_file, merge_file):
        self.encoder = _load_vocab(vocab_file)
        self.decoder = {i: tok for tok, i in self.encoder.items()}
        self.bpe_ranks = _load_merges(merge_file, self.encoder)
        if EOD_TOKEN not in self.encoder:
            raise ValueError(f"GPT-2 vocab file {vocab_file!r} has no {EOD_TOKEN!r} token, "
                             f"which is needed as the end-of-document id")
        # str.translate table from Latin-1 code points (= byte values) to GPT-2 symbols.
        self._byte_table = {b: ch for b, ch in bytes_to_unicode().items()}
        symbol_to_byte = {ch: b for b, ch in bytes_to_unicode().items()}
        # Each id's raw bytes, so detokenize is a dict lookup + join. Tokens outside the
        # byte alphabet (added special tokens) are kept as their own UTF-8.
        self._id_bytes = {
            i: (bytes(symbol_to_byte[c] for c in tok)
                if all(c in symbol_to_byte for c in tok) else tok.encode("utf-8"))
            for i, tok in self.decoder.items()}
        self._cache = {}

    @property
    def vocab_size(self):
        return len(self.encoder)

    @property
    def vocab(self):
        return self.encoder

    @property
    def inv_vocab(self):
        return self.decoder

    @property
    def eod(self):
        return self.encoder[EOD_TOKEN]

    eod_id = eod

    @property
    def pad(self):
        # Megatron's GPT-2 tokenizer has no pad token and pads with the eod id.
        return self.eod

    @property
    def unk(self):
        # What an unknown token name stands for: transformers' GPT2Tokenizer (Megatron's
        # GPT2BPETokenizer) has <|endoftext|> as its unknown token.
        return self.eod

    def token_to_id(self, token):
        """The id of the vocabulary entry `token`, None if there is none."""
        return self.encoder.get(token)

    def text_to_ids(self, text):
        """The ids of `text` with no special token added: `tokenize`."""
        return self.tokenize(text)

    def ids_and_offsets(self, text):
        """`text_to_ids(text)` and each token's (start, end) character span in `text` (a token
        holding part of a character's UTF-8 bytes spans that whole character)."""
        ids = self.tokenize(text)
        char_of_byte = [i for i, c in enumerate(text) for _ in c.encode("utf-8")] + [len(text)]
        offsets, byte = [], 0
        for i in ids:
            end = byte + len(self._id_bytes[i])
            offsets.append((char_of_byte[byte], char_of_byte[end - 1] + 1))
            byte = end
        return ids, offsets

    def tokenize(self, text):
        """Return the token ids of `text`: pre-tokenize, then per-word BPE (cached)."""
        ids = []
        cache = self._cache
        for word in GPT2_PATTERN.findall(text):
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = cache[word] = self._encode_word(word)
            ids += word_ids
        return ids

    def detokenize(self, ids):
        """Concatenate the tokens' bytes and decode as UTF-8, invalid sequences -> U+FFFD."""
        return b"".join(self._id_bytes[i] for i in ids).decode("utf-8", errors="replace")

    def _encode_word(self, word):
        # Latin-1 decoding turns each byte into the code point of the same value.
        symbols = word.encode("utf-8").decode("latin-1").translate(self._byte_table)
        return [self.encoder[s] for s in self._bpe(symbols)]

    def _bpe(self, symbols):
        """Apply the merges to one byte-mapped word; returns the list of final symbols.

        Same result as GPT-2's loop (merge every occurrence of the lowest-ranked adjacent
        pair, left to right, repeat), but with a heap of (rank, position) entries over a
        linked list of symbols: O(n log n) rather than O(n^2) per word, which matters for
        long runs such as thousands of spaces or dashes. Ranks are unique per pair, so an
        entry is current exactly when the pair now at its position still has its rank;
        stale entries are skipped when popped. (The equivalence needs each merge's two
        parts to exist before it in merges.txt, which holds for every trained merge list.)
        """
        ranks = self.bpe_ranks
        parts = list(symbols)
        n = len(parts)
        if n < 2:
            return parts
        nxt = [*range(1, n), -1]
        prev = list(range(-1, n - 1))
        heap = [(ranks[p], i) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        heapify(heap)
        while heap:
            rank, i = heappop(heap)
            j = nxt[i]
            if parts[i] is None or j < 0 or ranks.get((parts[i], parts[j])) != rank:
                continue
            parts[i] += parts[j]
            parts[j] = None
            k = nxt[i] = nxt[j]
            if k >= 0:
                prev[k] = i
                new_rank = ranks.get((parts[i], parts[k]))
                if new_rank is not None:
                    heappush(heap, (new_rank, i))
            h = prev[i]
            if h >= 0:
                new_rank = ranks.get((parts[h], parts[i]))
                if new_rank is not None:
                    heappush(heap, (new_rank, h))
        return [p for p in parts if p is not None]
