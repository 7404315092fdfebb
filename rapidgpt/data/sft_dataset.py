"""Instruction-finetuning samples: conversations -> packed rows with the loss on the answers only.

A conversation is rendered and tokenized by its chat template (rapidgpt/tokenizer/chat_template.py):
ids `t[0..n)` and which are answer tokens. It trains on `n - 1` positions: inputs `t[:-1]`,
labels `t[1:]`, loss mask = "the label is an answer token" (so the first answer token is
predicted from the last prompt token, and the end-of-turn token is learnt). Conversations longer
than `seq_length` positions are cut at the end (`too_long="truncate"`, counted; one left with no
answer token is dropped, counted, never a NaN) or refused (`"refuse"`, naming file and line).

Packing: the conversations of a split, in an order shuffled with the seed, fill rows of
`seq_length` positions one after the other (a conversation that does not fit opens the next row);
the rest of a row is padding (loss mask 0). Inside a row every conversation has its own position
ids (0, 1, ...) and attends only to itself, as Megatron's `--reset-position-ids
--reset-attention-mask` make a packed GPT sample, so each conversation's per-token losses are those
it has alone. `pack=False` puts one conversation per row.

`ds[i]` is a dict of numpy arrays: `tokens`, `labels`, `position_ids` int32 `[s]`, `loss_mask`
float32 `[s]`, `attention_mask` bool `[1, s, s]` (True = masked out, Megatron's convention). Row
order is shuffled with the seed, again for every epoch (`num_samples` may ask for several).

Encoded conversations are kept in a cache (`.npy` files named by a hash of the files, tokenizer,
template and settings; `--data-cache-path`, else `cache/` beside the first file): a large set is
tokenized once, by global rank 0 while the other ranks wait, and memory-mapped afterwards.
"""
import hashlib
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from rapidgpt.data.chat_data import ChatDataError, read_conversations
from rapidgpt.data.dataset_builder import rank_zero_builds
from rapidgpt.data.gpt_dataset import SPLIT_NAMES, split_boundaries
from rapidgpt.data.index_cache import cached_arrays
from rapidgpt.tokenizer import run_tokenizer_files
from rapidgpt.tokenizer.chat_template import ChatTemplate, encode_conversation

TOO_LONG_CHOICES = ("truncate", "refuse")
CACHE_FORMAT_VERSION = 1
# The counts an encoding keeps beside its arrays (logged by the task).
COUNTS = ("conversations", "skipped_lines", "truncated", "dropped")


@dataclass(frozen=True)
class SFTDataConfig:
    seq_length: int                   # positions per row (--seq-length)
    seed: int = 1234
    pad: int = 0                      # the id written into padding (never a target)
    too_long: str = "truncate"        # --sft-too-long
    bad_lines: str = "refuse"         # --sft-bad-lines
    pack: bool = True
    data_cache_path: Optional[str] = None


