"""mha.torch.distributed over Gloo (2 and 4 CPU processes): SequenceParallel (the chapter's module and
the drop-in inside; valid lengths, causal over global positions, zigzag order, uneven splits) and
HeadParallel give, on each rank, its rows of one process's output and its block of every gradient
(inputs; parameter gradients all-reduced) within 1e-5; a rank failing its checks is an error on every
rank; a rank that never calls gives the others an error within the group's timeout, not a hang."""
import copy
import datetime
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mha
import mha.torch
import mha.torch.distributed as mtd

TOL = dict(rtol=0, atol=1e-5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params_grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _allreduced_grads(m):
    out = {}
    for n, p in m.named_parameters():
        g = torch.zeros_like(p) if p.grad is None else p.grad.clone()
        dist.all_reduce(g)
        out[n] = g
    return out


def _rows_as_one_process(got, want, w, xs, x, m, ring, rank, P, zigzag=False):
    """A rank's rows of the output and of the input gradient, and the all-reduced parameter
    gradients, against one process's (want and x.grad: the whole sequence's, backward done)."""
    (got * mtd.shard(w, 1, rank, P, zigzag)).sum().backward()
    torch.testing.assert_close(got, mtd.shard(want.detach(), 1, rank, P, zigzag), **TOL)
    torch.testing.assert_close(xs.grad, mtd.shard(x.grad, 1, rank, P, zigzag), **TOL)
    full = _params_grads(m)
    for n, g in _allreduced_grads(ring).items():
        torch.testing.assert_close(g, full[n], **TOL, msg=n)


def _chapter_case(rank, P, L, causal, lens, zigzag, distinct, method):
    torch.manual_seed(L * 7 + causal * 3 + zigzag)
    B, D = 2, 8
    m = mha.torch.MultiHeadAttention(D, 4, 0.0)
    x = torch.randn(B, L, D, requires_grad=True)
    y = torch.randn(B, L, 6, requires_grad=True) if distinct else x
    z = torch.randn(B, L, 5, requires_grad=True) if distinct else x
    valid = torch.randint(1, L + 1, (B,)) if lens else None
    m(x, y, z)  # materialise the lazy projections before copying
    ring = copy.deepcopy(m)
    w = torch.randn(B, L, D)
    # one process: the chapter's per-query valid lengths over the whole sequence
    q_lens = None
    if causal:
        q_lens = torch.arange(1, L + 1, dtype=torch.float32).expand(B, L)
    if valid is not None:
        v = valid.float()[:, None].expand(B, L)
        q_lens = v if q_lens is None else torch.minimum(q_lens, v)
    want = m(x, y, z, None if q_lens is None else q_lens.contiguous())
    (want * w).sum().backward()

    def mine(t):
        return mtd.shard(t.detach(), 1, rank, P, zigzag).requires_grad_()
    xs, ys, zs = mine(x), (mine(y) if distinct else None), (mine(z) if distinct else None)
    ys, zs = (ys, zs) if distinct else (xs, xs)
    got = mtd.SequenceParallel(ring, zigzag=zigzag, method=method)(xs, ys, zs, valid, causal=causal)
    (got * mtd.shard(w, 1, rank, P, zigzag)).sum().backward()
    torch.testing.assert_close(got, mtd.shard(want.detach(), 1, rank, P, zigzag), **TOL)
    for a, b in ((xs, x), (ys, y), (zs, z)) if distinct else ((xs, x),):
        torch.testing.assert_close(a.grad, mtd.shard(b.grad, 1, rank, P, zigzag), **TOL)
    full = _params_grads(m)
    for n, g in _allreduced_grads(ring).items():
        torch.testing.assert_close(g, full[n], **TOL, msg=n)


def _drop_in_case(rank, P, L, causal, lens, zigzag, method):
    torch.manual_seed(L + 11 * causal + zigzag)
    B, E = 2, 8
    m = mha.torch.MultiheadAttention(E, 2, batch_first=True)
    ring = copy.deepcopy(m)
    x = torch.randn(B, L, E, requires_grad=True)
    w = torch.randn(B, L, E)
    kpm = None
    if lens:
        valid = torch.randint(1, L + 1, (B,))
        kpm = torch.arange(L)[None, :] >= valid[:, None]
    # one process: torch's own causal mask convention over the whole sequence
    am = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
    want, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False, attn_mask=am)
    (want * w).sum().backward()
    xs = mtd.shard(x.detach(), 1, rank, P, zigzag).requires_grad_()
    got, _ = mtd.SequenceParallel(ring, zigzag=zigzag, method=method)(
        xs, xs, xs, key_padding_mask=None if kpm is None else mtd.shard(kpm, 1, rank, P, zigzag), is_causal=causal)
    _rows_as_one_process(got, want, w, xs, x, m, ring, rank, P, zigzag)


