"""Knowledge distillation (Megatron-LM's ModelOpt distillation, rapidgpt/config/distillation.py):
a GPT student trained against a frozen GPT teacher.

`DistillationModel(tokens [b, s], position_ids, attention_mask, labels)` runs both models on the
batch and returns per-token losses, each `[b, s]` fp32:
    (student's cross-entropy (zeros when training with skip_lm_loss, as ModelOpt's student
     skips it), logits KL divergence, (one per intermediate pair, ...))
and `distillation_loss_func` masks and combines them as ModelOpt's LogitsAndIntermediatesLossBalancer.

Logits KL under tensor parallelism, with the vocabulary split over ranks (each holds `[N, V/tp]`):
for student logits s and teacher logits t, both divided by the temperature,

    KL(p_t || p_s) = sum_v p_t (log p_t - s) + logsumexp(s)            (sum_v p_t = 1)

The first sum is the all-reduce of each rank's part; logsumexp(s) = m + log(all-reduce of the
ranks' sum exp(s - m)), m the all-reduced row maximum. Both all-reduces have identity backwards
(ReduceFromTensorParallelRegion): the KL is then the same on every rank, so each rank's gradient
of its slice is softmax(s) - p_t, the exact one, with no exchange in the backward. (ModelOpt
all-reduces the softmax denominators in the backward instead, as its per-rank sums take them
inside the log.) Columns of
vocabulary padding are out of both softmaxes.

The student keeps its parameter names (the wrapper adds no prefix), so its checkpoints are a plain
GPT's; the teacher's parameters are named `kd_teacher.<name>`, frozen, never checkpointed.
"""
from functools import partial

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

from rapidgpt.config.distillation import parse_layer
from rapidgpt.config.transformer import TransformerConfig
from rapidgpt.errors import UserError
from rapidgpt.models.gpt import GPTModel
from rapidgpt.parallel import comm
from rapidgpt.parallel.cross_entropy import _MASKED
from rapidgpt.parallel.mappings import GatherFromSequenceParallelRegion, ReduceFromTensorParallelRegion
from rapidgpt.parallel.state import (get_tensor_model_parallel_group, get_tensor_model_parallel_rank,
                                     get_tensor_model_parallel_world_size)

TEACHER_PREFIX = "kd_teacher."
_COSINE_EPS = 1e-12            # torch's cosine_embedding_loss's, which ModelOpt's cosine loss calls


class LogitsKLLoss(nn.Cell):
    """`(student, teacher)` logits `[N, padded / tp]` fp32 -> KL(teacher || student) per token `[N]`
    at temperature `temperature` (module docstring)."""

    def __init__(self, vocab_size, padded_vocab_size, temperature=1.0):
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        rows = padded_vocab_size // tp
        start = get_tensor_model_parallel_rank() * rows
        self.padding = Tensor(np.arange(start, start + rows) >= vocab_size)            # [V_local]
        self.temperature = temperature
        group = get_tensor_model_parallel_group()
        self.all_reduce_max = comm.AllReduce(group, "max")
        self.sum_teacher_exps = comm.AllReduce(group)
        # One boundary cell per call (MindSpore 2.10 mixes up the backwards of one custom-bprop cell
        # called twice in a graph, see rapidgpt/parallel/cross_entropy.py).
        self.sum_student_exps = ReduceFromTensorParallelRegion(group)
        self.sum_cross = ReduceFromTensorParallelRegion(group)

    def shifted(self, logits):
        """logits / temperature minus their row maximum over all ranks (held constant), padding masked."""
        x = ops.masked_fill(logits / self.temperature, self.padding, _MASKED)
        return x - ops.stop_gradient(self.all_reduce_max(x.max(axis=-1, keepdims=True)))

    def construct(self, student, teacher):
        t = ops.stop_gradient(self.shifted(teacher))
        log_p_t = ops.stop_gradient(t - ops.log(self.sum_teacher_exps(ops.exp(t).sum(axis=-1, keepdims=True))))
        s = self.shifted(student)
        log_z = ops.log(self.sum_student_exps(ops.exp(s).sum(axis=-1, keepdims=True)))     # [N, 1]
        # Summed as p_t (log p_t - log p_s), ModelOpt's terms, not as the two large sums of the
        # docstring, whose difference loses digits in fp32; log_z's gradient is added apart.
        held = ops.stop_gradient(log_z)
        kl = self.sum_cross((ops.exp(log_p_t) * (log_p_t - (s - held))).sum(axis=-1))        # [N]
        return kl + (log_z - held).reshape(-1)