def _file_digest(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def encode_files(paths, template, tokenizer, config, flag="--data-path", warn=None):
    """Every conversation of the .jsonl `paths`, encoded and cut to `config.seq_length` positions:
    {"ids" [N] int32, "answer" [N] uint8 (both flat), "offsets" [C + 1] int64 (conversation c is
    ids[offsets[c]:offsets[c + 1]]), "counts" [4] int64 (COUNTS)}. `warn(text)` is told of the
    first skipped lines."""
    ids, answer, lengths = [], [], []
    counts = dict.fromkeys(COUNTS, 0)
    for path in paths:
        chat_file = read_conversations(path, config.bad_lines, flag)
        counts["skipped_lines"] += len(chat_file.skipped)
        if chat_file.skipped and warn is not None:
            more = len(chat_file.skipped) - 3
            warn(" --sft-bad-lines skip: left out " + "; ".join(chat_file.skipped[:3])
                 + (f"; and {more} more" if more > 0 else ""))
        for conversation in chat_file.conversations:
            counts["conversations"] += 1
            try:
                conversation_ids, conversation_answer = encode_conversation(template, tokenizer, conversation.messages)
            except ValueError as e:
                raise ChatDataError(f"{conversation.where}: {e}") from None
            if len(conversation_ids) - 1 > config.seq_length:
                if config.too_long == "refuse":
                    raise ChatDataError(
                        f"{conversation.where}: the conversation is {len(conversation_ids)} tokens, longer than "
                        f"--seq-length {config.seq_length} + 1; raise --seq-length, shorten it, or pass "
                        f"--sft-too-long truncate to cut such conversations")
                counts["truncated"] += 1
                conversation_ids = conversation_ids[:config.seq_length + 1]
                conversation_answer = conversation_answer[:config.seq_length + 1]
            if not conversation_answer[1:].any():        # no answer token left to learn: no NaN, no row
                counts["dropped"] += 1
                continue
            ids.append(conversation_ids)
            answer.append(conversation_answer)
            lengths.append(len(conversation_ids))
    if not lengths:
        raise ChatDataError(f"{flag} {' '.join(paths)}: no conversation with an answer within --seq-length "
                            f"{config.seq_length} ({counts['conversations']} read)")
    return {"ids": np.concatenate(ids).astype(np.int32), "answer": np.concatenate(answer).astype(np.uint8),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "counts": np.array([counts[k] for k in COUNTS], np.int64)}


def cached_encoding(paths, template, tokenizer, tokenizer_files, config, flag="--data-path",
                    build_on_this_rank=True, barrier=None, warn=None):
    """`encode_files(...)`, from the cache when an equal encoding was made before (module docstring);
    `tokenizer_files` (the files the tokenizer was read from) are part of the cache key."""
    description = {
        "class": "SFTEncoding", "format": CACHE_FORMAT_VERSION,
        "files": [[os.path.abspath(p), _file_digest(p)] for p in paths],
        "tokenizer": [type(tokenizer).__name__] + [_file_digest(p) for p in tokenizer_files],
        "template": template.source, "variables": template.variables,
        "seq_length": config.seq_length, "too_long": config.too_long, "bad_lines": config.bad_lines,
    }
    cache_dir = config.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(paths[0])), "cache")
    arrays, _, _ = cached_arrays(os.path.join(cache_dir, "SFTDataset"), "SFTEncoding", description,
                                 ("ids", "answer", "offsets", "counts"),
                                 lambda: encode_files(paths, template, tokenizer, config, flag, warn),
                                 build_on_this_rank, barrier)
    return arrays


def pack_rows(lengths, seq_length, pack=True):
    """Rows of conversations (indices into `lengths`, in order) holding at most `seq_length`
    positions (a conversation of n ids takes n - 1): [[c, ...], ...]."""
    rows, row, used = [], [], 0
    for c, n in enumerate(lengths):
        need = int(n) - 1
        if row and (not pack or used + need > seq_length):
            rows.append(row)
            row, used = [], 0
        row.append(c)
        used += need
    if row:
        rows.append(row)
    return rows