def _module(drop_in, dropout=0.0, **kw):
    if drop_in:
        return mha.torch.MultiheadAttention(8, 2, dropout=dropout, batch_first=True, **kw)
    m = mha.torch.MultiHeadAttention(8, 4, dropout, **kw)
    m(*[torch.zeros(1, 1, 8)] * 3)  # materialise the lazy projections
    return m


def _ring_dropout_case(rank, P, drop_in, zigzag):
    """Dropout in training mode: the ring drops what one process drops given the same seed (every
    weight's mask is keyed by its global (b, h, query, key) position)."""
    torch.manual_seed(21 + drop_in)
    B, L = 2, 4 * P
    m = _module(drop_in, dropout=0.4)
    ring = copy.deepcopy(m)
    x = torch.randn(B, L, 8, requires_grad=True)
    w = torch.randn(B, L, 8)
    sp = mtd.SequenceParallel(ring, zigzag=zigzag)
    xs = mtd.shard(x.detach(), 1, rank, P, zigzag).requires_grad_()
    torch.manual_seed(99)
    if drop_in:
        want, _ = m(x, x, x, need_weights=False, attn_mask=torch.triu(torch.ones(L, L, dtype=torch.bool), 1))
    else:
        want = m(x, x, x, torch.arange(1, L + 1, dtype=torch.float32).expand(B, L).contiguous())
    torch.manual_seed(99)
    got = sp(xs, xs, xs, is_causal=True)[0] if drop_in else sp(xs, xs, xs, causal=True)
    (want * w).sum().backward()
    _rows_as_one_process(got, want, w, xs, x, m, ring, rank, P, zigzag)
    # a different seed drops differently
    torch.manual_seed(100)
    other = sp(xs, xs, xs, is_causal=True)[0] if drop_in else sp(xs, xs, xs, causal=True)
    assert not torch.allclose(other, got)


def _ring_bf16_case(rank, P, drop_in):
    """The modules' bfloat16 mode (q, k, v rounded to bfloat16): the ring is within the mode's bound of
    the float64 attention with the same parameters."""
    torch.manual_seed(31 + drop_in)
    B, L = 2, 3 * P + 1
    m = _module(drop_in)
    m.precision = "bfloat16"
    x = torch.randn(B, L, 8)
    ref = copy.deepcopy(m)
    ref.precision = "float32"
    want = (ref(x, x, x, need_weights=False)[0] if drop_in else ref(x, x, x)).detach()
    xs = mtd.shard(x, 1, rank, P).requires_grad_()
    sp = mtd.SequenceParallel(m)
    got = sp(xs, xs, xs)[0] if drop_in else sp(xs, xs, xs)
    got.sum().backward()
    err = (got.detach() - mtd.shard(want, 1, rank, P)).abs().max().item()
    assert err <= 2 ** -6 * want.abs().max().item(), err  # q, k, v carry 8 significant bits
    assert torch.isfinite(xs.grad).all()
    # HeadParallel in bfloat16: within the same bound, and near the module's own bfloat16 call
    if m.num_heads % P == 0:
        one = m(x, x, x, need_weights=False)[0] if drop_in else m(x, x, x)
        hp = mtd.HeadParallel(m)
        got = hp(x, x, x, need_weights=False)[0] if drop_in else hp(x, x, x)
        for y in (got, one):
            assert (y - want).abs().max().item() <= 2 ** -6 * want.abs().max().item()