def cosine_loss(student, teacher):
    """`[b, s, h]` twice -> 1 - cos per token `[b, s]` (torch's cosine_embedding_loss, target 1)."""
    product = (student * teacher).sum(axis=-1)
    norms = ((student * student).sum(axis=-1) + _COSINE_EPS) * ((teacher * teacher).sum(axis=-1) + _COSINE_EPS)
    return 1.0 - product / ops.sqrt(norms)


def mse_loss(student, teacher):
    """`[b, s, h]` twice -> the mean over h of the squared difference `[b, s]`."""
    return ((student - teacher) ** 2).mean(axis=-1)


INTERMEDIATE_LOSSES = {"cosine": cosine_loss, "mse": mse_loss}


class DistillationModel(nn.Cell):
    """`student` (a GPTModel, trained) and `teacher` (a GPTModel of the student's padded vocabulary,
    frozen, always in eval mode) under the settings `config` (a DistillationConfig)."""

    def __init__(self, student, teacher, config):
        super().__init__(auto_prefix=False)           # the student's names stay a plain GPT's
        self.student = student
        teacher.update_parameters_name(TEACHER_PREFIX)
        for param in teacher.get_parameters():
            param.requires_grad = False
        self.teacher = teacher
        self.teacher.set_train(False)
        self.config = config
        self.vocab_size, self.padded_vocab_size = student.vocab_size, student.padded_vocab_size
        self.logits_kl = LogitsKLLoss(student.vocab_size, student.padded_vocab_size, config.logit_kl_temperature)
        self.skip_lm_loss = config.skip_lm_loss
        # Each pair's two hidden states: (kind, layer, where among the kept layer inputs) per side.
        sides = [[parse_layer(name) for name in pair[:2]] for pair in config.intermediate_pairs]
        self.student_keep, self.teacher_keep = (tuple(sorted({_position(pair[side]) for pair in sides} - {None}))
                                                for side in (0, 1))
        self.pairs = tuple((*_located(s, self.student_keep), *_located(t, self.teacher_keep), loss)
                           for (s, t), (_, _, loss) in zip(sides, config.intermediate_pairs))
        self.sequence_parallel = student.sequence_parallel
        if self.sequence_parallel:       # a layer's state is this rank's part of the sequence: gathered
            self.gathers = nn.CellList([GatherFromSequenceParallelRegion(reduce_grad=False)
                                        for _ in range(2 * len(self.pairs))])

    def set_train(self, mode=True):
        super().set_train(mode)
        self.teacher.set_train(False)       # no dropout in the teacher, as ModelOpt's teacher.eval()
        return self

    def construct(self, tokens, position_ids=None, attention_mask=None, labels=None):
        """Per-token `[b, s]`: (the student's cross-entropy, the logits KL, (each pair's loss, ...))."""
        student_x, student_states = self._run(self.student, self.student_keep, tokens, position_ids, attention_mask)
        teacher_x, teacher_states = self._run(self.teacher, self.teacher_keep, tokens, position_ids, attention_mask)
        student_logits = self.student.head.parallel_logits(student_x, self.student.output_weight())
        teacher_logits = ops.stop_gradient(self.teacher.head.parallel_logits(teacher_x, self.teacher.output_weight()))
        if self.training and self.skip_lm_loss:
            lm = ops.zeros(labels.shape, ms.float32)
        else:
            lm = self.student.head.loss(student_logits, labels)
        kl = self.logits_kl(student_logits, teacher_logits).reshape(labels.shape)
        intermediate = ()
        for i in range(len(self.pairs)):
            s_kind, s_layer, s_kept, t_kind, t_layer, t_kept, loss = self.pairs[i]
            student_h = self._compared(self.student, student_x, student_states, s_kind, s_layer, s_kept, 2 * i)
            teacher_h = self._compared(self.teacher, teacher_x, teacher_states, t_kind, t_layer, t_kept, 2 * i + 1)
            intermediate = intermediate + (INTERMEDIATE_LOSSES[loss](student_h.astype(ms.float32),
                                                                     ops.stop_gradient(teacher_h).astype(ms.float32)),)
        return lm, kl, intermediate

    def _run(self, model, keep, tokens, position_ids, attention_mask):
        """`model`'s final hidden states `[b, s, h]` and the states entering its layers at `keep`."""
        if keep:
            return model.hidden_states(tokens, position_ids, attention_mask, keep)
        return model.hidden_states(tokens, position_ids, attention_mask), ()

    def _compared(self, model, final, states, kind, layer, kept, gather):
        """The hidden state `[b, s, h]` a pair compares on one side (`gather`: its gather's number)."""
        if kind == "final_layernorm":
            return final
        x = states[kept]
        if kind == "input_layernorm":           # on this rank's part: the norm's gradients are summed over TP
            x = model.layers.cell_list[layer].input_layernorm(x)
        return self.gathers[gather](x) if self.sequence_parallel else x

    def load_teacher(self, logger=None):
        """The teacher's weights from --export-kd-teacher-load; every parameter must be there."""
        from rapidgpt.training.checkpointing import load_pretrained_weights
        flag = "--export-kd-teacher-load"
        report = load_pretrained_weights(self.config.teacher_load, self.teacher, logger, flag=flag)
        if report.initialised:
            raise UserError(f"{flag} {self.config.teacher_load}: the teacher's checkpoint lacks "
                            f"{len(report.initialised)} of its parameters (e.g. {report.initialised[0]}); it was saved "
                            f"from another architecture: give the teacher's model flags in "
                            f"--export-kd-teacher-model-config")


