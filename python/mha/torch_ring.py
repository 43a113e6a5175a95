"""The ring of mha.torch.distributed.SequenceParallel(method="ring") (internal).

Each rank projects its own rows (q, k, v with the module's current parameters, torch.nn.functional.linear),
then the key/value blocks travel round the ring of the group's ranks with torch.distributed's point-to-point
isend/irecv (rank r sends to r + 1, receives from r - 1) while mha's fused kernel runs this rank's queries on
the block it holds (python/bindings/ring_calls.cpp, src/nn/ring_rows.h); the blocks' softmaxes merge into one over
every key. Backward: the blocks travel again, each with the sum of its key and value gradients so far, which
reaches the block's owner after the last step. A rank holds two key/value blocks at a time (the one computed
on and the one arriving), never the whole sequence's.
"""
import math

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import _checks, _core
from ._attention_glue import softcap_value
from ._torch_call import _alibi_numpy, _call_sinks
from .torch_drop_in import _drop_in_split

_calls = _core._ring_calls
_TAG_KV, _TAG_GRAD = 1000, 2000000


class Plan:
    """Who holds what: rank, P, the group's global ranks, every rank's pieces [(begin, size)] of global
    positions (its rows in order), B, H, d, the sequence length. keys: (K, [pieces]) when the keys are
    not the queries' positions (one block: head parallelism's whole sequence on one rank)."""

    def __init__(self, group, rank, P, pieces, B, H, d, length, keys=None):
        self.group, self.rank, self.P = group, rank, P
        self.B, self.H, self.d = B, H, d
        self.Q, self.q_pieces = length, pieces[rank]
        self.K, self.pieces = (length, pieces) if keys is None else keys
        self.sizes = [sum(n for _, n in p) for p in self.pieces]
        if group is None:
            self.ranks = list(range(P))
        else:
            c10d = dist.distributed_c10d
            global_rank = getattr(c10d, "get_global_rank", None) or c10d._get_global_rank  # torch >= 2.0 / 1.13
            self.ranks = [global_rank(group, r) for r in range(P)]

    def elems(self, owner):
        return self.B * self.sizes[owner] * self.H * self.d

    def exchange(self, send, recv, tag):
        """Posts the sends of `send` to rank + 1 and the receives of `recv` from rank - 1."""
        nxt, prv = self.ranks[(self.rank + 1) % self.P], self.ranks[(self.rank - 1) % self.P]
        reqs = [dist.isend(t, nxt, group=self.group, tag=tag + i) for i, t in enumerate(send)]
        reqs += [dist.irecv(t, prv, group=self.group, tag=tag + i) for i, t in enumerate(recv)]
        return reqs


def _wait(reqs):
    for r in reqs:
        r.wait()


