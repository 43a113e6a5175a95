"""mha packs each weight once per change (src/cpu/gemm/packed_weight.h): every way
torch writes a parameter of an mha.torch module reaches the next call.

Writes through torch bump the parameter's version counter (in-place ops under
no_grad, nn.init, load_state_dict); a write that bypasses it (in place on
.data) needs module.parameters_written(). After each write the module's
output is compared with its peer holding the same parameters (the d2l
chapter's module, torch.nn.MultiheadAttention) within 1e-5 relative (of the
output's largest value, the float32 parity bound), and with an mha
module built fresh from the same state dict bit for bit (float32 and
bfloat16: a fresh module packs from scratch).
"""
import pytest
import torch
from torch import nn

import mha.torch as mt
import seed_reference as seed
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)


def fresh_chapter_module(ours, x):
    twin = mt.MultiHeadAttention(ours.num_hiddens, ours.num_heads, 0.0, bias=True, precision=ours.precision)
    twin.load_state_dict(ours.state_dict())
    twin.eval()
    return twin(x, x, x, None)


WRITES = {
    "in place under no_grad": lambda m: m.W_q.weight.mul_(0.5),
    "nn.init": lambda m: nn.init.normal_(m.W_k.weight),
    "a bias in place": lambda m: m.W_o.bias.add_(0.25),
    "load_state_dict": lambda m: m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()}),
}


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_chapter_module_sees_torch_writes(write, precision):
    torch.manual_seed(3)
    ours = mt.MultiHeadAttention(16, 4, 0.0, bias=True, precision=precision).eval()
    x = torch.randn(2, 9, 12)
    before = ours(x, x, x, None)
    with torch.no_grad():
        WRITES[write](ours)
    after = ours(x, x, x, None)
    assert not torch.equal(after, before)
    assert torch.equal(after, fresh_chapter_module(ours, x))
    if precision == "float32":
        ref = seed.MultiHeadAttention(16, 4, 0.0, bias=True)
        ref(x, x, x, None)
        ref.load_state_dict(ours.state_dict())
        ref.eval()
        want = ref(x, x, x, None)
        torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_writes_through_data_need_parameters_written():
    torch.manual_seed(4)
    ours = mt.MultiHeadAttention(16, 4, 0.0, bias=True).eval()
    x = torch.randn(2, 9, 12)
    ours(x, x, x, None)
    ours.W_v.weight.data.mul_(-1.0)  # torch's version counter does not see this
    ours.parameters_written()
    assert torch.equal(ours(x, x, x, None), fresh_chapter_module(ours, x))


@pytest.mark.parametrize("packed", [True, False])
def test_drop_in_sees_torch_writes(packed):
    torch.manual_seed(6)
    kdim = None if packed else 10  # in_proj_weight (copied into mha) or q/k/v_proj_weight (shared)
    ours = mt.MultiheadAttention(16, 4, bias=True, batch_first=True, kdim=kdim, vdim=kdim).eval()
    ref = nn.MultiheadAttention(16, 4, bias=True, batch_first=True, kdim=kdim, vdim=kdim).eval()
    q, kv = torch.randn(2, 7, 16), torch.randn(2, 5, kdim or 16)
    ours(q, kv, kv)
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(0.5).add_(0.01)
        ref.load_state_dict(ours.state_dict())
    out, _ = ours(q, kv, kv)
    want = ref(q, kv, kv)[0]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    # Through .data, announced.
    before = out
    name, p = next(iter(ours.named_parameters()))
    p.data.mul_(-1.0)
    ours.parameters_written()
    ref.load_state_dict(ours.state_dict())
    out, _ = ours(q, kv, kv)
    want = ref(q, kv, kv)[0]
    assert not torch.equal(out, before)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()), msg=name)