def _position(spec):
    """Where among the layers a pair's state is kept: layer N's input (its input norm's), N + 1 (its
    output); None for the final norm's output."""
    kind, layer = spec
    return None if kind == "final_layernorm" else layer + (kind == "output")


def _located(spec, keep):
    position = _position(spec)
    return (*spec, None if position is None else keep.index(position))


def build_distillation_model(args, student):
    """`student` (a GPTModel) with the teacher of --export-kd-teacher-load (`args.distillation`):
    a GPTModel of the teacher's model flags over the student's padded vocabulary."""
    teacher_args = args.distillation.teacher_args(args)
    teacher = GPTModel(TransformerConfig.from_args(teacher_args), student.vocab_size, student.padded_vocab_size,
                       teacher_args.untie_embeddings_and_output_weights)
    return DistillationModel(student, teacher, args.distillation)


def distillation_loss(args, model, loss_mask):
    """The loss function a forward step returns with a DistillationModel's output (`args.distillation`'s settings)."""
    kd = args.distillation
    return partial(distillation_loss_func, kd.skip_lm_loss, kd.kd_loss_scale, model.training, loss_mask)


def student_of(model):
    """The model whose weights are trained and checkpointed: a DistillationModel's student, else `model`."""
    return model.student if isinstance(model, DistillationModel) else model


def distillation_loss_func(skip_lm_loss, kd_loss_scale, training, loss_mask, output):
    """Megatron's post_training loss_func with ModelOpt's LogitsAndIntermediatesLossBalancer, on one
    micro-batch: `(loss sum, tokens, {"lm loss", "total loss", "logits distillation loss",
    "intermediate distillation loss"} sums)`; the trained loss is the total loss in training and
    the lm loss in evaluation. The balancer's rescaling factors are held constant in the backward."""
    lm, kl, intermediates = output
    mask = loss_mask.astype(ms.float32)
    lm_loss, logits_loss = (lm * mask).sum(), (kl * mask).sum()
    intermediate = ops.zeros((), ms.float32)
    for loss in intermediates:
        intermediate = intermediate + (loss * mask).sum()
    intermediate = intermediate / max(len(intermediates), 1)
    positive = intermediate > 0
    scale = ops.stop_gradient(logits_loss / ops.select(positive, intermediate, ops.ones_like(intermediate)))
    kd_loss = logits_loss + ops.select(positive, intermediate * scale, intermediate)
    if not skip_lm_loss:
        both = ops.logical_and(kd_loss > 0, lm_loss > 0)
        to_lm = ops.stop_gradient(lm_loss / ops.select(both, kd_loss, ops.ones_like(kd_loss)))
        kd_loss = lm_loss + ops.select(both, kd_loss * to_lm, kd_loss) * kd_loss_scale
    stats = {"lm loss": lm_loss, "total loss": kd_loss, "logits distillation loss": logits_loss,
             "intermediate distillation loss": intermediate}
    return (kd_loss if training else lm_loss), mask.sum(), stats
