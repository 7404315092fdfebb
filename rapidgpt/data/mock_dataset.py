"""--mock-data: Megatron's mock GPT corpus, for a run without data (the default branch of Megatron's
Llama 3 example is `--mock-data --tokenizer-type NullTokenizer --vocab-size N`).

As Megatron-core's MockGPTLowLevelDataset (d98e8a6): 100,000 documents whose lengths are drawn by
`numpy.random.default_rng(0).integers(1, 4096)`; a document of length n is the tokens 1, 2, ...,
n - 1 (modulo the tokenizer's vocabulary size) and then the tokenizer's end-of-document id. Megatron
cuts it "1,1,1" whatever --split says (its dataset config sets that split when no data blend is
given) and samples it as any GPTDataset; so does RapidGPT (rapidgpt/data/dataset_builder.py,
rapidgpt/data/gpt_dataset.py), so the batches are Megatron's.
"""
import numpy as np

MOCK_SPLIT = "1,1,1"


class MockCorpus:
    """The mock documents behind the interface GPTDataset reads of an IndexedDataset."""
    path_prefix = "mock-data"
    SEED, DOCUMENTS, MAX_LENGTH = 0, 100000, 4096

    def __init__(self, vocab_size, eod):
        self.vocab_size, self.eod = int(vocab_size), int(eod)
        self.sequence_lengths = np.random.default_rng(self.SEED).integers(
            1, self.MAX_LENGTH, self.DOCUMENTS, dtype=np.int32)
        self.num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))

    def __len__(self):
        return self.DOCUMENTS

    def get(self, idx, offset=0, length=None):
        """Tokens `offset .. offset + length - 1` of document `idx` (to its end without `length`), int64."""
        n = int(self.sequence_lengths[idx])
        document = np.append(np.arange(1, n, dtype=np.int64) % self.vocab_size, self.eod)
        return document[offset:n if length is None else offset + length]
