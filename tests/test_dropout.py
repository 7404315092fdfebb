"""rapidgpt.parallel.Dropout: masks against a numpy reference, their statistics, TP slices, the
key the compiled step selects for each micro-batch, and a compile free of analyzer warnings."""
import logging
import os
import subprocess
import sys
import textwrap

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from rapidgpt.optim import OptimizerWrapper
from rapidgpt.parallel.random import Dropout, graph_arange, initialize_parameters, set_micro_batch_key
from rapidgpt.training.step import TrainStep


def lowbias32(x):
    """Reference: the published 'lowbias32' integer hash, on numpy uint32 arrays."""
    x = np.array(x, np.uint32, ndmin=1)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint32(16))) * np.uint32(0x7FEB352D)
        x = (x ^ (x >> np.uint32(15))) * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def reference_keep(shape, p, stream_key, iteration, micro_batch):
    """The documented mask formula for a whole (unsplit) tensor, in numpy."""
    golden = np.uint32(0x9E3779B9)
    key = lowbias32(lowbias32(lowbias32(iteration) ^ np.uint32(micro_batch)) ^ np.uint32(stream_key))
    rows = np.arange(int(np.prod(shape[:-1])), dtype=np.uint32).reshape(shape[:-1] + (1,))
    columns = np.arange(shape[-1], dtype=np.uint32)
    with np.errstate(over="ignore"):
        row_hash = lowbias32(rows * golden + key).reshape(rows.shape) | np.uint32(1)
        column_hash = lowbias32(columns * golden + lowbias32(key)) | np.uint32(1)
        return row_hash * column_hash >= np.uint32(round(p * 2 ** 32))


def dropout(p, partition_dim=None, tp=(0, 1), train=True):
    cell = Dropout(p, partition_dim)
    cell.tp_rank, cell.tp_size = tp           # as the layout would give on that rank
    cell.set_train(train)
    return cell


def masks(cell, x, iteration=7, micro_batch=0, jit=False):
    set_micro_batch_key(Tensor(np.uint32(iteration)), micro_batch)
    y = (ms.jit(cell.construct) if jit else cell)(Tensor(x)).asnumpy()
    return y != 0, y


@pytest.mark.parametrize("jit", [False, True])
def test_mask_is_the_documented_function_and_scales_kept_values(jit):
    x = np.ones((2, 3, 5, 16), np.float32)
    cell = dropout(0.25)
    keep, y = masks(cell, x, iteration=11, micro_batch=2, jit=jit)
    stream = int(cell.stream_key.asnumpy())
    np.testing.assert_array_equal(keep, reference_keep(x.shape, 0.25, stream, 11, 2))
    np.testing.assert_allclose(y[keep], np.float32(1 / 0.75))


def test_keep_rate_and_independence():
    p = 0.1
    x = np.ones((64, 128, 128), np.float32)                    # 1M elements
    cell = dropout(p)
    drop = ~masks(cell, x)[0]
    sigma = np.sqrt(p * (1 - p) / drop.size)
    assert abs(drop.mean() - p) < 5 * sigma
    # Neighbours along columns, rows and the leading dimension drop independently: P(both) = p^2.
    for a, b in ((drop[..., 1:], drop[..., :-1]), (drop[:, 1:], drop[:, :-1]), (drop[1:], drop[:-1])):
        both = (a & b).mean()
        assert abs(both - p * p) < 5 * np.sqrt(p * p / a.size), both
    # Other micro-batches, iterations and cells draw unrelated masks.
    for other in (masks(cell, x, micro_batch=1)[0], masks(cell, x, iteration=8)[0], masks(dropout(p), x)[0]):
        assert abs((~other & drop).mean() - p * p) < 5 * np.sqrt(p * p / drop.size)


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("shape,partition_dim", [((2, 4, 6, 8), 1), ((2, 4, 6, 8), -1), ((2, 4, 6, 8), 0),
                                                 ((2, 4, 6, 8), 2), ((6, 8), 0), ((8,), 0)])
def test_tensor_parallel_ranks_hold_slices_of_the_single_process_mask(shape, partition_dim, jit):
    x = np.ones(shape, np.float32)
    whole = dropout(0.3, tp=(0, 1))
    keep = masks(whole, x)[0]
    stream = int(whole.stream_key.asnumpy())
    np.testing.assert_array_equal(keep, reference_keep(shape, 0.3, stream, 7, 0))
    for rank in range(2):
        part = dropout(0.3, partition_dim, tp=(rank, 2))
        part.stream_key = whole.stream_key                    # the same cell name on every rank
        local = np.split(x, 2, axis=partition_dim)[rank]
        expected = np.split(keep, 2, axis=partition_dim)[rank]
        np.testing.assert_array_equal(masks(part, local, jit=jit)[0], expected)


