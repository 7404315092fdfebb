"""--tokenizer-type NullTokenizer --vocab-size N: Megatron's tokenizer for data that already is token
ids, written as text: "17 4 2051" is [17, 4, 2051] and back. The end-of-document id is
--null-tokenizer-eod-id, by default N - 1 (Megatron-LM's megatron/core/tokenizers NullTokenizer at
d98e8a6; tests/test_tokenizer.py holds this one to a port of it)."""
from rapidgpt.errors import UserError


EOD_HELP = "NullTokenizer's end-of-document id (default: --vocab-size - 1)"


class NullTokenizerError(UserError, ValueError):
    """Text that is not space-separated token ids, or an id outside the vocabulary."""


class NullTokenizer:
    def __init__(self, vocab_size, eod_id=None):
        self.vocab_size = int(vocab_size)
        self.eod = int(eod_id) if eod_id is not None else self.vocab_size - 1

    def tokenize(self, text):
        try:
            ids = [int(x) for x in text.split(" ")]
        except ValueError:
            raise NullTokenizerError(f"NullTokenizer reads token ids separated by single spaces, e.g. '17 4 2051'; "
                                     f"got {text[:40]!r}") from None
        outside = [i for i in ids if not 0 <= i < self.vocab_size]
        if outside:
            raise NullTokenizerError(f"NullTokenizer: token id {outside[0]} is outside --vocab-size "
                                     f"{self.vocab_size}")
        return ids

    def detokenize(self, ids):
        return " ".join(str(int(i)) for i in ids)
