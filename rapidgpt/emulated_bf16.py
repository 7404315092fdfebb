"""bf16 on a backend without bf16 kernels (MindSpore 2.10's CPU backend): fp32 tensors that hold
bf16 values.

Why: MindSpore 2.10's CPU kernels in bf16 (measured, forward and gradient): casts, + - * /,
reshape, transpose, concat, slice and split work; MatMul, BatchMatMul, Softmax, Gather, the
reductions (so the gradient of every broadcast), Exp, Log, Tanh, Sigmoid, GeLU, Erf, Sqrt, Pow,
comparisons, LayerNorm, IsFinite and Assign do not. A bf16 tensor cannot flow through a step there.

What is emulated (`--bf16` on the CPU; rapidgpt/config/precision.py): every value a bf16 run holds
in bf16 is rounded to the nearest bf16 value (ties to even: a cast to bf16 and back) and kept in fp32:
- the model's parameters, at the start and after every update; the optimizer keeps fp32 main
  parameters and state, as in any bf16 run (rapidgpt/optim/mixed_precision.py);
- the result of each op of RapidGPT's layers (`RoundsToBf16.rounded`): a matrix product accumulates
  in fp32 and rounds its result, as bf16 GEMMs do; an elementwise op, an activation, a residual
  addition, a dropout, an attention softmax in the model's dtype, a norm's result are computed in
  fp32 and rounded once, as PyTorch computes a bf16 op. Where a bf16 run computes in fp32
  (inside the norms, the softmax with --attention-softmax-in-fp32, the loss), so does this;
- the gradients flowing back through those results: the gradient of a cast is the cast back, so
  each activation gradient is rounded where its activation was. Weight gradients are summed in fp32,
  as Megatron's gradient-accumulation fusion sums them into its fp32 main gradients; with
  --grad-reduce-in-bf16, whose bf16 run keeps them in a bf16 buffer, they are rounded as each
  micro-batch's are added and after the data-parallel reduction (rapidgpt/training/schedules.py;
  a rank's parameters are marked `emulated_bf16` for it).
What differs from bf16 kernels: memory (4 bytes a value), speed (fp32 kernels plus the casts), and
the order in which a fused GPU kernel adds. Cells that are not RapidGPT's compute in fp32 on the
bf16 values they are given (their parameters rounded, their results not); the start-up line names them.
"""
import mindspore as ms
from mindspore import ops


def round_to_bf16(x):
    """fp32 `x` rounded to bf16 values (fp32 result); its gradient is rounded the same way."""
    return ops.cast(ops.cast(x, ms.bfloat16), ms.float32)


class RoundsToBf16:
    """A cell whose op results are rounded to bf16 under emulated bf16 (`emulate_bf16` switches it
    on before the model is compiled); `rounded(x)` is `x` otherwise."""
    emulates_bf16 = False

    def rounded(self, x):
        if self.emulates_bf16:          # decided while compiling
            return round_to_bf16(x)
        return x


def emulate_bf16(model):
    """Switch `model` (in place) to emulated bf16: its parameters rounded, its RapidGPT cells
    rounding their results. Returns the names of the leaf cells with parameters that are not
    RapidGPT's (they compute in fp32, see the module docstring)."""
    for param in model.get_parameters():
        param.set_data(round_to_bf16(param.value()))
        param.emulated_bf16 = True
    foreign = []
    for name, cell in model.cells_and_names():
        if isinstance(cell, RoundsToBf16):
            cell.emulates_bf16 = True
        elif (not type(cell).__module__.startswith("rapidgpt.") and not cell.name_cells()
              and list(cell.get_parameters(expand=False))):
            foreign.append(name or type(cell).__name__)
    return foreign


def assign_rounded(done, target, value):
    """`target = value` rounded to bf16 values, once `done` has been computed (an emulated bf16
    model's parameter from its fp32 main parameter)."""
    return ops.assign(target, round_to_bf16(ops.depend(value, done)))

