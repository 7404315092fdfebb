"""Text generation from a GPT: greedy or top-k / temperature sampling, one token at a time.

Each new token re-runs the model on the whole (cropped) sequence; fine for the short
continuations the demo prints.
"""
import numpy as np
from mindspore import Tensor


def generate(model, tokenizer, prompt, max_new_tokens, top_k=0, temperature=1.0, seed=0):
    """Continuation of `prompt` (text). top_k=0: greedy; otherwise sample among the top k."""
    rng = np.random.default_rng(seed)
    ids = tokenizer.tokenize(prompt) or [tokenizer.eod]
    window = model.config.max_position_embeddings
    was_training = model.training
    model.set_train(False)
    try:
        new = []
        for _ in range(max_new_tokens):
            context = np.array(ids[-window:], np.int32)[None]
            positions = np.arange(context.shape[1], dtype=np.int32)[None]
            logits = model(Tensor(context), Tensor(positions)).asnumpy()[0, -1].astype(np.float64)
            if top_k:
                top = np.argpartition(-logits, top_k - 1)[:top_k]
                p = np.exp((logits[top] - logits[top].max()) / temperature)
                token = int(top[rng.choice(top_k, p=p / p.sum())])
            else:
                token = int(np.argmax(logits))
            if token == tokenizer.eod:
                break
            ids.append(token)
            new.append(token)
    finally:
        model.set_train(was_training)
    return tokenizer.detokenize(new)