class SFTDataset:
    """The packed rows (module docstring) of the conversations `conversations` (indices into the
    encoding), `num_samples` of them (whole rows, repeated in a new order per epoch)."""

    def __init__(self, encoding, conversations, num_samples, config, split="train"):
        self.config, self.split = config, split
        self.ids, self.answer, self.offsets = encoding["ids"], encoding["answer"], encoding["offsets"]
        rng = np.random.RandomState(config.seed)
        order = np.asarray(conversations)[rng.permutation(len(conversations))]
        lengths = self.offsets[order + 1] - self.offsets[order]
        self.rows = [order[row] for row in pack_rows(lengths, config.seq_length, config.pack)]
        self.num_answer_tokens = int(sum(self.answer[self.offsets[c] + 1:self.offsets[c + 1]].sum() for c in order))
        epochs = max(1, -(-int(num_samples or len(self.rows)) // len(self.rows)))
        self.shuffle_index = np.concatenate([np.random.RandomState(config.seed + 1 + e).permutation(len(self.rows))
                                             for e in range(epochs)])
        self.num_samples = int(num_samples or len(self.rows))

    def __len__(self):
        return self.num_samples

    def __getitem__(self, idx):
        if not -len(self) <= idx < len(self):
            raise IndexError(f"sample {idx} out of range ({len(self)} samples)")
        s = self.config.seq_length
        tokens = np.full(s, self.config.pad, np.int32)
        labels = np.full(s, self.config.pad, np.int32)
        loss_mask = np.zeros(s, np.float32)
        position_ids = np.zeros(s, np.int32)
        attention_mask = np.ones((1, s, s), bool)
        start = 0
        for c in self.rows[int(self.shuffle_index[idx % len(self)])]:
            ids = self.ids[self.offsets[c]:self.offsets[c + 1]]
            end = start + len(ids) - 1
            tokens[start:end], labels[start:end] = ids[:-1], ids[1:]
            loss_mask[start:end] = self.answer[self.offsets[c] + 1:self.offsets[c + 1]]
            start = self._segment(position_ids, attention_mask, start, end)
        self._segment(position_ids, attention_mask, start, s)           # the padding: a segment of its own
        return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids,
                "attention_mask": attention_mask}

    @staticmethod
    def _segment(position_ids, attention_mask, start, end):
        """Positions start..end-1 are one sequence: positions from 0, causal attention among themselves."""
        n = end - start
        position_ids[start:end] = np.arange(n)
        attention_mask[0, start:end, start:end] = ~np.tril(np.ones((n, n), bool))
        return end


def _paths(value):
    return value.split() if isinstance(value, str) else list(value or [])


def build_sft_datasets(args, tokenizer, train_valid_test_num_samples, logger=None):
    """(train, valid, test) SFTDatasets from the data flags (None for a split with no data):
    --data-path FILE.jsonl... cut into train/valid/test conversation ranges by --split (as Megatron
    cuts documents), or --train-data-path / --valid-data-path / --test-data-path, each split whole;
    the run's chat template (ChatTemplate.of_run). With several ranks, global rank 0 encodes (or
    finds the cache) while the others wait."""
    template, tokenizer_files = ChatTemplate.of_run(args), run_tokenizer_files(args)
    build_on_this_rank, barrier = rank_zero_builds()
    config = SFTDataConfig(seq_length=args.seq_length, seed=args.seed, pad=tokenizer.eod,
                           too_long=args.sft_too_long, bad_lines=args.sft_bad_lines,
                           data_cache_path=args.data_cache_path)

    def encoding(paths, flag):
        return cached_encoding(paths, template, tokenizer, tokenizer_files, config, flag, build_on_this_rank, barrier,
                               logger.warning if logger is not None else None)

    if args.data_path:
        whole = encoding(_paths(args.data_path), "--data-path")
        bounds = split_boundaries(args.split, len(whole["offsets"]) - 1)
        parts = [(whole, np.arange(bounds[i], bounds[i + 1])) for i in range(3)]
        encodings = [whole]
    else:
        flags = ("--train-data-path", "--valid-data-path", "--test-data-path")
        values = (args.train_data_path, args.valid_data_path, args.test_data_path)
        encodings = [encoding(_paths(v), f) if v else None for v, f in zip(values, flags)]
        parts = [(e, np.arange(len(e["offsets"]) - 1)) if e is not None else (None, None) for e in encodings]
    datasets = [SFTDataset(e, conversations, n, config, split)
                if e is not None and len(conversations) and n else None
                for (e, conversations), n, split in zip(parts, train_valid_test_num_samples, SPLIT_NAMES)]
    if logger is not None:
        counts = dict(zip(COUNTS, sum(e["counts"] for e in encodings if e is not None).tolist()))
        sizes = "; ".join(f"{split} {sum(len(ds.rows[r]) for r in range(len(ds.rows)))} conversations in "
                          f"{len(ds.rows)} rows of {config.seq_length} positions ({ds.num_answer_tokens} answer tokens)"
                          for split, ds in zip(SPLIT_NAMES, datasets) if ds is not None)
        logger.info(f"> SFT data, template {template.name}: {sizes}; of {counts['conversations']} conversations "
                    f"{counts['truncated']} cut to --seq-length {config.seq_length}, {counts['dropped']} left out "
                    f"(no answer within it), {counts['skipped_lines']} bad lines skipped; the loss is the mean over "
                    f"each iteration's answer tokens")
    return tuple(datasets)
