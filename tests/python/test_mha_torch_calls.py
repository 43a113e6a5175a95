"""mha.torch's calls read the module as it is at each call and keep nothing shared.

- Threads x autograd: one module called from 8 Python threads, forward and
  backward interleaved, equal and different shapes: every thread's input and
  parameter gradients equal those of the same calls run one after another
  (bit for bit: mha's results do not depend on the thread count).
- Replaced parameters: assigning a new Parameter, tying two, replacing
  out_proj or W_o, `.data = t`, in-place writes under no_grad: the next call
  computes with what the module holds then (compared with the d2l chapter's
  module / nn.MultiheadAttention given the same state dict).
- Module attributes read per call: batch_first, training, dropout.
- Double backward refuses clearly; bfloat16/float16 inputs and
  torch.autocast run the bfloat16 mode and return the input dtype; `.half()`
  is refused with a message; kv_cache(dtype=torch.bfloat16).
Float32 comparisons with the peers: rtol 1e-5, atol 1e-6 (the outputs are O(1)).
"""
import threading

import mha
import numpy as np
import pytest
import torch
from torch import nn

import mha.torch as mt
import seed_reference as seed
from torch_threads import one_torch_thread  # noqa: F401 (an autouse fixture)

RTOL, ATOL = 1e-5, 1e-6


def peer_of(ours):
    """nn.MultiheadAttention with our module's options and state dict."""
    p = nn.MultiheadAttention(ours.embed_dim, ours.num_heads, dropout=0.0, bias=ours.in_proj_bias is not None,
                              add_bias_kv=ours.bias_k is not None, add_zero_attn=ours.add_zero_attn,
                              kdim=ours.kdim, vdim=ours.vdim, batch_first=ours.batch_first)
    p.load_state_dict(ours.state_dict())
    return p


def grads_of(module, inputs, fn):
    """(output, {name: grad}) of loss fn(output) for module(*inputs)."""
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    module.zero_grad()
    out = module(*xs)
    out = out[0] if isinstance(out, tuple) else out
    fn(out).backward()
    g = {f"x{i}": x.grad.clone() for i, x in enumerate(xs)}
    g.update({n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None})
    return out.detach(), g


def test_fused_is_the_default_kernel_of_both_modules():
    assert mt.MultiheadAttention(8, 2).kernel == mha.Kernel.FUSED
    assert mt.MultiHeadAttention(8, 2, 0.0).kernel == mha.Kernel.FUSED


