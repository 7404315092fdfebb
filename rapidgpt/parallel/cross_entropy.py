"""Cross entropy over vocabulary-parallel logits, without gathering the full logits.

Rank r holds logits `[N, V/tp]` for vocabulary ids `[r*V/tp, (r+1)*V/tp)`; labels `[N]` are
global ids. Per token:

    m      = max over ALL ranks' logits            (all-reduce MAX of the local maxima)
    sum_e  = sum over all ranks of sum exp(l - m)  (all-reduce SUM, [N])
    target = the label's logit - m, from the rank that holds it (all-reduce SUM of a masked pick)
    loss   = log(sum_e) - target

Backward (custom bprop, Megatron's): d loss / d l = softmax(l) - onehot(label) on each rank's
slice, scaled by the incoming gradient; no exchange beyond recomputing m and sum_e.
Columns at or past `vocab_size` (vocabulary padding) are masked out of the softmax.
"""
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from rapidgpt.parallel import comm
from rapidgpt.parallel.state import get_tensor_model_parallel_group

_MASKED = -1.0e30          # exp(_MASKED - m) == 0 exactly, and no inf - inf


class VocabParallelCrossEntropy(nn.Cell):
    """`(logits [N, V_local], labels [N]) -> per-token loss [N]` (fp32)."""

    def __init__(self, vocab_start, local_vocab, vocab_size, group=None):
        """This rank holds ids `[vocab_start, vocab_start + local_vocab)`; ids >= `vocab_size`
        are padding."""
        super().__init__()
        group = get_tensor_model_parallel_group() if group is None else group
        self.vocab_start = vocab_start
        self.padding = Tensor(np.arange(vocab_start, vocab_start + local_vocab) >= vocab_size)   # [V_local]
        self.all_reduce_max = comm.AllReduce(group, "max")
        self.all_reduce_sum = comm.AllReduce(group)

    def _shifted(self, logits):
        """Masked fp32 logits minus the global row maximum: `[N, V_local]`."""
        logits = ops.masked_fill(logits.astype(ms.float32), self.padding, _MASKED)
        return logits - self.all_reduce_max(logits.max(axis=-1, keepdims=True))

    def _local_labels(self, logits, labels):
        """Label positions in this rank's slice (0 where another rank holds them) and the mask."""
        local = labels - self.vocab_start
        mine = ops.logical_and(local >= 0, local < logits.shape[-1])
        return ops.where(mine, local, 0), mine

    def construct(self, logits, labels):
        shifted = self._shifted(logits)
        local, mine = self._local_labels(logits, labels)
        picked = ops.gather_elements(shifted, 1, local.reshape(-1, 1)).reshape(-1)
        target = self.all_reduce_sum(picked * mine.astype(ms.float32))
        sum_exp = self.all_reduce_sum(ops.exp(shifted).sum(axis=-1))
        return ops.log(sum_exp) - target

    def bprop(self, logits, labels, out, dout):
        shifted = self._shifted(logits)
        exp = ops.exp(shifted)
        softmax = exp / self.all_reduce_sum(exp.sum(axis=-1, keepdims=True))
        local, mine = self._local_labels(logits, labels)
        onehot = ops.one_hot(local, logits.shape[-1], ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        grad = (softmax - onehot * mine.astype(ms.float32).reshape(-1, 1)) * dout.reshape(-1, 1)
        return grad.astype(logits.dtype), ops.zeros_like(labels)