def _ring_fully_masked_case(rank, P):
    """Rows with no live key: the chapter's module averages every value (its -1e6 fill), the drop-in
    gives zeros; as one process, forward and backward."""
    torch.manual_seed(41)
    B, L = 3, 2 * P + 1
    for drop_in in (False, True):
        m = _module(drop_in)
        ring = copy.deepcopy(m)
        x = torch.randn(B, L, 8, requires_grad=True)
        w = torch.randn(B, L, 8)
        valid = torch.tensor([0, L, 2])
        xs = mtd.shard(x.detach(), 1, rank, P).requires_grad_()
        sp = mtd.SequenceParallel(ring)
        if drop_in:
            kpm = torch.arange(L)[None, :] >= valid[:, None]
            want, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False)
            got, _ = sp(xs, xs, xs, key_padding_mask=mtd.shard(kpm, 1, rank, P))
        else:
            want = m(x, x, x, valid)
            got = sp(xs, xs, xs, valid)
        (want * w).sum().backward()
        (got * mtd.shard(w, 1, rank, P)).sum().backward()
        torch.testing.assert_close(got, mtd.shard(want.detach(), 1, rank, P), **TOL)
        torch.testing.assert_close(xs.grad, mtd.shard(x.grad, 1, rank, P), **TOL)
        full = _params_grads(m)
        for n, g in _allreduced_grads(ring).items():
            torch.testing.assert_close(g, full[n], **TOL, msg=n)


def _ring_options_case(rank, P, drop_in, zigzag):
    """The ring's window (bottom right over GLOBAL positions), softcap, ALiBi (distances over global
    positions) and attention sinks (a learned Parameter: its gradient, summed over the ranks, is one
    process's), with causal masking and padding: as one process's module call with the same options,
    forward and backward."""
    torch.manual_seed(51 + 2 * drop_in + zigzag)
    B, L = 2, 6 * P
    m = _module(drop_in)
    H = m.num_heads
    ring = copy.deepcopy(m)
    x = torch.randn(B, L, 8, requires_grad=True)
    w = torch.randn(B, L, 8)
    slopes = torch.rand(H) * 0.5
    for window, causal, softcap, alibi, with_sinks in (((3, 1), False, 2.0, True, True),
                                                       ((4, 0), True, None, False, True),
                                                       ((-1, 2), False, 1.5, True, False),
                                                       (None, True, 3.0, True, True)):
        x.grad = None
        m.zero_grad()
        ring.zero_grad()
        s1 = torch.nn.Parameter(torch.randn(H)) if with_sinks else None
        s2 = torch.nn.Parameter(s1.detach().clone()) if with_sinks else None
        opts = dict(window=window, softcap=softcap, alibi_slopes=slopes if alibi else None)
        xs = mtd.shard(x.detach(), 1, rank, P, zigzag).requires_grad_()
        sp = mtd.SequenceParallel(ring, zigzag=zigzag)
        if drop_in:
            valid = torch.tensor([L, L - 3])
            kpm = torch.arange(L)[None, :] >= valid[:, None]
            am = torch.triu(torch.ones(L, L, dtype=torch.bool), 1) if causal else None
            want, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False, attn_mask=am, sinks=s1, **opts)
            got, _ = sp(xs, xs, xs, key_padding_mask=mtd.shard(kpm, 1, rank, P, zigzag), is_causal=causal,
                        sinks=s2, **opts)
        else:
            valid = torch.tensor([L, L - 3])
            q_lens = valid.float()[:, None].expand(B, L)
            if causal:
                q_lens = torch.minimum(q_lens, torch.arange(1, L + 1, dtype=torch.float32).expand(B, L))
            want = m(x, x, x, q_lens.contiguous(), sinks=s1, **opts)
            got = sp(xs, xs, xs, valid, causal=causal, sinks=s2, **opts)
        (want * w).sum().backward()
        _rows_as_one_process(got, want, w, xs, x, m, ring, rank, P, zigzag)
        if with_sinks:
            g = s2.grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(g, s1.grad, rtol=0, atol=1e-5)


def _ring_option_refusals(rank, P):
    """Bad window and score options are refused on every rank in the modules' words; all_gather
    refuses the position-dependent ones."""
    m = _module(False)
    xs = torch.randn(1, 2, 8)
    for kw, msg in ((dict(window=(-2, 0)), r"window: \(-2, 0\); wanted each side >= -1"),
                    (dict(window=3), r"window: got int, wanted None or a \(left, right\) pair"),
                    (dict(softcap=-1.0), "softcap: -1; wanted a finite number >= 0"),
                    (dict(alibi_slopes=[1.0]), "alibi_slopes: 1 values for 4 heads; wanted one finite slope per head"),
                    (dict(sinks=torch.tensor([0.0, float("nan"), 0.0, 0.0])), "sinks: .*wanted a finite logit per head")):
        with pytest.raises(ValueError, match=msg):
            mtd.SequenceParallel(m)(xs, xs, xs, **kw)
    with pytest.raises(ValueError, match="window: given with method='all_gather'"):
        mtd.SequenceParallel(m, method="all_gather")(xs, xs, xs, window=(1, 0))


