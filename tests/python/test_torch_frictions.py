"""Frictions a PyTorch user hit, each checked against what torch itself does (both torch lines):
- replace_attention on a model that holds one nn.MultiheadAttention under two names gives one drop-in
  under both (torch's modules are shared by reference; training one trains the other);
- FlashAttention-style windows take numpy integers, as torch takes them for sizes, and still refuse
  bools;
- a key padding or attention mask of an integer dtype is refused in torch's words (mask.bool()), as
  torch.nn.MultiheadAttention refuses it, naming the public class;
- torch.nn.utils.parametrize on the drop-in's and the chapter's weights: the call reads the
  parametrized tensors and their originals get the gradients torch's own module gives them."""
import numpy as np
import pytest
import torch

import mha.torch as mt


def test_replace_attention_keeps_a_shared_module_shared():
    model = torch.nn.Module()
    model.a = torch.nn.MultiheadAttention(8, 2)
    model.b = model.a
    model.inner = torch.nn.Sequential(model.a)
    replaced = mt.replace_attention(model)
    assert sorted(replaced) == ["a", "b", "inner.0"]
    assert isinstance(model.a, mt.MultiheadAttention)
    assert model.a is model.b is model.inner[0]
    assert len([m for m in model.modules() if isinstance(m, mt.MultiheadAttention)]) == 1


def test_windows_take_numpy_integers_and_refuse_bools():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 2, 4, generator=g) for _ in range(3))
    want = mt.attention(q, k, v, window=(2, 0))
    for pair in ((np.int64(2), np.int32(0)), [np.int16(2), 0]):
        assert torch.equal(mt.attention(q, k, v, window=pair), want)
    with torch.no_grad():
        got = mt.attention_with_kv_cache(q, k.clone(), v.clone(), cache_seqlens=6, window=(np.int64(2), 0))
    assert float((got - want).abs().max()) <= 1e-6
    for bad in ((True, 0), (np.bool_(True), 0), (2.0, 0)):
        with pytest.raises(TypeError, match=r"\[mha\.torch\.attention\] window"):
            mt.attention(q, k, v, window=bad)


@pytest.mark.parametrize("which", ["key_padding_mask", "attn_mask"])
def test_an_integer_mask_is_refused_in_torch_words(which):
    x = torch.randn(2, 3, 8)
    mask = torch.zeros(2, 3, dtype=torch.int64) if which == "key_padding_mask" else torch.zeros(3, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"\[mha\.torch\.MultiheadAttention\] {which}: dtype torch\.int\d+ is "
                                         r"neither bool nor floating; wanted a boolean mask \(mask\.bool\(\)"):
        mt.MultiheadAttention(8, 2, batch_first=True)(x, x, x, **{which: mask})
    peer = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    try:  # torch refuses it too (1.13 takes uint8 only, with a warning)
        peer(x, x, x, **{which: mask})
        refused = False
    except (AssertionError, RuntimeError, TypeError, ValueError):
        refused = True
    assert refused


@pytest.mark.parametrize("make", [lambda: mt.MultiHeadAttention(8, 2, 0.0),
                                  lambda: mt.MultiheadAttention(8, 2, batch_first=True)])
def test_a_caches_window_is_an_integer_not_a_bool(make):
    m = make().eval()
    m(torch.zeros(1, 1, 8), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))  # the chapter's lazy layers
    assert m.kv_cache(2, 2, window=np.int64(3)).window == 3
    for bad in (True, 2.0, "2"):
        with pytest.raises(TypeError, match=rf"\[mha\.torch\.{type(m).__name__}\.kv_cache\] window"):
            m.kv_cache(2, 2, window=bad)


def test_module_windows_take_numpy_integers():
    m = mt.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(2))
    want, _ = m(x, x, x, window=(1, 0), need_weights=False)
    got, _ = m(x, x, x, window=(np.int64(1), np.int32(0)), need_weights=False)
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match=r"window"):
        m(x, x, x, window=(True, 0), need_weights=False)


class _Scale(torch.nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, w):
        return w * self.s


@pytest.mark.parametrize("separate", [False, True])
def test_parametrized_weights_equal_torch(separate):
    from torch.nn.utils import parametrize
    torch.manual_seed(3)
    kw = dict(kdim=6, vdim=5) if separate else {}
    ours = mt.MultiheadAttention(8, 2, batch_first=True, **kw)
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True, **kw)
    ref.load_state_dict(ours.state_dict())
    names = ["q_proj_weight", "v_proj_weight"] if separate else ["in_proj_weight"]
    for m in (ours, ref):
        for n in names:
            parametrize.register_parametrization(m, n, _Scale(1.5))
        parametrize.register_parametrization(m.out_proj, "weight", _Scale(-0.5))
    assert ours.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(2, 4, 8)
    k, v = (torch.randn(2, 4, 6), torch.randn(2, 4, 5)) if separate else (x, x)
    got, gw = ours(x, k, v)
    want, ww = ref(x, k, v)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    torch.testing.assert_close(gw, ww, rtol=0, atol=1e-5)
    got.square().sum().backward()
    want.square().sum().backward()
    theirs = dict(ref.named_parameters())
    assert sum("original" in n for n, _ in ours.named_parameters()) == len(names) + 1
    for n, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[n].grad, rtol=0, atol=1e-4, msg=n)