class _RingCore(torch.autograd.Function):
    """(q (B, Q_r, H*d), k, v (B, K_r, H*d)) this rank's projections -> (B, Q_r, H*d) its rows of the
    attention output over every rank's keys."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, plan, masks):
        P, r = plan.P, plan.rank
        sinks_np = None if sinks is None else np.ascontiguousarray(sinks.detach().numpy(), np.float32)
        call = _calls.RingCall(plan.B, plan.H, plan.d, plan.Q, plan.K, plan.q_pieces, sinks=sinks_np, **masks)
        call.begin_forward(q.detach().numpy())
        kb, vb = k.detach().reshape(-1), v.detach().reshape(-1)
        for step in range(P):
            owner = (r - step) % P
            reqs = []
            if step + 1 < P:  # the next block arrives while this one is computed on
                n = plan.elems((r - step - 1) % P)
                kn, vn = torch.empty(n), torch.empty(n)
                reqs = plan.exchange((kb, vb), (kn, vn), _TAG_KV + 2 * step)
            call.add_block(kb.numpy(), vb.numpy(), plan.pieces[owner])
            if step + 1 < P:
                _wait(reqs)
                kb, vb = kn, vn
        out = torch.from_numpy(call.finish())
        ctx.call, ctx.plan, ctx.sinks_dtype = call, plan, None if sinks is None else sinks.dtype
        ctx.save_for_backward(q, k, v)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        call, plan = ctx.call, ctx.plan
        P, r = plan.P, plan.rank
        call.begin_backward(q.detach().numpy(), g.contiguous().numpy())
        kb, vb = k.detach().reshape(-1), v.detach().reshape(-1)
        sending = []  # the previous step's gradients on their way to rank r + 1
        mine = None
        for step in range(P):
            owner = (r - step) % P
            n = plan.elems(owner)
            kv_reqs = []
            if step + 1 < P:
                m = plan.elems((r - step - 1) % P)
                kn, vn = torch.empty(m), torch.empty(m)
                kv_reqs = plan.exchange((kb, vb), (kn, vn), _TAG_KV + 2 * step)
            g_in = []
            if step > 0:  # this block's gradients so far, from the ranks that had it before
                dk_in, dv_in = torch.empty(n), torch.empty(n)
                g_in = plan.exchange((), (dk_in, dv_in), _TAG_GRAD + 2 * step)
            dk, dv = torch.empty(n), torch.empty(n)
            call.backward_block(kb.numpy(), vb.numpy(), plan.pieces[owner], dk.numpy(), dv.numpy())
            if step > 0:
                _wait(g_in)
                dk += dk_in
                dv += dv_in
            _wait(sending)  # posted after this step's receives: no rank waits round the whole ring
            if P > 1:  # pass the block's gradients on; after the last step they reach its owner
                sending = plan.exchange((dk, dv), (), _TAG_GRAD + 2 * (step + 1))
            if step + 1 < P:
                _wait(kv_reqs)
                kb, vb = kn, vn
            if P == 1:
                mine = (dk, dv)
            elif step + 1 == P:  # this rank's own block comes back from rank r - 1
                mine = (torch.empty(plan.elems(r)), torch.empty(plan.elems(r)))
                _wait(plan.exchange((), mine, _TAG_GRAD + 2 * P))
        _wait(sending)
        # This rank's rows' share of d sinks: as the parameters' gradients, the sum over the ranks is
        # one process's (all-reduce them, as DDP does).
        dsinks = None
        if ctx.sinks_dtype is not None:
            dsinks = torch.tensor(call.sinks_grad_share(), dtype=torch.float64).to(ctx.sinks_dtype)
        dq = torch.from_numpy(call.grad_q())
        ctx.call = None
        shape = k.shape
        return dq, mine[0].view(shape), mine[1].view(shape), dsinks, None, None


class _RoundBF16(torch.autograd.Function):
    """Rounds to the nearest bfloat16 value, kept in float32; the gradient passes unrounded (the
    modules' bfloat16 mode keeps gradients float32)."""

    @staticmethod
    def forward(ctx, t):
        return t.to(torch.bfloat16).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        return g


def attention(plan, q, k, v, masks, bfloat16, first_head=0, all_heads=0, sinks=None):
    """The ring's attention on this rank's projections (B, L_r, H*d) -> (B, L_r, H*d). first_head,
    all_heads: these heads' place among the module's (for dropout, ALiBi and sinks), 0, 0: all of
    them. sinks: None or the module's (all_heads,) float32 tensor (its gradient flows)."""
    if bfloat16:  # the module's bfloat16 mode: q, k, v hold bfloat16 values
        q, k, v = _RoundBF16.apply(q), _RoundBF16.apply(k), _RoundBF16.apply(v)
    return _RingCore.apply(q.contiguous(), k.contiguous(), v.contiguous(), sinks, plan,
                           dict(masks, bfloat16=bfloat16, first_head=first_head, all_heads=all_heads))


def score_options(op, num_heads, window=None, softcap=None, alibi_slopes=None, sinks=None):
    """The ring's window and score options, checked in the modules' words: (options for the compute,
    the sinks tensor or None). window: None or (left, right) over GLOBAL positions, bottom right as
    the modules' (each side an integer >= -1, -1 unbounded); softcap: None or a number >= 0;
    alibi_slopes, sinks: one finite value per head (distances over global positions)."""
    out = {}
    if window is not None:
        if isinstance(window, (str, bytes)) or not hasattr(window, "__len__") or len(window) != 2:
            raise _checks.wrong_kind(op, "window", window, "None or a (left, right) pair of integers >= -1")
        left, right = (_checks.integer(w, op, "window") for w in window)
        if left < -1 or right < -1:
            raise ValueError(f"[{op}] window: ({left}, {right}); wanted each side >= -1 (-1: unbounded)")
        out["window"] = (left, right)
    cap = softcap_value(op, softcap)
    if cap > 0:
        out["softcap"] = cap
    if alibi_slopes is not None:
        a = _checks.real_array(_alibi_numpy(op, alibi_slopes), op, "alibi_slopes").astype(np.float32).reshape(-1)
        if a.shape != (num_heads,) or not np.isfinite(a).all():
            raise ValueError(f"[{op}] alibi_slopes: {a.size} values{'' if np.isfinite(a).all() else ' (not all finite)'} "
                             f"for {num_heads} heads; wanted one finite slope per head")
        out["alibi_slopes"] = a
    sinks = _call_sinks(op, sinks, num_heads)
    if sinks is not None and not all(math.isfinite(x) for x in sinks.detach().tolist()):
        raise ValueError(f"[{op}] sinks: {sinks.detach().tolist()}; wanted a finite logit per head")
    return out, sinks


def chapter_layers(m):
    """The chapter's module's (weight, bias) of W_q, W_k, W_v, W_o, read now (replaced Parameters too)."""
    return [(layer.weight, layer.bias) for layer in (m.W_q, m.W_k, m.W_v, m.W_o)]


def drop_in_layers(m):
    proj, _, _ = _drop_in_split(m._named_params(), m.embed_dim)
    return proj


def project(x, layer, bfloat16=False):
    """x W^T + b; in the bfloat16 mode x and W rounded to bfloat16 first (the products of mha's
    bfloat16 mode: bfloat16 factors, float32 sums)."""
    w, b = layer
    if bfloat16:
        x, w = _RoundBF16.apply(x), _RoundBF16.apply(w)
    return F.linear(x, w, b)
