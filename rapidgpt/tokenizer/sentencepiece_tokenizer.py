"""--tokenizer-type GPTSentencePieceTokenizer / Llama2Tokenizer --tokenizer-model FILE: a
SentencePiece model file (Llama 2's and Mistral's tokenizer.model), read with the `sentencepiece`
library (an optional extra: pip install rapidgpt[sentencepiece]), with Megatron's meanings:

- GPTSentencePieceTokenizer: `tokenize(text)` is the model's ids of the text (no BOS);
- Llama2Tokenizer: the BOS id, then the model's ids (Llama 2's text-completion encoding);

both end documents with the model's EOS (`eod`), count the model's pieces as the vocabulary and
decode with the model. Text that spells a special token ("</s>") is encoded as text, as Megatron
does: transformers' LlamaTokenizer splits it out as the token instead, the one difference from it
(tests/test_tokenizer.py holds the ids to transformers' on a fixture model). Checkpoints carry the
model file (rapidgpt/training/checkpoint_files.py), as they carry a GPT-2 vocabulary.
"""
import os

from rapidgpt.errors import UserError

SENTENCEPIECE_TYPES = ("GPTSentencePieceTokenizer", "Llama2Tokenizer")
MISSING_LIBRARY = "needs the `sentencepiece` library; pip install sentencepiece (or rapidgpt[sentencepiece])"


class SentencePieceError(UserError, ValueError):
    """A model file that cannot be read, or no sentencepiece library; the message says what to do."""


def _library():
    """The sentencepiece module, or None when it is not installed."""
    try:
        import sentencepiece
    except ImportError:
        return None
    return sentencepiece


def model_file_problem(kind, path):
    """Why `path` cannot serve --tokenizer-type `kind` (None when it can): checked with the flags,
    before MindSpore is imported."""
    if not os.path.isfile(path):
        hint = " (a folder: give its tokenizer.model)" if os.path.isdir(path) else ""
        return f"{path}: no such file{hint}; give the SentencePiece model file"
    if _library() is None:
        return f"--tokenizer-type {kind} {MISSING_LIBRARY}"
    return None


class SentencePieceTokenizer:
    """Megatron's GPTSentencePieceTokenizer (`add_bos=False`) or Llama2Tokenizer (`add_bos=True`)."""

    def __init__(self, model_file, add_bos):
        sentencepiece = _library()
        if sentencepiece is None:
            raise SentencePieceError(f"--tokenizer-type {'Llama2Tokenizer' if add_bos else 'GPTSentencePieceTokenizer'} "
                                     f"{MISSING_LIBRARY}")
        try:
            self._model = sentencepiece.SentencePieceProcessor(model_file=model_file)
        except (OSError, RuntimeError) as e:
            raise SentencePieceError(f"--tokenizer-model {model_file}: not a SentencePiece model ({e})") from None
        self.add_bos = add_bos
        self.bos = self._model.bos_id()
        self.eod = self._model.eos_id()
        if self.eod < 0 or (add_bos and self.bos < 0):
            raise SentencePieceError(f"--tokenizer-model {model_file}: the model has no "
                                     f"{'EOS' if self.eod < 0 else 'BOS'} piece, which "
                                     f"{'ends documents' if self.eod < 0 else 'Llama2Tokenizer starts every text with'}")

    @property
    def vocab_size(self):
        return self._model.get_piece_size()

    def special_pieces(self):
        """{"bos_token", "eos_token", "unk_token": the piece} of the ids the model has (a Hugging Face
        tokenizer_config.json's special tokens)."""
        ids = {"bos_token": self.bos, "eos_token": self.eod, "unk_token": self._model.unk_id()}
        return {name: self._model.id_to_piece(i) for name, i in ids.items() if i >= 0}

    def tokenize(self, text):
        ids = self._model.encode(text)
        return [self.bos] + ids if self.add_bos else ids

    def detokenize(self, ids):
        return self._model.decode([int(i) for i in ids])