def test_parametrized_chapter_weights():
    from torch.nn.utils import parametrize
    torch.manual_seed(4)
    m = mt.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(2, 3, 8)
    m(x, x, x)  # built
    before = m(x, x, x).detach()
    parametrize.register_parametrization(m.W_q, "weight", _Scale(2.0))
    after = m(x, x, x)
    with torch.no_grad():
        plain = mt.MultiHeadAttention(8, 2, 0.0)
        plain(x, x, x)
        plain.load_state_dict({n.replace("parametrizations.weight.original", "weight"): t
                               for n, t in m.state_dict().items()})
        plain.W_q.weight.mul_(2.0)
    torch.testing.assert_close(after, plain(x, x, x), rtol=0, atol=1e-6)
    assert not torch.allclose(after, before)
    after.sum().backward()
    assert m.W_q.parametrizations.weight.original.grad.abs().sum() > 0


def test_the_one_letter_apart_classes_point_at_each_other():
    """mha.torch.MultiHeadAttention (the d2l chapter's) and MultiheadAttention (the drop-in) are one
    letter apart: the other's arguments are refused with the other's name (torch refuses unknown
    keywords with TypeError, and so do these)."""
    x = torch.randn(2, 3, 8)
    chapter = mt.MultiHeadAttention(8, 2, 0.0)
    drop_in = mt.MultiheadAttention(8, 2, batch_first=True)
    hint_drop_in = r"its drop-in is mha\.torch\.MultiheadAttention \(lower-case h\)"
    hint_chapter = r"mha\.torch\.MultiHeadAttention \(capital H\)"
    with pytest.raises(TypeError, match=r"\[mha\.torch\.MultiHeadAttention\] unexpected keyword arguments: "
                                        r"batch_first; .*" + hint_drop_in):
        mt.MultiHeadAttention(8, 2, 0.0, batch_first=True)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: key_padding_mask, need_weights; .*"
                                        + hint_drop_in):
        chapter(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool), need_weights=False)
    with pytest.raises(TypeError, match=r"\[mha\.torch\.MultiheadAttention\] unexpected keyword arguments: "
                                        r"valid_lens; .*" + hint_chapter):
        drop_in(x, x, x, valid_lens=torch.tensor([2.0, 3.0]))
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: num_hiddens; .*" + hint_chapter):
        mt.MultiheadAttention(8, 2, num_hiddens=8)
    with pytest.raises(ValueError, match=r"key_padding_mask: shape \(2,\) of torch\.float32 for a batched call; "
                                         r"wanted \(B, S\), True = masked \(valid lengths \(B,\) are the d2l "
                                         r"chapter's module's: mha\.torch\.MultiHeadAttention, capital H\)"):
        drop_in(x, x, x, torch.tensor([2.0, 3.0]))
    # keywords neither takes: no hint, still a TypeError naming them
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: bogus$"):
        chapter(x, x, x, bogus=1)
    # unbatched calls keep their 1-D key_padding_mask
    out, _ = drop_in(x[0], x[0], x[0], torch.tensor([False, False, True]))
    assert out.shape == (3, 8)


def test_pruned_drop_in_numbers_slopes_and_sinks_as_built():
    """After prune_heads the drop-in keeps heads' numbers (as sinks and head_mask do): ALiBi slopes
    and sinks are one per head as built, the kept heads' taken; the call equals the unpruned module
    with the pruned head gated off, and the differentiable weights take the same slopes."""
    import copy
    torch.manual_seed(7)
    m = mt.MultiheadAttention(8, 4, batch_first=True)
    whole = copy.deepcopy(m)
    m.prune_heads([1])
    x = torch.randn(2, 5, 8, requires_grad=True)
    slopes, sinks = torch.tensor([0.5, 9.0, 0.25, 0.125]), torch.tensor([0.1, 5.0, -0.3, 0.2])
    got, w = m(x, x, x, alibi_slopes=slopes, sinks=sinks, is_causal=True,
               attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1))
    want, _ = whole(x, x, x, alibi_slopes=slopes, sinks=sinks, is_causal=True,
                    attn_mask=torch.ones(5, 5, dtype=torch.bool).triu(1), head_mask=torch.tensor([1.0, 0, 1, 1]))
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert w is not None and w.requires_grad  # recomputed by torch's ops with the kept slopes
    w.sum().backward()
    with pytest.raises(ValueError, match=r"alibi_slopes: 3 slopes for the module's 4 heads; wanted one per head "
                                         r"as built \(heads keep their numbers after prune_heads"):
        m(x, x, x, alibi_slopes=slopes[[0, 2, 3]])
    with pytest.raises(ValueError, match=r"sinks: 3 logits for 4 heads"):
        m(x, x, x, sinks=sinks[[0, 2, 3]])
    m.eval()
    with torch.no_grad():  # the cached call: the same rule
        c = m.kv_cache(2, 5)
        cached, _ = m(x, x, x, cache=c, alibi_slopes=slopes, sinks=sinks)
        torch.testing.assert_close(cached, got.detach(), rtol=0, atol=1e-5)


def test_a_full_cache_names_the_torch_module():
    x = torch.randn(1, 3, 8)
    for m, name in ((mt.MultiheadAttention(8, 2, batch_first=True), r"mha\.torch\.MultiheadAttention"),
                    (mt.MultiHeadAttention(8, 2, 0.0), r"mha\.torch\.MultiHeadAttention")):
        m.eval()
        with torch.no_grad():
            m(x, x, x)
            with pytest.raises(ValueError, match=rf"^\[{name}\] cache: 3 new positions do not fit row 0 "
                                                 r"\(length 0, capacity 2\)"):
                m(x, x, x, cache=m.kv_cache(1, 2))