def test_graph_arange_is_arange_in_and_out_of_graphs():
    def in_graph(start, stop):
        return (graph_arange(start, stop), graph_arange(start, stop, ms.uint32),
                graph_arange(start, stop, ms.int64))

    for start, stop in ((0, 5), (3, 9), (4, 5)):
        for fn in (in_graph, ms.jit(in_graph)):
            for got, dtype in zip(fn(start, stop), (np.int32, np.uint32, np.int64)):
                got = got.asnumpy()
                assert got.dtype == dtype
                np.testing.assert_array_equal(got, np.arange(start, stop))


def test_identity_in_eval_mode_and_at_zero_probability_and_bad_probability():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_array_equal(masks(dropout(0.5, train=False), x)[1], x)
    np.testing.assert_array_equal(masks(dropout(0.0), x)[1], x)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)


class _Net(nn.Cell):
    def __init__(self, p):
        super().__init__()
        self.dense = nn.Dense(16, 16)
        self.drop = Dropout(p)

    def construct(self, x):
        return (self.drop(self.dense(x)) ** 2).mean()


def test_stream_keys_come_from_seed_and_cell_name_and_nn_dropout_is_flagged(caplog):
    a, b, c = _Net(0.1), _Net(0.1), _Net(0.1)
    initialize_parameters(a, 5)
    initialize_parameters(b, 5)
    initialize_parameters(c, 6)
    assert a.drop.stream_key.asnumpy() == b.drop.stream_key.asnumpy() != c.drop.stream_key.asnumpy()

    class WithNnDropout(nn.Cell):
        def __init__(self):
            super().__init__()
            self.legacy = nn.Dropout(p=0.1)

    with caplog.at_level(logging.WARNING, logger="rapidgpt"):
        initialize_parameters(WithNnDropout(), 5)
    assert "legacy is a mindspore.nn.Dropout" in caplog.text and "rapidgpt.parallel.Dropout" in caplog.text


def test_compiled_step_gives_each_micro_batch_its_own_masks():
    """Two identical micro-batches in one step: the compiled step must switch the key between them
    exactly as the eager step does (an unchanged key would give both the same mask)."""
    from rapidgpt.optim import SGD
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    results = {}
    for jit in (True, False):
        net = _Net(0.5)
        initialize_parameters(net, 3)
        for param in net.trainable_params():                  # nn.Dense draws its own init
            param.set_data(Tensor(np.full(param.shape, 0.1, np.float32)))
        net.set_train(True)

        def forward(batch):
            return net(batch[0])

        step = TrainStep(forward, OptimizerWrapper.around(SGD(net.trainable_params(), 0.1, momentum=0.0)), 2,
                         jit=jit)
        results[jit] = step((Tensor(np.stack([x, x])),), 0.1, 5)[:2]
    np.testing.assert_allclose(results[True], results[False], rtol=1e-6)
    set_micro_batch_key(Tensor(np.uint32(5)), 0)
    loss_micro_0 = float(net(Tensor(x)))
    assert abs(results[False][0] - loss_micro_0) > 1e-4       # the two micro-batches differed


_COMPILE_SCRIPT = textwrap.dedent("""
    import numpy as np
    from mindspore import Tensor, nn
    from rapidgpt.optim import SGD, OptimizerWrapper
    from rapidgpt.parallel.random import Dropout, initialize_parameters
    from rapidgpt.training.step import TrainStep

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(8, 8)
            self.hidden = Dropout(0.1)
            self.attention = Dropout(0.1, partition_dim=1)

        def construct(self, x):
            b, s, _ = x.shape                    # a value left unused, as GPTModel leaves one
            y = self.hidden(self.dense(x))
            probs = self.attention(y.reshape(b, s, 2, 4).transpose(0, 2, 1, 3))
            return (probs ** 2).mean()

    net = Net()
    initialize_parameters(net, 1)
    net.set_train(True)

    def forward(batch):
        return net(batch[0])

    step = TrainStep(forward, OptimizerWrapper.around(SGD(net.trainable_params(), 0.1, momentum=0.0), 1.0), 2)
    x = np.random.default_rng(0).standard_normal((2, 2, 3, 8)).astype(np.float32)
    print("loss", step((Tensor(x),), 0.1, 1)[0])
""")


def test_compiling_a_dropout_step_prints_no_analyzer_warning(tmp_path):
    """MindSpore warns "Some side effect nodes were eliminated by mistake" when a compiled function
    that it believes has side effects leaves a value unused. ops.arange made every caller look
    side-effecting (its type check runs as interpreted Python); Dropout must not."""
    env = dict(os.environ, GLOG_v="2", GLOG_logtostderr="1")    # MindSpore's WARNING records on
    script = tmp_path / "dropout_step.py"               # MindSpore parses source files only
    script.write_text(_COMPILE_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "loss" in out.stdout
    warnings = [line for line in out.stderr.splitlines()
                if "ANALYZER" in line or "eliminated by mistake" in line]
    assert not warnings, "\n".join(warnings)