@pytest.mark.parametrize("same_shapes", [True, False])
def test_threads_with_autograd_get_their_own_gradients(same_shapes):
    torch.manual_seed(0)
    m = mt.MultiheadAttention(16, 4, batch_first=True)
    rng = np.random.default_rng(1)
    shapes = [(2, 5, 7)] * 8 if same_shapes else [(int(rng.integers(1, 4)), int(rng.integers(1, 9)),
                                                     int(rng.integers(1, 9))) for _ in range(8)]
    cases = []
    for i, (B, L, S) in enumerate(shapes):
        q = torch.tensor(rng.standard_normal((B, L, 16)), dtype=torch.float32)
        kv = torch.tensor(rng.standard_normal((B, S, 16)), dtype=torch.float32)
        g = torch.tensor(rng.standard_normal((B, L, 16)), dtype=torch.float32)
        cases.append((q, kv, g))

    def run(case):
        q, kv, g = case
        qs, kvs = q.clone().requires_grad_(True), kv.clone().requires_grad_(True)
        out, _ = m(qs, kvs, kvs, need_weights=False)
        params = [p for _, p in sorted(m.named_parameters())]
        grads = torch.autograd.grad((out * g).sum(), [qs, kvs, *params])
        return out.detach(), grads

    serial = [run(c) for c in cases]
    results = [None] * 8
    errors = []
    barrier = threading.Barrier(8)

    def worker(i):
        try:
            barrier.wait()
            for _ in range(3):  # forwards and backwards of the threads interleave
                results[i] = run(cases[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(8):
        torch.testing.assert_close(results[i][0], serial[i][0], rtol=0, atol=0)
        for a, b in zip(results[i][1], serial[i][1]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_interleaved_forwards_and_backwards_of_one_module():
    """Three calls, then their backwards in another order: each gets its own call's gradients."""
    torch.manual_seed(2)
    m = mt.MultiHeadAttention(12, 3, 0.0, bias=True)
    xs = [torch.randn(2, n, 5, requires_grad=True) for n in (3, 4, 6)]
    outs = [m(x, x, x, None) for x in xs]
    for i in (2, 0, 1):
        outs[i].square().sum().backward()
    ref = seed.MultiHeadAttention(12, 3, 0.0, bias=True)
    ref(xs[0], xs[0], xs[0], None)
    ref.load_state_dict(m.state_dict())
    for x in xs:
        xr = x.detach().clone().requires_grad_(True)
        ref(xr, xr, xr, None).square().sum().backward()
        torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, dict(ref.named_parameters())[n].grad, rtol=1e-4, atol=1e-5)


def _drop_in_replacements():
    E = 8

    def assign(m):
        m.in_proj_weight = nn.Parameter(torch.randn(3 * E, E))

    def out_proj(m):
        m.out_proj = nn.modules.linear.NonDynamicallyQuantizableLinear(E, E)

    def data(m):
        m.in_proj_weight.data = torch.randn(3 * E, E)

    def in_place(m):
        with torch.no_grad():
            m.out_proj.weight.mul_(-2)
            m.in_proj_bias.add_(1)

    def init(m):
        nn.init.xavier_uniform_(m.in_proj_weight)

    def load(m):
        m.load_state_dict(nn.MultiheadAttention(E, 2).state_dict())

    return [assign, out_proj, data, in_place, init, load]


@pytest.mark.parametrize("replace", _drop_in_replacements(), ids=lambda f: f.__name__)
def test_drop_in_reads_replaced_parameters(replace):
    torch.manual_seed(3)
    m = mt.MultiheadAttention(8, 2)
    x = torch.randn(4, 2, 8)
    before, _ = m(x, x, x)
    replace(m)
    after, w = m(x, x, x)
    want, want_w = peer_of(m)(x, x, x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(w, want_w, rtol=RTOL, atol=ATOL)


def _chapter_replacements():
    def assign(m):
        m.W_q.weight = nn.Parameter(torch.randn(12, 5))

    def tie(m):
        m.W_k.weight = m.W_q.weight

    def layer(m):
        m.W_o = nn.Linear(12, 12, bias=False)

    def data(m):
        m.W_v.weight.data = torch.randn(12, 5)

    def in_place(m):
        with torch.no_grad():
            m.W_q.weight.mul_(3)

    return [assign, tie, layer, data, in_place]


@pytest.mark.parametrize("replace", _chapter_replacements(), ids=lambda f: f.__name__)
def test_chapter_module_reads_replaced_parameters(replace):
    torch.manual_seed(4)
    m = mt.MultiHeadAttention(12, 3, 0.0)
    x = torch.randn(2, 4, 5)
    before = m(x, x, x, None)
    replace(m)
    after = m(x, x, x, None)
    ref = seed.MultiHeadAttention(12, 3, 0.0)
    ref(x, x, x, None)
    ref.load_state_dict(m.state_dict())
    if replace.__name__ == "tie":
        ref.W_k.weight = ref.W_q.weight
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, ref(x, x, x, None), rtol=RTOL, atol=ATOL)
    # and the gradients reach the Parameters the module holds now
    after.square().sum().backward()
    ref.zero_grad()
    ref(x, x, x, None).square().sum().backward()
    for n, p in ref.named_parameters():
        torch.testing.assert_close(dict(m.named_parameters())[n].grad, p.grad, rtol=1e-4, atol=1e-5)


def test_tied_weights_accumulate_both_uses():
    torch.manual_seed(5)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    ref = seed.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(2, 3, 8)
    m(x, x, x, None)
    ref(x, x, x, None)
    ref.load_state_dict(m.state_dict())
    m.W_k.weight = m.W_q.weight
    ref.W_k.weight = ref.W_q.weight
    m(x, x, x, None).sum().backward()
    ref(x, x, x, None).sum().backward()
    torch.testing.assert_close(m.W_q.weight.grad, ref.W_q.weight.grad, rtol=1e-4, atol=1e-5)


def test_batch_first_training_and_dropout_are_read_at_every_call():
    torch.manual_seed(6)
    m = mt.MultiheadAttention(8, 2, dropout=0.0).eval()
    x = torch.randn(3, 2, 8)  # (L, B, E)
    seq, _ = m(x, x, x)
    m.batch_first = True
    bat, _ = m(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1))
    torch.testing.assert_close(bat.transpose(0, 1), seq, rtol=0, atol=0)
    m.dropout = 0.5
    xb = x.transpose(0, 1)
    eval_out, eval_w = m(xb, xb, xb)  # eval mode: no dropout
    torch.testing.assert_close(eval_out, bat, rtol=0, atol=0)
    m.train()
    train_out, w = m(xb, xb, xb, average_attn_weights=False)
    assert not torch.allclose(train_out, bat)
    # PyTorch returns the weights after dropout: each is dropped (0) or kept and scaled by 1/(1-p).
    m.eval()
    _, w_eval = m(xb, xb, xb, average_attn_weights=False)
    kept = w != 0
    assert kept.any() and (~kept).any()
    torch.testing.assert_close(w[kept], 2 * w_eval[kept], rtol=1e-6, atol=0)


def test_double_backward_is_refused_clearly():
    m = mt.MultiheadAttention(8, 2)
    x = torch.randn(3, 2, 8, requires_grad=True)
    out, _ = m(x, x, x)
    with pytest.raises(RuntimeError, match=r"create_graph=True: mha's attention has no double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)
    # A gradient penalty beside the loss would otherwise be dropped silently.
    out, _ = m(x, x, x)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(out.square().sum(), [x, *m.parameters()], create_graph=True)
    (g,) = torch.autograd.grad(out.sum(), x)  # first order is fine
    assert g.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_run_the_bfloat16_mode(dtype):
    torch.manual_seed(7)
    m = mt.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)
    out, w = m(x.to(dtype), x.to(dtype), x.to(dtype))
    assert out.dtype == dtype and w.dtype == dtype
    m.precision = "bfloat16"
    want, _ = m(x.to(dtype).float(), x.to(dtype).float(), x.to(dtype).float())
    torch.testing.assert_close(out, want.to(dtype), rtol=0, atol=0)
    xg = x.to(dtype).requires_grad_(True)
    out, _ = m(xg, xg, xg)
    out.float().sum().backward()
    assert xg.grad.dtype == dtype and torch.isfinite(xg.grad.float()).all()


def test_autocast_with_a_linear_before_attention():
    torch.manual_seed(8)
    lin = nn.Linear(16, 16)
    m = mt.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", torch.bfloat16):
        h = lin(x)
        out, _ = m(h, h, h)
    assert h.dtype == torch.bfloat16 and out.dtype == torch.bfloat16
    peer, _ = peer_of(m)(lin(x), lin(x), lin(x))
    assert (out.float() - peer).abs().max() < 0.05  # the bfloat16 mode's rounding


def test_half_modules_are_refused_with_a_message():
    m = mt.MultiheadAttention(8, 2).half()
    x = torch.randn(3, 2, 8).half()
    with pytest.raises(TypeError, match=r"in_proj_weight: dtype torch\.float16.*\.float\(\)"):
        m(x, x, x)


def test_kv_cache_takes_torch_dtypes():
    m = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    for dtype in (torch.bfloat16, "bfloat16", torch.float32):
        cache = m.kv_cache(2, 6, dtype=dtype)
        x = torch.randn(2, 3, 8)
        with torch.no_grad():
            out, _ = m(x, x, x, cache=cache)
        assert out.shape == (2, 3, 8)


def test_sequence_first_cached_calls_match_batch_first_ones():
    torch.manual_seed(9)
    m = mt.MultiheadAttention(8, 2).eval()  # batch_first=False, as PyTorch's default
    x = torch.randn(2, 4, 8)                # (B, L, E)
    c1, c2 = m.kv_cache(2, 8), m.kv_cache(2, 8)
    with torch.no_grad():
        seq, _ = m(x.transpose(0, 1), x.transpose(0, 1), x.transpose(0, 1), cache=c1)
        m.batch_first = True
        bat, _ = m(x, x, x, cache=c2)
    torch.testing.assert_close(seq.transpose(0, 1), bat, rtol=0, atol=0)


def test_tracing_scripting_and_fx_are_refused_with_messages():
    m = mt.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 3, 8)
    with pytest.raises(RuntimeError, match=r"torch\.jit\.trace / torch\.onnx\.export.*eagerly"):
        torch.jit.trace(lambda t: m(t, t, t)[0], (x,))
    with pytest.raises(RuntimeError, match=r"torch\.jit\.script: mha computes outside TorchScript"):
        torch.jit.script(m)
    with pytest.raises(RuntimeError, match=r"torch\.fx\.symbolic_trace.*leaves"):
        torch.fx.symbolic_trace(SelfAttention())


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = mt.MultiHeadAttention(8, 2, 0.0)

    def forward(self, x):
        return self.attention(x, x, x)


