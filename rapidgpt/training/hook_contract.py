"""What the four hooks must return, checked where a mistake would otherwise surface as pages of
MindSpore compile errors (or a bare StopIteration) far from its cause.

The forward hook is checked only when the first step fails: the step is then re-run eagerly on
the same micro-batch to find the cause (`diagnose_first_step`), so a correct hook costs nothing.
MindSpore writes `rank_N/om/analyze_fail.ir` into the working directory when a graph fails to
compile; it is moved under --log-dir (or deleted) so a failed run leaves nothing behind there.
(MindSpore also prints its own compile log to stderr before the error reaches RapidGPT; that
cannot be held back without hiding MindSpore's errors in general.)
"""
import os
import shutil

from mindspore import Tensor

from rapidgpt.errors import UserError


class HookContractError(UserError, TypeError):
    """A hook returned something the engine cannot use; the message says what it must return."""


def check_returned(result, hook, expected):
    """`result` of a provider hook must be a tuple of `len(expected)` values."""
    if not isinstance(result, (tuple, list)) or len(result) != len(expected):
        got = f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__
        raise HookContractError(f"{hook} returned {got}; it must return ({', '.join(expected)}) -- "
                                f"None for a split you do not have")
    return result


def check_length(dataset, needed, split, how):
    """A user's map-style dataset must hold the samples the run will draw from it."""
    if dataset is not None and len(dataset) < needed:
        raise HookContractError(
            f"train_valid_test_datasets_provider returned a {split} dataset of {len(dataset)} samples, but "
            f"this run draws {needed} from it ({how}); return a longer dataset (Megatron's datasets are "
            f"built to the sample counts the hook is given) or lower the counts")


def forward_output_problem(output, per_token=False):
    """Why a forward hook's `output` is not a loss (None when it is): a scalar Tensor, or
    Megatron's `(output, loss_fn)` whose loss_fn gives one (with `per_token`,
    --calculate-per-token-loss: (loss sum, tokens))."""
    if isinstance(output, tuple):
        if len(output) != 2 or not callable(output[1]):
            kinds = ", ".join(type(x).__name__ for x in output)
            return (f"returned a tuple ({kinds}); return the scalar loss, or Megatron's (output, loss_fn) "
                    f"with loss_fn(output) -> loss. If you return (logits, loss), return loss alone")
        output = output[1](output[0])
        values = output[:-1] if isinstance(output, tuple) and isinstance(output[-1], dict) else output
        if per_token and not (isinstance(values, tuple) and len(values) == 2):
            return ("(--calculate-per-token-loss) gave a loss function that returns the loss alone; it must "
                    "return Megatron's (loss summed over its tokens, number of tokens)")
        if isinstance(output, tuple):
            output = output[0]
    elif per_token:
        return ("returned the loss alone; with --calculate-per-token-loss return Megatron's (output, loss_fn) "
                "with loss_fn(output) -> (loss summed over its tokens, number of tokens)")
    if not isinstance(output, Tensor):
        return f"returned {type(output).__name__}; it must return the loss as a scalar MindSpore Tensor"
    if output.ndim != 0:
        return (f"returned a tensor of shape {list(output.shape)}, not a scalar loss (logits?); reduce it "
                f"to the mean loss, e.g. with ops.cross_entropy(logits, labels)")
    return None


def diagnose_first_step(forward, micro_batch, error):
    """The first step raised `error`: run `forward(micro_batch)` eagerly to name a hook mistake
    (raises HookContractError), else re-raise `error`."""
    _move_compile_report()
    try:
        output = forward(micro_batch)
    except TypeError as e:
        if "is not an iterator" in str(e) or "object is not an iterator" in str(e):
            raise HookContractError(
                "run_forward_step calls next(data_iterator), but inside the compiled step it receives the "
                "micro-batch itself; use rapidgpt.next_batch(data_iterator), which is next() outside the "
                "step and the batch inside it (or run with --no-jit)") from None
        raise error from None
    except Exception:         # noqa: BLE001 - not a contract problem: the original error says more
        raise error from None
    from rapidgpt.global_vars import get_args
    problem = forward_output_problem(output, getattr(get_args(), "calculate_per_token_loss", False))
    if problem:
        raise HookContractError(f"run_forward_step {problem}") from None
    raise error


def _move_compile_report():
    """Take MindSpore's analyze_fail.ir out of the working directory: into --log-dir if given
    (named in the log), else deleted (the error message says what went wrong)."""
    from rapidgpt.global_vars import get_args, get_logger
    from rapidgpt.parallel.state import get_parallel_state
    log_dir = get_args().log_dir
    rank_dir = f"rank_{get_parallel_state().rank}"       # this rank's only: the ranks share the cwd
    om_dir = os.path.join(rank_dir, "om")
    report = os.path.join(om_dir, "analyze_fail.ir")
    try:
        if not os.path.isfile(report):
            return
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            destination = os.path.join(log_dir, f"{rank_dir}_analyze_fail.ir")
            shutil.move(report, destination)
            get_logger().info(f" MindSpore's compile report moved to {destination}")
        else:
            os.remove(report)
        if not os.listdir(om_dir):
            os.rmdir(om_dir)
            if not os.listdir(rank_dir):
                os.rmdir(rank_dir)
    except OSError:            # tidying must never hide the error being reported
        pass
