"""mha.torch.distributed's wrappers check what the modules check, in the same words (one-rank Gloo
group; the checks that need several ranks are in test_torch_distributed.py): input dtypes and
devices, widths, valid lengths, key padding masks, shard's arguments; HeadParallel's own path hands
what it does not run to the module's call, which refuses it in its words."""
import pytest
import torch
import torch.distributed as dist

import mha.torch as mt
import mha.torch.distributed as mtd

OP = r"\[mha\.torch\.distributed\.SequenceParallel\] "


@pytest.fixture(scope="module", autouse=True)
def group():
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch without Gloo")
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield


def _chapter():
    m = mt.MultiHeadAttention(8, 2, 0.0)
    m(*[torch.zeros(1, 1, 8)] * 3)  # built: its widths are known
    return m


def _drop_in():
    return mt.MultiheadAttention(8, 2, batch_first=True)


@pytest.mark.parametrize("method", ["ring", "all_gather"])
def test_sequence_parallel_refuses_what_the_modules_refuse(method):
    x = torch.randn(2, 4, 8)
    sp = mtd.SequenceParallel(_chapter(), method=method)
    for dtype in (torch.int32, torch.float64):  # no truncated ints, no silent narrowing
        with pytest.raises(TypeError, match=OP + rf"queries: dtype {dtype}; mha computes in float32"):
            sp(x.to(dtype), x, x)
    with pytest.raises(ValueError, match=OP + r"keys: width 6 \(shape \(2, 4, 6\)\); the module's W_k takes 8"):
        sp(x, torch.randn(2, 4, 6), torch.randn(2, 4, 6))
    with pytest.raises(ValueError, match=OP + r"valid_lens: entry 1 is -1; lengths must be >= 0"):
        sp(x, x, x, torch.tensor([2.0, -1.0]))
    with pytest.raises(ValueError, match=OP + r"valid_lens: entry 0 is NaN; lengths must be numbers >= 0"):
        sp(x, x, x, torch.tensor([float("nan"), 1.0]))
    with pytest.raises(TypeError, match=OP + r"valid_lens: dtype torch.bool; wanted integer or floating lengths"):
        sp(x, x, x, torch.tensor([True, False]))
    d = mtd.SequenceParallel(_drop_in(), method=method)
    with pytest.raises(ValueError, match=OP + r"key_padding_mask: shape \(2, 3\); wanted \(B, L_rank\) = \(2, 4\)"):
        d(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=OP + r"value: width 5 \(shape \(2, 4, 5\)\); the module's vdim takes 8"):
        d(x, x, torch.randn(2, 4, 5))
    with pytest.raises(TypeError, match=OP + r"query: dtype torch.int64"):
        d(x.long(), x, x)


def test_sequence_parallel_lengths_as_integers_equal_floats():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    m = _chapter()
    sp = mtd.SequenceParallel(m)
    torch.testing.assert_close(sp(x, x, x, torch.tensor([3, 5])), sp(x, x, x, torch.tensor([3.0, 5.0])),
                               rtol=0, atol=0)
    torch.testing.assert_close(sp(x, x, x, torch.tensor([3, 5])), m(x, x, x, torch.tensor([3.0, 5.0])),
                               rtol=0, atol=1e-5)


def test_head_parallel_hands_what_it_does_not_run_to_the_module():
    x = torch.randn(2, 4, 8)
    m = _chapter()
    hp = mtd.HeadParallel(m)
    for dtype in (torch.int32, torch.float64):
        with pytest.raises(TypeError, match=rf"\[mha\.torch\.MultiHeadAttention\] queries: dtype {dtype}"):
            hp(x.to(dtype), x, x)
    with pytest.raises(ValueError, match=r"valid_lens: entry 1 is -1; lengths must be >= 0"):
        hp(x, x, x, torch.tensor([2.0, -1.0]))
    with pytest.raises(ValueError, match=r"\[mha\.torch\.MultiHeadAttention\].*keys"):
        hp(x, torch.randn(2, 4, 6), torch.randn(2, 4, 6))
    d = mtd.HeadParallel(_drop_in())
    with pytest.raises(ValueError, match=r"\[mha\.torch\.MultiheadAttention\] key_padding_mask"):
        d(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool), need_weights=False)
    # what it does run equals the module
    torch.testing.assert_close(hp(x, x, x, torch.tensor([2, 4])), m(x, x, x, torch.tensor([2.0, 4.0])),
                               rtol=0, atol=1e-5)


def test_shard_checks_its_arguments():
    x = torch.arange(8.0).reshape(1, 8)
    with pytest.raises(ValueError, match=r"\[mha\.torch\.distributed\.shard\] rank: -1; wanted a rank of the group, "
                                         r"0 to 1"):
        mtd.shard(x, 1, -1, 2)
    with pytest.raises(ValueError, match=r"shard\] rank: 2; wanted a rank of the group, 0 to 1"):
        mtd.shard(x, 1, 2, 2)
    with pytest.raises(ValueError, match=r"shard\] world_size: 0; wanted the group's size, at least 1"):
        mtd.shard(x, 1, 0, 0)
    with pytest.raises(ValueError, match=r"shard\] dim: 2 for a tensor of 2 dimensions"):
        mtd.shard(x, 2, 0, 2)
    with pytest.raises(TypeError, match=r"shard\] rank: got bool"):
        mtd.shard(x, 1, True, 2)
    assert mtd.shard(x, -1, 1, 2).tolist() == [[4.0, 5.0, 6.0, 7.0]]