def test_torch_encoder_layers_run_mha_in_eval_mode_under_no_grad():
    """torch's encoder layer takes a fused path of its own in eval mode under no_grad when its
    self_attn looks like nn.MultiheadAttention; with mha's module it calls forward (counted)."""
    torch.manual_seed(10)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval()
    ref = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval()
    ref.load_state_dict(layer.state_dict())
    ours = mt.MultiheadAttention(16, 4, batch_first=True)
    ours.load_state_dict(layer.self_attn.state_dict())
    layer.self_attn = ours
    calls = []
    ours.register_forward_hook(lambda *a: calls.append(1))
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    ref_encoder = nn.TransformerEncoder(ref, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        got, want = encoder(x), ref_encoder(x)
    assert len(calls) == 2
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_the_buffer_pool_holds_one_calls_worth_however_many_calls():
    """A module's calls reuse the buffers of its last finished call; the pool must not grow."""
    m = mt.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 3, 8, requires_grad=True)
    counts = []
    for i in range(200):
        out, _ = m(x, x, x, need_weights=i % 2 == 0)
        out.sum().backward()
        with torch.no_grad():
            m(x, x, x)
        counts.append(m._weights.state.spare_buffers)
    assert max(counts) <= 12 and counts[-1] == counts[100]


def test_bfloat16_torch_tensors_are_read_at_every_numpy_entry_point():
    """numpy has no bfloat16: mha's array API widens such tensors (exactly) instead of reading an
    empty array (which gave 'shape (0,)' errors and wrote empty safetensors)."""
    x = torch.randn(2, 3, 8).to(torch.bfloat16)
    m = mha.MultiHeadAttention(8, 2, seed=0).eval()
    np.testing.assert_array_equal(m(x, x, x), m(x.float().numpy(), x.float().numpy(), x.float().numpy()))
    import tempfile, os
    path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    mha.save_safetensors(path, {"a": x})
    np.testing.assert_array_equal(mha.load_safetensors(path)["a"], x.float().numpy())
    state = {k: v.to(torch.bfloat16) for k, v in nn.MultiheadAttention(8, 2).state_dict().items()}
    t = mha.TorchMultiheadAttention.from_state_dict(state, 2)
    assert t.state_dict()["in_proj_weight"].shape == (24, 8)


