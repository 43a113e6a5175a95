"""torch 2.x line only: mha.torch's attention functions as torch.library operators (python/mha/_torch_ops.py).

- torch.library.opcheck passes for every operator (schema, fake tensors, autograd registration, AOT
  dispatch) on inputs with masks, grouped heads, sinks, windows, ALiBi, packed batches and dropout;
- a model mixing scaled_dot_product_attention and attention (causal, window, grouped heads, a packed
  batch) and mha.torch's modules (the drop-in with masks and weights, the d2l chapter's module with
  valid lengths) compiles with fullgraph=True, static and dynamic shapes, with the eager output and
  gradients (the modules are traced as torch's linear layers around mha's operator:
  python/mha/_torch_traced.py);
- torch.export keeps the mha operators, and the exported program gives the eager output.
Eager against compiled is the same code on the same inputs: within 1e-5.
"""
import copy

import pytest
import torch

import mha.torch as mt
from mha import _torch_ops

pytestmark = pytest.mark.skipif(not _torch_ops.HAS_LIBRARY,
                                reason="torch.library.custom_op needs torch >= 2.4 (this is torch "
                                       f"{torch.__version__})")

TOL = 1e-5


def _sdpa_samples():
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    key0 = torch.zeros(1, dtype=torch.int64)
    key1 = torch.tensor([12345], dtype=torch.int64)
    yield (r(2, 4, 5, 8), r(2, 4, 7, 8), r(2, 4, 7, 6), None, None, key0, False, [0.35, 0.0, 0.0])
    yield (r(2, 4, 5, 8), r(2, 2, 7, 8), r(2, 2, 7, 8), None, None, key0, True, [0.35, 0.0, 0.0])
    keep = torch.rand(1, 4, 5, 7, generator=g) > 0.3
    yield (r(2, 4, 5, 8), r(2, 4, 7, 8), r(2, 4, 7, 8), keep, None, key0, False, [0.5, 0.0, 0.0])
    yield (r(2, 4, 5, 8), r(2, 1, 7, 8), r(2, 1, 7, 8), r(2, 1, 5, 7), r(4), key0, False, [0.5, 3.0, 0.0])
    yield (r(1, 2, 9, 4), r(1, 2, 9, 4), r(1, 2, 9, 4), None, None, key1, True, [0.5, 0.0, 0.25])


def _flash_samples():
    g = torch.Generator().manual_seed(1)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    key0 = torch.zeros(1, dtype=torch.int64)
    yield (r(2, 5, 4, 8), r(2, 7, 2, 8), r(2, 7, 2, 6), None, None, None, key0, [-1, 0], [0.35, 0.0, 0.0], 2**31)
    yield (r(2, 6, 4, 8), r(2, 6, 4, 8), r(2, 6, 4, 8), r(4).abs(), r(4), None, key0, [2, 1],
           [0.35, 5.0, 0.0], 2**31)
    cu = torch.tensor([0, 3, 3, 10], dtype=torch.int64)
    yield (r(1, 10, 2, 4), r(1, 10, 1, 4), r(1, 10, 1, 4), None, None, cu, key0, [-1, 0], [0.5, 0.0, 0.0], 7)
    yield (r(1, 8, 2, 4), r(1, 8, 2, 4), r(1, 8, 2, 4), None, None, None, torch.tensor([77]), [-1, -1],
           [0.5, 0.0, 0.3], 2**31)


def _with_grad(args, grads):
    return tuple(a.clone().requires_grad_(True) if i in grads and a is not None else a for i, a in enumerate(args))


@pytest.mark.parametrize("index", range(5))
def test_opcheck_sdpa(index):
    args = list(_sdpa_samples())[index]
    args = _with_grad(args, (0, 1, 2, 4))
    torch.library.opcheck(torch.ops.mha.sdpa.default, args)


@pytest.mark.parametrize("index", range(4))
def test_opcheck_flash(index):
    args = list(_flash_samples())[index]
    args = _with_grad(args, (0, 1, 2, 4))
    torch.library.opcheck(torch.ops.mha.flash.default, args)


@pytest.mark.parametrize("which", ["sdpa", "flash"])
def test_opcheck_backward_operators(which):
    if which == "sdpa":
        args = list(_sdpa_samples())[3]
        out, stats = torch.ops.mha.sdpa(*args)
        bargs = (torch.randn_like(out), *args[:3], out, stats, *args[3:])
        torch.library.opcheck(torch.ops.mha.sdpa_backward.default, bargs)
    else:
        args = list(_flash_samples())[1]
        out, stats = torch.ops.mha.flash(*args)
        bargs = (torch.randn_like(out), *args[:3], out, stats, *args[3:-1])
        torch.library.opcheck(torch.ops.mha.flash_backward.default, bargs)


