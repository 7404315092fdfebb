"""Train a GPT-2 style byte-level BPE vocabulary (vocab.json + merges.txt).

Algorithm:

1. Count words: split every text with GPT-2's pre-tokenization pattern and count the
   distinct words. BPE never merges across word boundaries, so a corpus reduces to a
   (much smaller) table of distinct words with frequencies. Counting can be spread over
   worker processes; sums do not depend on the split, so neither does the result.
2. Each distinct word becomes a list of byte-symbol ids. Count every adjacent pair,
   weighted by word frequency, and remember which words contain each pair.
3. Repeatedly merge the most frequent pair (ties: the lexicographically smallest pair of
   token strings) into a new token. Only the words containing that pair are rewritten, and
   pair counts are updated incrementally from their old and new symbol sequences, so a
   merge costs time proportional to the words it touches, not to the corpus.

The max is found with a heap and lazy invalidation: a merge only ever *lowers* the count
of existing pairs and creates new pairs (those containing the new token), which are pushed
with their full count. A popped entry whose stored count is stale is therefore an
overestimate; it is pushed back with the current count and the next entry is tried.
"""
import json
import multiprocessing
import os
from collections import Counter, defaultdict
from heapq import heapify, heappop, heappush

from tqdm import tqdm

from rapidgpt.tokenizer.gpt2_bpe import GPT2_PATTERN, bytes_to_unicode
from rapidgpt.utils import bounded_imap

# Texts are sent to counting workers in batches of about this many characters: large
# enough to amortise pickling, small enough to keep memory flat.
_BATCH_CHARS = 1 << 20


def train_byte_level_bpe(texts, vocab_size, special_tokens=("<|endoftext|>",),
                         show_progress=False, workers=1):
    """Learn a byte-level BPE vocabulary from an iterable of strings.

    `vocab_size` counts everything: the 256 byte symbols, one token per merge and the
    special tokens. Ids are laid out as in GPT-2: bytes 0..255 (in `bytes_to_unicode`
    order), then merged tokens in merge order, then the special tokens. If the corpus runs
    out of pairs (every word is already one token) training stops early and the vocab is
    smaller than `vocab_size`.

    Returns (vocab: dict token -> id, merges: list of (left, right) token strings).
    """
    special_tokens = list(special_tokens)
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size={vocab_size} is too small: a byte-level BPE needs the "
                         f"256 byte symbols plus {len(special_tokens)} special token(s), "
                         f"i.e. at least {256 + len(special_tokens)}")
    byte_symbols = list(bytes_to_unicode().values())
    clashes = set(special_tokens) & set(byte_symbols)
    if len(set(special_tokens)) != len(special_tokens) or clashes:
        raise ValueError(f"special tokens must be distinct and not single byte symbols, "
                         f"got {special_tokens!r}")

    word_counts = count_words(texts, workers)
    tokens = byte_symbols  # id -> token string, grows by one per merge
    merges = _learn_merges(word_counts, vocab_size - 256 - len(special_tokens), tokens,
                           show_progress)

    vocab = {tok: i for i, tok in enumerate(tokens)}
    for tok in special_tokens:
        if tok in vocab:
            raise ValueError(f"special token {tok!r} was also learned as a regular token; "
                             f"choose a special token that cannot occur as a single word")
        vocab[tok] = len(vocab)
    return vocab, [(tokens[a], tokens[b]) for a, b in merges]


def count_words(texts, workers=1):
    """Counter of GPT-2 pre-tokenized words over all texts (optionally multi-process)."""
    if workers <= 1:
        counts = Counter()
        for text in texts:
            counts.update(GPT2_PATTERN.findall(text))
        return counts
    counts = Counter()
    with multiprocessing.Pool(workers) as pool:
        for batch_counts in bounded_imap(pool, _count_batch, _batches(texts), 2 * workers):
            counts.update(batch_counts)
    return counts


def _batches(texts):
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= _BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _count_batch(batch):
    return count_words(batch)


def _learn_merges(word_counts, num_merges, tokens, show_progress):
    """Run up to `num_merges` BPE merges; appends new tokens to `tokens`, returns id pairs."""
    # bytes.translate table: byte value -> its symbol id (its position in GPT-2's order).
    byte_to_id = bytes.maketrans(bytes(bytes_to_unicode()), bytes(range(256)))
    words = [list(w.encode("utf-8").translate(byte_to_id)) for w in word_counts]
    freqs = list(word_counts.values())

    pair_counts = defaultdict(int)
    pair_words = defaultdict(set)  # may keep stale word ids; rewriting those is a no-op
    for w, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freq
            pair_words[pair].add(w)
    # Entries: (-count, left string, right string, left id, right id), so the heap's
    # minimum is the highest count, ties broken by the smallest pair of strings.
    heap = [(-c, tokens[a], tokens[b], a, b) for (a, b), c in pair_counts.items()]
    heapify(heap)

    merges = []
    progress = tqdm(total=num_merges, desc="BPE merges", unit="merge", disable=not show_progress)
    while len(merges) < num_merges and heap:
        neg_count, left, right, a, b = heappop(heap)
        count = pair_counts.get((a, b), 0)
        if count != -neg_count:
            if count > 0:
                heappush(heap, (-count, left, right, a, b))
            continue
        new_id = len(tokens)
        tokens.append(left + right)
        merges.append((a, b))
        progress.update()

        created = set()
        for w in pair_words.pop((a, b)):
            old = words[w]
            new = _merge_pair(old, a, b, new_id)
            if len(new) == len(old):
                continue
            freq = freqs[w]
            # Pairs away from the merge sites are in both lists and cancel out; the ones
            # that disappear (including (a, b)) drop to their new count.
            for pair in zip(old, old[1:]):
                pair_counts[pair] -= freq
            for pair in zip(new, new[1:]):
                pair_counts[pair] += freq
                if new_id in pair:
                    pair_words[pair].add(w)
                    created.add(pair)
            words[w] = new
        del pair_counts[(a, b)]
        for pair in created:
            heappush(heap, (-pair_counts[pair], tokens[pair[0]], tokens[pair[1]], *pair))
    progress.close()
    return merges


def _merge_pair(word, a, b, new_id):
    """Replace each non-overlapping occurrence of (a, b) in `word`, left to right."""
    out = []
    i, n = 0, len(word)
    while i < n:
        if word[i] == a and i + 1 < n and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def save_gpt2_format(vocab, merges, output_dir):
    """Write vocab.json and merges.txt (with GPT-2's "#version: 0.2" header) to output_dir.

    Returns the two paths. The files load in GPT2BPETokenizer and in HF tokenizers'
    ByteLevelBPETokenizer.
    """
    os.makedirs(output_dir, exist_ok=True)
    vocab_path = os.path.join(output_dir, "vocab.json")
    merges_path = os.path.join(output_dir, "merges.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(merges_path, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.writelines(f"{left} {right}\n" for left, right in merges)
    return vocab_path, merges_path