def _same_as_one_process(want, got, w, x, x2, m, hp):
    """HeadParallel's output, input gradient and all-reduced parameter gradients against one process's."""
    (want * w).sum().backward()
    (got * w).sum().backward()
    torch.testing.assert_close(got, want.detach(), **TOL)
    torch.testing.assert_close(x2.grad, x.grad, **TOL)
    full = _params_grads(m)
    for n, g in _allreduced_grads(hp).items():
        torch.testing.assert_close(g, full[n], **TOL, msg=n)


def _subgroup_case(rank, P):
    """The ring over a subgroup (ranks 1 and P-1 of the world): point-to-point peers are named by
    their global ranks; the other ranks take no part."""
    group = dist.new_group([1, P - 1])  # every rank makes it
    if rank not in (1, P - 1):
        return
    r = 0 if rank == 1 else 1
    torch.manual_seed(71)
    m = _module(False)
    ring = copy.deepcopy(m)
    x = torch.randn(2, 9, 8, requires_grad=True)
    w = torch.randn(2, 9, 8)
    lens = torch.tensor([4, 9])
    want = m(x, x, x, lens)
    (want * w).sum().backward()
    xs = mtd.shard(x.detach(), 1, r, 2).requires_grad_()
    got = mtd.SequenceParallel(ring, group=group)(xs, xs, xs, lens)
    (got * mtd.shard(w, 1, r, 2)).sum().backward()
    torch.testing.assert_close(got, mtd.shard(want.detach(), 1, r, 2), **TOL)
    torch.testing.assert_close(xs.grad, mtd.shard(x.grad, 1, r, 2), **TOL)


def _sequence_first_and_empty_case(rank, P):
    """The drop-in with batch_first=False (blocks along dimension 0), and fewer positions than ranks
    (the last ranks hold none): forward and input gradients as one process."""
    torch.manual_seed(81)
    L = P - 1
    for drop_in in (False, True):
        if drop_in:
            m = mha.torch.MultiheadAttention(8, 2)
            x = torch.randn(L, 2, 8, requires_grad=True)
            want = m(x, x, x, need_weights=False, attn_mask=torch.triu(torch.ones(L, L, dtype=torch.bool), 1))[0]
            dim = 0
        else:
            m = _module(False)
            x = torch.randn(2, L, 8, requires_grad=True)
            want = m(x, x, x, torch.arange(1, L + 1, dtype=torch.float32).expand(2, L).contiguous())
            dim = 1
        w = torch.randn_like(want)
        (want * w).sum().backward()
        xs = mtd.shard(x.detach(), dim, rank, P).requires_grad_()
        sp = mtd.SequenceParallel(copy.deepcopy(m))
        got = sp(xs, xs, xs, is_causal=True)[0] if drop_in else sp(xs, xs, xs, causal=True)
        (got * mtd.shard(w, dim, rank, P)).sum().backward()
        torch.testing.assert_close(got, mtd.shard(want.detach(), dim, rank, P), **TOL)
        torch.testing.assert_close(xs.grad, mtd.shard(x.grad, dim, rank, P), **TOL)