class Mixed(torch.nn.Module):
    """scaled_dot_product_attention (causal, grouped heads, a boolean mask) and attention (a window, a
    packed batch, sinks) in one model, with projections around them."""

    def __init__(self, E=16, H=4, Hkv=2):
        super().__init__()
        self.H, self.Hkv, self.d = H, Hkv, E // H
        self.q = torch.nn.Linear(E, E)
        self.kv = torch.nn.Linear(E, 2 * Hkv * self.d)
        self.o = torch.nn.Linear(E, E)
        self.sinks = torch.nn.Parameter(torch.linspace(-1.0, 1.0, H))

    def forward(self, x, keep, cu_seqlens):
        B, L, E = x.shape
        q = self.q(x).view(B, L, self.H, self.d)
        k, v = self.kv(x).view(B, L, 2, self.Hkv, self.d).unbind(2)
        a = mt.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                            is_causal=True, enable_gqa=True)
        b = mt.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                            attn_mask=keep, enable_gqa=True)
        c = mt.attention(q, k, v, window=(3, 0), sinks=self.sinks)
        packed = mt.attention(q.reshape(B * L, self.H, self.d), k.reshape(B * L, self.Hkv, self.d),
                              v.reshape(B * L, self.Hkv, self.d), causal=True, cu_seqlens=cu_seqlens)
        y = a.transpose(1, 2) + b.transpose(1, 2) + c + packed.view(B, L, self.H, self.d)
        return self.o(y.reshape(B, L, E))


class WithModules(Mixed):
    """Mixed's functions and mha.torch's modules: the drop-in (batch first, a key padding mask,
    is_causal, its weights averaged) and the d2l chapter's module (valid lengths, one of them 0)."""

    def __init__(self, E=16, H=4):
        super().__init__(E, H)
        self.drop_in = mt.MultiheadAttention(E, H, batch_first=True, add_bias_kv=True)
        self.seq_first = mt.MultiheadAttention(E, 2, kdim=6, vdim=10)
        self.chapter = mt.MultiHeadAttention(E, H, 0.0, bias=True)
        self.key_proj, self.value_proj = torch.nn.Linear(E, 6), torch.nn.Linear(E, 10)
        with torch.no_grad():  # the chapter's lazy layers built eagerly, as a first call would
            self.chapter(torch.zeros(1, 1, E), torch.zeros(1, 1, E), torch.zeros(1, 1, E))

    def forward(self, x, keep, cu_seqlens):
        B, L, E = x.shape
        y = super().forward(x, keep, cu_seqlens)
        pad = ~keep[:, 0, 0, :]  # (B, L) True = padding, nn.MultiheadAttention's convention
        a, w = self.drop_in(y, x, x, key_padding_mask=pad, is_causal=True, need_weights=True)
        xs = x.transpose(0, 1)
        b, _ = self.seq_first(xs, self.key_proj(xs), self.value_proj(xs), need_weights=False,
                              attn_mask=torch.ones(L, L, dtype=torch.bool).triu(1))
        lens = torch.arange(B) % (L + 1)  # row 0 has length 0: the chapter's uniform weights
        c = self.chapter(a, x, y, lens)
        return c + b.transpose(0, 1) + w.sum(-1, keepdim=True)


def _inputs(B=2, L=6, E=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g)
    keep = torch.rand(B, 1, L, L, generator=g) > 0.4
    keep[..., 0] = True
    cu = torch.tensor([0, 1, L + 2, B * L], dtype=torch.int32)
    return x, keep, cu


def _run(model, inputs):
    model.zero_grad()
    x = inputs[0].clone().requires_grad_(True)
    out = model(x, *inputs[1:])
    (out * torch.arange(out.numel()).reshape(out.shape).sin()).sum().backward()
    return out.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


def _close(a, b, what):
    err = float((a - b).abs().max()) if a.numel() else 0.0
    assert err <= TOL * max(1.0, float(b.abs().max())), f"{what}: {err:.3g}"


