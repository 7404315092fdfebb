"""Fill-in-the-middle samples (rapidgpt/data/fim.py, Megatron's --fim-data): against a port of
Megatron's GPTFIMDataset (d98e8a6) in this file, on the demo corpus's samples with a GPT-2
vocabulary that holds the FIM tokens; the pieces of a FIM sample put back together are the
original text; a sample is the same whatever order samples are read in; the flags' checks."""
import json
from argparse import Namespace

import numpy as np
import pytest

from rapidgpt.arguments import parse_args
from rapidgpt.data.dataset_builder import build_train_valid_test_datasets
from rapidgpt.data.demo_corpus import demo_corpus
from rapidgpt.data.fim import SPLIT_SEEDS, fim_config
from rapidgpt.data.gpt_dataset import GPTDatasetConfig
from rapidgpt.errors import UserError
from rapidgpt.tokenizer import GPT2BPETokenizer

FIM_TOKENS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]


class MegatronFIM:
    """Megatron's GPTFIMDataset (megatron/training/datasets/fim_dataset.py at d98e8a6) from the
    concatenated sample on, ported line by line: `_query_document_sample_shuffle_indices`' segment
    loop, `_fim_split_and_permute_sequence` and `_permute` (truncate_or_pad=False, as it calls it).
    Its tokenizer calls are `ids_to_text(ids, remove_special_tokens=True)` and `text_to_ids`."""

    def __init__(self, tokenizer, rate, spm_rate, split_sample=None, fragment_rate=None, no_prefix=None):
        self.tokenizer, self.fim_rate, self.fim_spm_rate = tokenizer, rate, spm_rate
        self.fim_split_sample, self.fragment_fim_rate, self.no_fim_prefix = split_sample, fragment_rate, no_prefix
        (self.prefix_tok_id, self.middle_tok_id, self.suffix_tok_id, self.pad_tok_id,
         self.eod_tok_id) = [tokenizer.vocab[t] for t in FIM_TOKENS + ["<|endoftext|>"]]
        self.special = {self.prefix_tok_id, self.middle_tok_id, self.suffix_tok_id, self.pad_tok_id, self.eod_tok_id}

    def ids_to_text(self, ids):
        return self.tokenizer.detokenize([i for i in ids if i not in self.special])

    def sample(self, sample, np_rng):
        self.np_rng = np_rng
        sample_len = sample.shape[0]
        segment_breaks = np.argwhere(sample == self.eod_tok_id)
        if segment_breaks.shape != (0, 1):
            curr_start_position = 0
            new_samples = []
            for loc in np.nditer(segment_breaks):
                if loc - curr_start_position > 0:
                    permuted = self._fim_split_and_permute_sequence(sample[curr_start_position:loc])
                    new_samples += [permuted, [self.eod_tok_id]]
                curr_start_position = loc + 1
            permuted = self._fim_split_and_permute_sequence(sample[curr_start_position:])
            new_samples.append(permuted)
            sample = np.concatenate(new_samples)
        else:
            sample = self._fim_split_and_permute_sequence(sample)
        diff = sample.shape[0] - sample_len
        if diff > 0:
            sample = sample[:sample_len]
        elif diff < 0:
            sample = np.concatenate([sample, np.full((-1 * diff), self.pad_tok_id)])
        return np.array(sample, dtype=np.int64)

    def _fim_split_and_permute_sequence(self, sequence):
        if self.fim_split_sample is None:
            return self._permute(sequence, self.fim_rate)
        fragment_breaks = np.argwhere(sequence == self.fim_split_sample)
        if fragment_breaks.shape == (0, 1):
            return self._permute(sequence, self.fim_rate)
        if not self.np_rng.binomial(1, self.fim_rate):
            return sequence
        curr_start_position = 0
        new_samples = []
        for loc in np.nditer(fragment_breaks):
            if loc - curr_start_position > 0:
                permuted = self._permute(sequence[curr_start_position:loc], self.fragment_fim_rate)
                new_samples += [permuted, [self.fim_split_sample]]
            curr_start_position = loc + 1
        permuted = self._permute(sequence[curr_start_position:], self.fragment_fim_rate)
        new_samples.append(permuted)
        return np.concatenate(new_samples)

    def _permute(self, sample, fim_rate):
        if self.np_rng.binomial(1, fim_rate):
            contents = self.ids_to_text(sample)
            if self.no_fim_prefix is not None and contents.startswith(self.no_fim_prefix):
                return sample
            boundaries = list(self.np_rng.randint(low=0, high=len(contents) + 1, size=2))
            boundaries.sort()
            prefix = contents[: boundaries[0]]
            middle = contents[boundaries[0] : boundaries[1]]
            suffix = contents[boundaries[1] :]
            prefix = np.array([*self.tokenizer.tokenize(prefix)], dtype=np.int64)
            middle = np.array([*self.tokenizer.tokenize(middle)], dtype=np.int64)
            suffix = np.array([*self.tokenizer.tokenize(suffix)], dtype=np.int64)
            if self.np_rng.binomial(1, self.fim_spm_rate):
                new_sample = np.concatenate([[self.prefix_tok_id, self.suffix_tok_id], suffix, [self.middle_tok_id],
                                             prefix, middle])
            else:
                new_sample = np.concatenate([[self.prefix_tok_id], prefix, [self.suffix_tok_id], suffix,
                                             [self.middle_tok_id], middle])
        else:
            new_sample = sample
        return new_sample


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The demo corpus, with a copy of its GPT-2 vocabulary that also holds the FIM tokens."""
    folder = tmp_path_factory.mktemp("fim")
    demo = demo_corpus(cache_dir=str(folder / "cache"))
    vocab = json.loads(open(demo["vocab_file"]).read())
    vocab.update({token: len(vocab) + k for k, token in enumerate(FIM_TOKENS)})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return dict(demo, vocab_file=str(folder / "vocab.json"), folder=folder)


def fim_args(corpus, *flags):
    return parse_args(argv=["--task", "pretraining", "--train-iters", "4", "--data-path", corpus["data_prefix"], "--vocab-file", corpus["vocab_file"],
                       "--merge-file", corpus["merge_file"], "--tokenizer-type", "GPT2BPETokenizer", "--fim-data", *flags])


def datasets(corpus, args, tokenizer, warn=print):
    config = GPTDatasetConfig(seq_length=64, seed=args.seed, eod=tokenizer.eod,
                              data_cache_path=str(corpus["folder"] / "index"), fim=fim_config(args, tokenizer, warn))
    return build_train_valid_test_datasets(config, [200, 20, 0], data_path=[corpus["data_prefix"]], split="90,10,0",
                                           build_on_this_rank=True)


@pytest.mark.parametrize("flags", [[], ["--fim-rate", "0.9", "--fim-spm-rate", "0.2"],
                                   ["--fim-split-sample", "\u010a", "--fim-fragment-rate", "0.7", "--fim-rate", "0.8"],
                                   ["--fim-no-prefix", "The", "--fim-rate", "1"]],
                         ids=["defaults", "rates", "split-sample", "no-prefix"])
def test_samples_are_megatrons(corpus, flags):
    """Every sample of the train and valid splits equals Megatron's GPTFIMDataset's for the same
    draws (a generator seeded with --seed, the split and the sample's index: see fim.py); and
    FIM happened (the samples differ from the plain ones)."""
    args = fim_args(corpus, *flags)
    tokenizer = GPT2BPETokenizer(corpus["vocab_file"], corpus["merge_file"])
    split_id = None if args.fim_split_sample is None else tokenizer.vocab[args.fim_split_sample]
    megatron = MegatronFIM(tokenizer, args.fim_rate, args.fim_spm_rate, split_id, args.fim_fragment_rate,
                           args.fim_no_prefix)
    plain = datasets(corpus, parse_args(argv=["--task", "pretraining", "--train-iters", "4"]), tokenizer)
    changed = 0
    for split, fim_ds, plain_ds in zip(("train", "valid"), datasets(corpus, args, tokenizer), plain):
        for i in range(len(fim_ds)):
            rng = np.random.RandomState([args.seed, SPLIT_SEEDS[split], i])
            sample = plain_ds.sample_tokens(i)
            expected = megatron.sample(sample.astype(np.int64), rng)
            got = fim_ds[i]
            np.testing.assert_array_equal(got["tokens"], expected[:-1], err_msg=f"{split} sample {i}")
            np.testing.assert_array_equal(got["labels"], expected[1:], err_msg=f"{split} sample {i}")
            changed += not np.array_equal(expected, sample)
    assert changed > 20, changed


def test_the_pieces_are_the_text_and_the_order_is_psm_or_spm(corpus):
    """A segment given FIM is its own text in pieces: PSM (<pre> p <suf> s <mid> m) or SPM
    (<pre> <suf> s <mid> p m), both seen; the pieces decoded and put back in order are the text."""
    args = fim_args(corpus, "--fim-rate", "1")
    tokenizer = GPT2BPETokenizer(corpus["vocab_file"], corpus["merge_file"])
    pre, mid, suf = (tokenizer.vocab[t] for t in FIM_TOKENS[:3])
    config = fim_config(args, tokenizer, print)
    text = "def add(a, b):\n    return a + b\n\n# the sum of two numbers, in Python\n"
    ids = np.array(tokenizer.tokenize(text), dtype=np.int64)
    orders = set()
    for seed in range(40):
        out = config._permute(ids, 1.0, np.random.RandomState(seed)).tolist()
        assert out[0] == pre and out.count(pre) == out.count(suf) == out.count(mid) == 1
        at_suf, at_mid = out.index(suf), out.index(mid)
        if at_suf == 1:                                                 # SPM: the prefix and middle last
            orders.add("spm")
            rebuilt = tokenizer.detokenize(out[at_mid + 1:]) + tokenizer.detokenize(out[2:at_mid])
        else:
            orders.add("psm")
            rebuilt = "".join(tokenizer.detokenize(out[a:b]) for a, b in
                              ((1, at_suf), (at_mid + 1, len(out)), (at_suf + 1, at_mid)))
        assert rebuilt == text, seed
    assert orders == {"psm", "spm"}


def test_a_sample_does_not_depend_on_the_order_samples_are_read_in(corpus):
    """Megatron draws from one generator in reading order (so DP size, loader workers and a resume
    change its samples); here sample i is the same read first, last or twice."""
    args = fim_args(corpus)
    tokenizer = GPT2BPETokenizer(corpus["vocab_file"], corpus["merge_file"])
    train = datasets(corpus, args, tokenizer)[0]
    forward = [train[i]["tokens"] for i in range(30)]
    backward = [train[i]["tokens"] for i in reversed(range(30))][::-1]
    for a, b in zip(forward, backward):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(train[7]["tokens"], forward[7])


def test_tokens_the_vocabulary_lacks_are_its_unknown_token_with_a_warning(corpus):
    """The demo vocabulary has no FIM tokens: as Megatron's GPT-2 tokenizer (transformers'), each
    is <|endoftext|>, its unknown token, and one warning says so."""
    demo = demo_corpus(cache_dir=str(corpus["folder"] / "cache"))
    tokenizer = GPT2BPETokenizer(demo["vocab_file"], demo["merge_file"])
    warnings = []
    config = fim_config(parse_args(argv=["--task", "pretraining", "--train-iters", "4", "--fim-data"]), tokenizer, warnings.append)
    assert config.prefix == config.middle == config.suffix == config.pad == config.eod == tokenizer.eod
    assert warnings == [f"WARNING: --fim-prefix-token '<fim_prefix>', --fim-middle-token '<fim_middle>', --fim-suffix-token "
                        f"'<fim_suffix>', --fim-pad-token '<fim_pad>': not in the vocabulary, so each is its unknown "
                        f"token (id {tokenizer.eod}), as Megatron's tokenizer maps them; a vocabulary with the FIM "
                        f"tokens keeps prefix, middle and suffix apart"]


def test_a_tokenizer_without_named_tokens_is_refused(corpus):
    args = Namespace(fim_data=True, tokenizer_type="NullTokenizer")
    with pytest.raises(UserError, match="--fim-data: FIM re-tokenizes text"):
        fim_config(args, object(), print)
    args = fim_args(corpus, "--fim-split-sample", "no such token", "--fim-fragment-rate", "0.5")
    tokenizer = GPT2BPETokenizer(corpus["vocab_file"], corpus["merge_file"])
    with pytest.raises(UserError, match="--fim-split-sample 'no such token': not one token"):
        fim_config(args, tokenizer, print)


@pytest.mark.parametrize("flags, message", [
    (["--fim-rate", "0.3"], "--fim-rate: takes effect with --fim-data only"),
    (["--fim-data", "--fim-rate", "1.5"], "--fim-rate: 1.5 is not a probability"),
    (["--fim-data", "--fim-split-sample", "x"], "--fim-split-sample: give it together with --fim-fragment-rate"),
    (["--fim-data", "--mock-data"], "--fim-data: Megatron's --mock-data documents take the place"),
])
def test_flag_mistakes_are_one_line(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_args(argv=["--task", "pretraining", "--train-iters", "4", *flags])
    err = capsys.readouterr().err
    assert f"rapidgpt: error: {message}" in err, err