def _head_case(rank, P, drop_in):
    torch.manual_seed(5 + drop_in)
    B, L, D = 2, 7, 8
    if drop_in:
        m = mha.torch.MultiheadAttention(D, 4, batch_first=True)
    else:
        m = mha.torch.MultiHeadAttention(D, 4, 0.0)
    x = torch.randn(B, L, D, requires_grad=True)
    if not drop_in:
        m(x, x, x)
    hp = copy.deepcopy(m)
    w = torch.randn(B, L, D)
    valid = torch.tensor([3, 7])
    x2 = x.detach().clone().requires_grad_()
    widths = []  # the projections this rank computes: its heads' rows only (Megatron's slices)
    plain = mtd._ring.project
    mtd._ring.project = lambda t, layer, bf16=False: (widths.append(layer[0].shape), plain(t, layer, bf16))[1]
    try:
        if drop_in:  # a padding mask and the causal limit
            kpm = torch.arange(L)[None, :] >= valid[:, None]
            want, _ = m(x, x, x, key_padding_mask=kpm, need_weights=False,
                        attn_mask=torch.triu(torch.ones(L, L, dtype=torch.bool), 1))
            got, _ = mtd.HeadParallel(hp)(x2, x2, x2, key_padding_mask=kpm, need_weights=False, is_causal=True)
        else:
            want = m(x, x, x, valid)
            got = mtd.HeadParallel(hp)(x2, x2, x2, valid)
    finally:
        mtd._ring.project = plain
    assert widths == [(D // P, D)] * 3 + [(D, D // P)], widths
    _same_as_one_process(want, got, w, x, x2, m, hp)


def _head_gated_case(rank, P):
    """A call the sliced heads do not run (the chapter's per-query lengths; the drop-in's attn_mask):
    the whole module with the other heads gated off, the same numbers."""
    torch.manual_seed(61)
    B, L = 2, 5
    for drop_in in (False, True):
        m = mha.torch.MultiheadAttention(8, 4, batch_first=True) if drop_in else _module(False)
        hp = copy.deepcopy(m)
        x = torch.randn(B, L, 8, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        w = torch.randn(B, L, 8)
        if drop_in:
            am = torch.rand(L, L) > 0.3
            am[:, 0] = False
            want = m(x, x, x, attn_mask=am, need_weights=False)[0]
            got = mtd.HeadParallel(hp)(x2, x2, x2, attn_mask=am, need_weights=False)[0]
        else:
            lens = torch.randint(1, L + 1, (B, L)).float()
            want, got = m(x, x, x, lens), mtd.HeadParallel(hp)(x2, x2, x2, lens)
        _same_as_one_process(want, got, w, x, x2, m, hp)


def _head_dropout_case(rank, P, drop_in):
    """HeadParallel in training mode with dropout: with one torch seed on every rank, the ranks drop
    what one process drops (the masks are keyed by the whole module's (b, h, query, key))."""
    torch.manual_seed(51 + drop_in)
    B, L = 2, 6
    m = mha.torch.MultiheadAttention(8, 4, dropout=0.5, batch_first=True) if drop_in else _module(False, 0.5)
    hp = copy.deepcopy(m)
    x = torch.randn(B, L, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    w = torch.randn(B, L, 8)
    torch.manual_seed(7)
    want = m(x, x, x, need_weights=False)[0] if drop_in else m(x, x, x)
    torch.manual_seed(7)
    got = mtd.HeadParallel(hp)(x2, x2, x2, need_weights=False)[0] if drop_in else mtd.HeadParallel(hp)(x2, x2, x2)
    _same_as_one_process(want, got, w, x, x2, m, hp)
    torch.manual_seed(8)
    assert not torch.allclose(m(x, x, x, need_weights=False)[0] if drop_in else m(x, x, x), want)


def _failures(rank, P, result_dir):
    m = mha.torch.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(1, 4, 8)
    bad = torch.randn(1, 4, 8, 1) if rank == 1 else x
    try:
        mtd.SequenceParallel(m)(bad, x, x)
        msg = "no error"
    except (ValueError, RuntimeError) as e:
        msg = str(e)
    with open(os.path.join(result_dir, f"checks{rank}"), "w") as f:
        f.write(msg)
    for what, call in (("disagree", lambda: mtd.SequenceParallel(m)(*[torch.randn(1 + rank, 4, 8)] * 3)),
                       ("share", lambda: mtd.HeadParallel(mha.torch.MultiHeadAttention(6, 3, 0.0))(x[..., :6], x[..., :6], x[..., :6])),
                       ("rng", lambda: (torch.manual_seed(rank),
                                        mtd.HeadParallel(_module(False, 0.5))(*[torch.ones(1, 3, 8)] * 3))),
                       # ranks passing other global lengths or options than rank 0
                       ("lens", lambda: mtd.SequenceParallel(m)(x, x, x, torch.tensor([3.0 + rank]))),
                       ("window", lambda: mtd.SequenceParallel(m)(x, x, x, window=(1 + rank, 0)))):
        with pytest.raises(ValueError) as e:
            call()
        with open(os.path.join(result_dir, f"{what}{rank}"), "w") as f:
            f.write(str(e.value))
    # rank 1 fails outside the call (never joins the all_gather): rank 0 must get an error, not hang
    if rank == 1:
        return
    start = time.monotonic()
    try:
        mtd.SequenceParallel(m)(x, x, x)
        msg = "no error"
    except RuntimeError as e:
        msg = f"{time.monotonic() - start:.1f} {e}"
    with open(os.path.join(result_dir, "absent0"), "w") as f:
        f.write(msg)


def worker(rank, P, port, result_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=P, timeout=datetime.timedelta(seconds=10))
    torch.set_num_threads(1)
    mha.set_num_threads(1)
    uneven = 4 * P + 3  # tensor_split's uneven blocks
    even = 4 * P        # zigzag: 2P chunks of 2
    for method in ("ring", "all_gather"):
        for L, causal, lens, zigzag in ((uneven, False, True, False), (uneven, True, True, False),
                                        (even, True, False, True), (even, True, True, True),
                                        (P - 1 + P, True, True, False)):
            _chapter_case(rank, P, L, causal, lens, zigzag, False, method)
            _drop_in_case(rank, P, L, causal, lens, zigzag, method)
        _chapter_case(rank, P, uneven, False, True, False, True, method)
    for drop_in in (False, True):
        for zigzag in (False, True):
            _ring_dropout_case(rank, P, drop_in, zigzag)
        _ring_bf16_case(rank, P, drop_in)
    _ring_fully_masked_case(rank, P)
    for drop_in in (False, True):
        for zigzag in (False, True):
            _ring_options_case(rank, P, drop_in, zigzag)
    _ring_option_refusals(rank, P)
    if P == 4:
        _subgroup_case(rank, P)
    _sequence_first_and_empty_case(rank, P)
    _head_case(rank, P, drop_in=False)
    if 4 % P == 0:
        _head_case(rank, P, drop_in=True)
        _head_dropout_case(rank, P, drop_in=False)
        _head_dropout_case(rank, P, drop_in=True)
        _head_gated_case(rank, P)
    if P == 2:
        _failures(rank, P, result_dir)
        if rank == 1:
            time.sleep(1)  # let rank 0 reach the all_gather before this process goes away
            return
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch without Gloo")
@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_and_head_parallel_equal_one_process(world_size, tmp_path):
    mp.spawn(worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size, join=True)
    if world_size != 2:
        return
    bad, good = (tmp_path / "checks1").read_text(), (tmp_path / "checks0").read_text()
    assert "queries" in bad and "wanted a tensor (B, L_rank, D)" in bad
    assert "rank(s) [1] of 2 failed their checks" in good
    for r in (0, 1):
        assert "the ranks' blocks disagree: [1, 2]" in (tmp_path / f"disagree{r}").read_text()
        assert "num_heads: 3 is not divisible by the group's 2 ranks" in (tmp_path / f"share{r}").read_text()
        assert "dropout: the ranks' torch generators differ" in (tmp_path / f"rng{r}").read_text()
        for what in ("lens", "window"):
            assert "valid_lens / options: ranks [1] passed other values than rank 0" in \
                (tmp_path / f"{what}{r}").read_text()
    seconds, _, err = (tmp_path / "absent0").read_text().partition(" ")
    assert err and err != "error", err
    assert float(seconds) < 30


def test_shard_unshard_and_refusals():
    x = torch.arange(24.0).reshape(1, 24, 1)
    for P in (2, 3, 4):
        for zz in (False, True):
            blocks = [mtd.shard(x, 1, r, P, zz) for r in range(P)]
            assert torch.equal(mtd.unshard(blocks, 1, zz), x)
    assert mtd.shard(x, 1, 1, 2, True).flatten().tolist() == list(range(6, 12)) + list(range(12, 18))
    with pytest.raises(ValueError, match=r"shard\] zigzag: length 10 is not divisible by 2 \* world_size \(4\)"):
        mtd.shard(torch.zeros(1, 10), 1, 0, 2, True)
    with pytest.raises(TypeError, match="attention: got Linear"):
        mtd.SequenceParallel(torch.nn.Linear(2, 2))