@pytest.mark.parametrize("kind", [Mixed, WithModules])
@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph_matches_eager(dynamic, kind):
    torch.manual_seed(0)
    model = kind()
    compiled = torch.compile(model, fullgraph=True, dynamic=dynamic, backend="aot_eager")
    for B, L in ((2, 6), (3, 9)) if dynamic else ((2, 6),):
        inputs = _inputs(B, L)
        want = _run(model, inputs)
        got = _run(compiled, inputs)
        _close(got[0], want[0], "output")
        _close(got[1], want[1], "input gradient")
        for i, (g, w) in enumerate(zip(got[2], want[2])):
            _close(g, w, f"parameter {i} gradient")


def test_compile_with_inductor_matches_eager():
    torch.manual_seed(1)
    model = WithModules()
    compiled = torch.compile(model, fullgraph=True)
    inputs = _inputs(2, 5, seed=3)
    want, got = _run(model, inputs), _run(compiled, inputs)
    _close(got[0], want[0], "output")
    _close(got[1], want[1], "input gradient")


@pytest.mark.parametrize("kind", [Mixed, WithModules])
def test_export_keeps_the_mha_operators(kind):
    torch.manual_seed(2)
    model = kind().eval()
    inputs = _inputs(2, 6, seed=4)
    program = torch.export.export(model, inputs)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "mha.sdpa.default" in targets and "mha.flash.default" in targets, targets
    with torch.no_grad():
        want = model(*inputs)
        got = program.module()(*inputs)
    _close(got, want, "exported output")
    other = _inputs(2, 6, seed=5)
    with torch.no_grad():
        _close(program.module()(*other), model(*other), "exported output, other inputs")


def test_dropout_under_compile_follows_the_generator():
    """The dropout key is drawn from torch's generator inside the graph: the compiled call repeats the
    eager one under the same seed, and another seed drops other weights."""
    q = torch.randn(1, 2, 16, 8)

    def f(q):
        return mt.scaled_dot_product_attention(q, q, q, dropout_p=0.5)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.manual_seed(7)
    eager = f(q)
    torch.manual_seed(7)
    got = compiled(q)
    _close(got, eager, "dropout output")
    torch.manual_seed(8)
    assert float((compiled(q) - eager).abs().max()) > 1e-3


def test_options_the_traced_modules_lack_are_refused_by_name():
    m = mt.MultiheadAttention(8, 2, batch_first=True, rotary=True)
    x = torch.randn(2, 3, 8)
    with pytest.raises(Exception, match=r"\[mha\.torch\.MultiheadAttention\] rotary under torch\.compile"):
        torch.compile(m, fullgraph=True, backend="aot_eager")(x, x, x)
    chapter = mt.MultiHeadAttention(8, 2, 0.0).eval()
    chapter(x, x, x)
    cache = chapter.kv_cache(2, 8)
    with torch.no_grad(), pytest.raises(Exception, match=r"\[mha\.torch\.MultiHeadAttention\] cache under "
                                                         r"torch\.compile"):
        torch.compile(lambda x: chapter(x, x, x, cache=cache), fullgraph=True, backend="aot_eager")(x)


# ---- attention over a key/value cache: torch.ops.mha.flash_kvcache -----------

def _kvcache_samples():
    g = torch.Generator().manual_seed(2)

    def r(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)

    lens = torch.tensor([3, 0], dtype=torch.int64)
    yield (r(2, 2, 4, 8), r(2, 9, 2, 8), r(2, 9, 2, 6), r(2, 2, 2, 8), r(2, 2, 2, 6), lens, None, None, [-1, -1],
           True, [0.35, 0.0])
    yield (r(2, 1, 4, 8), r(2, 9, 2, 8, dtype=torch.bfloat16), r(2, 9, 2, 8, dtype=torch.bfloat16),
           r(2, 1, 2, 8), r(2, 1, 2, 8), lens, r(4).abs(), r(4), [2, 0], True, [0.35, 5.0])
    yield (r(2, 3, 2, 4), r(2, 5, 1, 4), r(2, 5, 1, 4), None, None, torch.tensor([5, 4]), None, None, [-1, -1],
           False, [0.5, 0.0])


@pytest.mark.parametrize("index", range(3))
def test_opcheck_flash_kvcache(index):
    args = list(_kvcache_samples())[index]
    torch.library.opcheck(torch.ops.mha.flash_kvcache.default, args)