@pytest.mark.parametrize("index", range(12))
def test_returned_weights_are_differentiable(index):
    """need_weights with inputs that require grad: the weights carry gradients to the query, the key
    and the projections, as nn.MultiheadAttention's do; their values are mha's."""
    rng = np.random.default_rng(500 + index)
    H = int(rng.integers(1, 4))
    E = H * int(rng.integers(1, 4))
    batch_first, bias_kv, zero_attn = (bool(rng.integers(0, 2)) for _ in range(3))
    average = bool(rng.integers(0, 2))
    torch.manual_seed(index)
    m = mt.MultiheadAttention(E, H, batch_first=batch_first, add_bias_kv=bias_kv, add_zero_attn=zero_attn)
    peer = peer_of(m)
    B, L, S = int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(2, 6))
    shape = lambda n: (B, n, E) if batch_first else (n, B, E)  # noqa: E731
    q = torch.tensor(rng.standard_normal(shape(L)), dtype=torch.float32, requires_grad=True)
    kv = torch.tensor(rng.standard_normal(shape(S)), dtype=torch.float32, requires_grad=True)
    kpm = torch.tensor(rng.random((B, S)) < 0.3)
    kpm[:, 0] = False  # every row keeps a key (PyTorch gives NaN otherwise)
    am = torch.tensor(rng.standard_normal((L, S)), dtype=torch.float32) if rng.integers(0, 2) else None
    G = None
    grads = []
    for module in (m, peer):
        module.zero_grad()
        qq, kk = q.detach().clone().requires_grad_(True), kv.detach().clone().requires_grad_(True)
        _, w = module(qq, kk, kk, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)
        if G is None:
            G = torch.randn(w.shape, generator=torch.Generator().manual_seed(index))
        (w * G).sum().backward()
        grads.append((w.detach(), qq.grad, kk.grad, m.in_proj_weight.grad if module is m else
                      peer.in_proj_weight.grad))
    with torch.no_grad():
        _, plain = m(q, kv, kv, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)
    torch.testing.assert_close(grads[0][0], plain, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads[0], grads[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
