"""--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR: a Hugging Face tokenizer folder,
as Megatron's HuggingFaceTokenizer reads it with transformers' AutoTokenizer, here through the
`tokenizers` library that AutoTokenizer's fast tokenizers run on: tokenizer.json (the model,
normalisation, pre-tokenisation, post-processing -- e.g. Llama 3's BOS -- and added tokens), the
end-of-document token from tokenizer_config.json's (or special_tokens_map.json's) `eos_token`.

`tokenize(text)` gives AutoTokenizer's `tokenizer(text).input_ids` (special tokens as the
post-processor adds them), `detokenize(ids)` its `decode(ids)`, `vocab_size` its `len(tokenizer)`
(added tokens included), `eod` its `eos_token_id` (tests/test_tokenizer.py holds them to
transformers' own results on a fixture folder). Checkpoints carry the folder's files
(rapidgpt/training/checkpoint_files.py), as they carry a GPT-2 vocabulary.
"""
import json
import os

from rapidgpt.errors import UserError

TOKENIZER_JSON = "tokenizer.json"
# The files of a folder that make the tokenizer (what checkpoints carry of it).
FOLDER_FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


class TokenizerError(UserError, ValueError):
    """A tokenizer folder that cannot be read; the message names it and what to do."""


def folder_problem(folder):
    """Why `folder` is not a Hugging Face tokenizer folder (None when it is)."""
    if not os.path.isdir(folder):
        return f"{folder}: no such directory"
    if not os.path.isfile(os.path.join(folder, TOKENIZER_JSON)):
        return (f"{folder} has no {TOKENIZER_JSON}; give a folder a fast tokenizer was saved to "
                f"(tokenizer.save_pretrained(DIR))")
    return None


def _special_token(folder, key):
    """tokenizer_config.json's (else special_tokens_map.json's) `key` token text, or None."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                value = json.load(f).get(key)
            if isinstance(value, dict):             # {"content": "<|end_of_text|>", ...}
                value = value.get("content")
            if value:
                return value
    return None


class HuggingFaceTokenizer:
    def __init__(self, folder):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError("--tokenizer-type HuggingFaceTokenizer needs the `tokenizers` library; "
                                 "pip install tokenizers") from None
        problem = folder_problem(folder)
        if problem:
            raise TokenizerError(f"--tokenizer-model: {problem}")
        self.folder = folder
        self._tokenizer = Tokenizer.from_file(os.path.join(folder, TOKENIZER_JSON))
        eos, bos = _special_token(folder, "eos_token"), _special_token(folder, "bos_token")
        self.eod = None if eos is None else self._tokenizer.token_to_id(eos)
        self.bos = None if bos is None else self._tokenizer.token_to_id(bos)      # None: the folder has none
        unk = _special_token(folder, "unk_token")
        self.unk = None if unk is None else self._tokenizer.token_to_id(unk)
        if self.eod is None:
            raise TokenizerError(f"--tokenizer-model {folder}: no eos_token in tokenizer_config.json (or "
                                 f"special_tokens_map.json) that the vocabulary holds; the end-of-document "
                                 f"token is needed to separate documents")

    @property
    def vocab_size(self):
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def tokenize(self, text):
        return self._tokenizer.encode(text).ids

    def detokenize(self, ids):
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token):
        """The id of the vocabulary entry `token`, None if there is none."""
        return self._tokenizer.token_to_id(token)

    def text_to_ids(self, text):
        """The ids of `text` with no special token added (no BOS from the folder's post-processor)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def ids_and_offsets(self, text):
        """`text_to_ids(text)` and each token's (start, end) character span in `text`."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        return encoding.ids, encoding.offsets