class Decoder(Mixed):
    """Mixed's layers decoding with the cache as buffers (a static cache): projections,
    mha.torch.attention_with_kv_cache (causal, a window, sinks), the output projection."""

    def __init__(self, E=16, H=4, Hkv=2, B=2, capacity=24, dtype=torch.float32):
        super().__init__(E, H, Hkv)
        self.register_buffer("k_cache", torch.zeros(B, capacity, Hkv, self.d, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(B, capacity, Hkv, self.d, dtype=dtype))

    def forward(self, x, seqlens):
        B, L, E = x.shape
        q = self.q(x).view(B, L, self.H, self.d)
        k, v = self.kv(x).view(B, L, 2, self.Hkv, self.d).unbind(2)
        y = mt.attention_with_kv_cache(q, self.k_cache, self.v_cache, k, v, cache_seqlens=seqlens, causal=True,
                                       window=(5, 0), sinks=self.sinks)
        return self.o(y.reshape(B, L, E))


def _decode(model, x, P):
    """Prefill P positions, then one at a time; returns the outputs and the caches."""
    seqlens = torch.zeros(x.shape[0], dtype=torch.int32)
    outs = []
    with torch.no_grad():
        outs.append(model(x[:, :P], seqlens))
        seqlens += P
        for t in range(P, x.shape[1]):
            outs.append(model(x[:, t:t + 1], seqlens))
            seqlens += 1
    return torch.cat(outs, 1), model.k_cache.clone(), model.v_cache.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_decoding_matches_eager(backend, dtype):
    torch.manual_seed(3)
    model = Decoder(dtype=dtype).eval()
    x = torch.randn(2, 13, 16)
    want = _decode(model, x, 6)
    model.k_cache.zero_()
    model.v_cache.zero_()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=backend)
    got = _decode(compiled, x, 6)
    for a, b, what in zip(got, want, ("outputs", "k_cache", "v_cache")):
        _close(a.float(), b.float(), what)


def test_export_keeps_the_cached_operator_and_writes_the_cache():
    torch.manual_seed(4)
    model = Decoder().eval()
    x, seqlens = torch.randn(2, 1, 16), torch.tensor([4, 7], dtype=torch.int32)
    program = torch.export.export(model, (x, seqlens))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "mha.flash_kvcache.default" in targets, targets
    exported = program.module()
    with torch.no_grad():
        want = model(x, seqlens)
        got = exported(x, seqlens)
    _close(got, want, "exported output")
    _close(exported.k_cache, model.k_cache, "exported k_cache")
    assert float(exported.k_cache[1, 7].abs().sum()) > 0, "the new key was written into the exported cache"


class CachedDecoder(torch.nn.Module):
    """The drop-in and the d2l chapter's module decoding over TensorKVCaches held as attributes."""

    def __init__(self, E=16, B=2, capacity=24):
        super().__init__()
        self.drop_in = mt.MultiheadAttention(E, 4, batch_first=True)
        self.chapter = mt.MultiHeadAttention(E, 2, 0.0, bias=True)
        with torch.no_grad():
            self.chapter(torch.zeros(1, 1, E), torch.zeros(1, 1, E), torch.zeros(1, 1, E))
        self.cache_a = self.drop_in.tensor_kv_cache(B, capacity)
        self.cache_b = self.chapter.tensor_kv_cache(B, capacity, dtype=torch.bfloat16)

    def forward(self, x):
        y, _ = self.drop_in(x, x, x, cache=self.cache_a, window=(4, 0), softcap=5.0)
        return self.chapter(y, y, y, cache=self.cache_b)


def _decode_modules(model, x, P):
    with torch.no_grad():
        outs = [model(x[:, :P])] + [model(x[:, t:t + 1]) for t in range(P, x.shape[1])]
    return torch.cat(outs, 1)


def test_module_cached_calls_over_tensor_caches_compile_and_export():
    torch.manual_seed(6)
    model = CachedDecoder().eval()
    x = torch.randn(2, 12, 16)
    want = _decode_modules(model, x, 5)
    for c in (model.cache_a, model.cache_b):
        c.reset()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    _close(_decode_modules(compiled, x, 5), want, "compiled decoding")
    assert model.cache_a.lengths.tolist() == [12, 12]
    for c in (model.cache_a, model.cache_b):
        c.reset()
    with torch.no_grad():
        model(x[:, :5])
    program = torch.export.export(model, (x[:, 5:6],))
    targets = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count("mha.flash_kvcache.default") == 2, targets
    reference = copy.deepcopy(model)  # the exported module may share the model's buffers
    exported = program.module()
    for name, buf in reference.named_buffers():
        exported.get_buffer(name).copy_(buf)
    with torch.no_grad():
        ref = reference(x[:, 5:6])
        got = exported(x[:, 5:6])
    _close(got, ref, "exported step")
    assert exported.get_buffer("cache_a.lengths").tolist() == [6, 6]
