"""mha.torch.distributed: attention over a torch.distributed process group.

Two wrappers around an mha.torch attention module (the d2l chapter's
mha.torch.MultiHeadAttention or the drop-in mha.torch.MultiheadAttention),
in the style of torch's DistributedDataParallel (wrap a module, name a group):

SequenceParallel(attention, group=None, zigzag=False, method="ring")
    Each rank holds its block of the sequence (queries, keys, values) and gets its rows of the
    output. method="ring" (the default): each rank projects its own rows, then the projected key/value
    blocks travel round the group's ranks (torch.distributed isend/irecv, rank r to r + 1) while mha's
    fused kernel runs the rank's queries on the block it holds, and the blocks' softmaxes merge into
    one (python/mha/torch_ring.py); a rank holds two blocks at a time, never the whole sequence.
    Backward: the blocks travel again, each with its key/value gradients summed so far, which reach
    the block's owner. Dropout in training mode is keyed by each weight's global (b, h, query, key)
    position, so the ranks drop what one process drops (every rank takes rank 0's key); the module's
    bfloat16 mode rounds q, k, v as it does. method="all_gather": every call all-gathers the key and
    value blocks (one all_gather each) and runs the inner module on the rank's queries against the
    whole sequence (no dropout; any module options the inner module takes).
    Valid lengths, the causal mask and, with the ring, window=, softcap=, alibi_slopes= and sinks=
    (as the modules take them) are over GLOBAL positions (never an L x L mask). zigzag=True:
    each rank holds chunks r and 2P-1-r of 2P equal chunks (shard(..., zigzag=True)), which balances
    causal work.

HeadParallel(attention, group=None)
    Megatron style: every rank holds the whole sequence; rank r computes heads
    [r*h/P, (r+1)*h/P) alone (its rows of W_q, W_k, W_v, its columns of W_o)
    and one all-reduce after W_o sums the ranks' outputs. A call with what
    that path does not run (the chapter's per-query lengths or options, an
    attn_mask, head gates, rotary, extra key/value biases, a pruned drop-in)
    runs the whole module on every rank with the other ranks' heads gated off
    (the call's head_mask): the same numbers, without the saving.
    Backward: the input gradient is all-reduced; parameter gradients are each
    rank's share (all-reduce them, as DDP does, for one process's gradients).
    Dropout: every rank runs the whole module's call, whose masks are keyed by
    (b, h, query, key), so with the same torch generator state on every rank
    (checked) the ranks drop what one process drops.

shard(x, dim, rank, world_size, zigzag=False) / unshard(blocks, dim, zigzag)
    this rank's block of a whole-sequence tensor and back (uneven lengths:
    torch.tensor_split's, the first L % P ranks get one more position).

Not here: dropout in training mode for method="all_gather" (refused: the inner
call's dropout mask is not keyed by global positions); the ring runs the modules' plain projections
(no head_gates, rotary, bias_k/bias_v, add_zero_attn or pruned drop-in: refused; use all_gather).
See docs/distributed.md.
"""
import zlib

import torch
import torch.distributed as dist
from torch import nn

from . import _checks, _core
from ._torch_call import _check_input, _dropout_key
from .torch_chapter import MultiHeadAttention
from .torch_drop_in import MultiheadAttention
from . import torch_ring as _ring

__all__ = ["SequenceParallel", "HeadParallel", "shard", "unshard"]


def _world(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _chunks(length, world_size, zigzag):
    """The (start, size) of each rank's pieces of a sequence of `length` positions."""
    if not zigzag:
        sizes = [len(r) for r in torch.arange(length).tensor_split(world_size)]
        starts = [sum(sizes[:i]) for i in range(world_size)]
        return [[(s, n)] for s, n in zip(starts, sizes)]
    c = length // (2 * world_size)
    return [[(r * c, c), ((2 * world_size - 1 - r) * c, c)] for r in range(world_size)]


def shard(x, dim, rank, world_size, zigzag=False):
    """This rank's block of x (the whole sequence along dim): positions tensor_split gives rank
    `rank`, or with zigzag chunks rank and 2P-1-rank of 2P equal chunks (length divisible by 2P)."""
    op = "mha.torch.distributed.shard"
    if not isinstance(x, torch.Tensor):
        raise _checks.wrong_kind(op, "x", x, "a torch.Tensor")
    world_size = _checks.integer(world_size, op, "world_size")
    rank = _checks.integer(rank, op, "rank")
    dim = _checks.integer(dim, op, "dim")
    if world_size < 1:
        raise ValueError(f"[{op}] world_size: {world_size}; wanted the group's size, at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"[{op}] rank: {rank}; wanted a rank of the group, 0 to {world_size - 1}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"[{op}] dim: {dim} for a tensor of {x.dim()} dimensions; wanted the sequence's "
                         f"dimension, -{x.dim()} to {x.dim() - 1}")
    length = x.shape[dim]
    if zigzag and length % (2 * world_size):
        raise ValueError(f"[{op}] zigzag: length {length} is not divisible by 2 * world_size "
                         f"({2 * world_size}); wanted 2P equal chunks")
    return torch.cat([x.narrow(dim, s, n) for s, n in _chunks(length, world_size, zigzag)[rank]], dim)


def unshard(blocks, dim, zigzag=False):
    """The whole sequence from every rank's block (the inverse of shard)."""
    P = len(blocks)
    if not zigzag:
        return torch.cat(blocks, dim)
    c = blocks[0].shape[dim] // 2
    pieces = [None] * (2 * P)
    for r, b in enumerate(blocks):
        pieces[r], pieces[2 * P - 1 - r] = b.narrow(dim, 0, c), b.narrow(dim, c, c)
    return torch.cat(pieces, dim)


class _Gather(torch.autograd.Function):
    """(..., n_rank, ...) blocks along dim -> the whole sequence, in global order.
    Backward: all-reduce the whole gradient, keep this rank's rows."""

    @staticmethod
    def forward(ctx, x, dim, sizes, order, group, rank):
        ctx.dim, ctx.sizes, ctx.order, ctx.group, ctx.rank = dim, sizes, order, group, rank
        m = max(sizes)
        pad = list(x.shape)
        pad[dim] = m - x.shape[dim]
        padded = torch.cat([x, x.new_zeros(pad)], dim).contiguous() if pad[dim] else x.contiguous()
        out = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(out, padded, group=group)
        whole = torch.cat([t.narrow(dim, 0, n) for t, n in zip(out, sizes)], dim)
        return whole if order is None else whole.index_select(dim, order)

    @staticmethod
    def backward(ctx, g):
        if ctx.order is not None:  # back to rank order
            g = torch.zeros_like(g).index_copy_(ctx.dim, ctx.order, g)
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        start = sum(ctx.sizes[:ctx.rank])
        return g.narrow(ctx.dim, start, ctx.sizes[ctx.rank]), None, None, None, None, None


class _SumOutputs(torch.autograd.Function):
    """Forward: all-reduce (sum) the ranks' partial outputs; backward: identity."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.contiguous().clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


class _SumInputGrads(torch.autograd.Function):
    """Forward: identity; backward: all-reduce (sum) the ranks' partial input gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g, group=ctx.group)
        return g, None


def _agree(op, group, rank, world_size, local_error, facts):
    """Exchange (ok, *facts) among the ranks so that a rank's failed check is an error on EVERY
    rank (not a hang in the next collective). Returns the facts of every rank ([P, len(facts)])."""
    row = torch.tensor([0 if local_error is None else 1] + [int(f) for f in facts], dtype=torch.int64)
    rows = [torch.empty_like(row) for _ in range(world_size)]
    dist.all_gather(rows, row, group=group)
    rows = torch.stack(rows)
    failed = [r for r in range(world_size) if rows[r, 0]]
    if local_error is not None:
        raise local_error
    if failed:
        raise RuntimeError(f"[{op}] rank(s) {failed} of {world_size} failed their checks of this call "
                           f"(their errors say why); rank {rank} stops too")
    return rows[:, 1:]


def _what(t):
    return f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def _check_blocks(op, named, wanted, seq_dim):
    """This rank's (name, tensor) blocks of queries, keys and values: 3-D tensors of the modules'
    dtypes and device, the same positions (along seq_dim) in all three."""
    for name, t in named:
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"[{op}] {name}: got {_what(t)}; wanted {wanted}")
        _check_input(t, op, name, (3,))  # the modules' dtype and device checks
    (qn, q), (kn, k), (vn, v) = named
    if q.shape[seq_dim] != k.shape[seq_dim] or k.shape[:2] != v.shape[:2]:
        raise ValueError(f"[{op}] {qn} {tuple(q.shape)}, {kn} {tuple(k.shape)}, {vn} {tuple(v.shape)}: wanted this "
                         "rank's block of the same positions in all three")


def _check_widths(op, a, named):
    """The inputs' last dimension against the module's input widths (the drop-in's embed_dim, kdim,
    vdim; the chapter's built W_q, W_k, W_v), in the modules' words: not torch's 'mat1 and mat2
    shapes cannot be multiplied' from a projection."""
    if isinstance(a, MultiHeadAttention):
        layers = (a.W_q, a.W_k, a.W_v)
        wanted = [None if isinstance(l, nn.modules.lazy.LazyModuleMixin) and l.has_uninitialized_params()
                  else l.weight.shape[1] for l in layers]
        owner = ("W_q", "W_k", "W_v")
    else:
        wanted = [a.embed_dim, a.kdim, a.vdim]
        owner = ("embed_dim", "kdim", "vdim")
    for (name, t), w, o in zip(named, wanted, owner):
        if w is not None and t.shape[-1] != w:
            raise ValueError(f"[{op}] {name}: width {t.shape[-1]} (shape {tuple(t.shape)}); the module's {o} "
                             f"takes {w}")


def _check_lengths(op, valid_lens, B):
    """valid_lens None or (B,) numbers >= 0 over global key positions, as the modules check them."""
    if valid_lens is None:
        return
    if not isinstance(valid_lens, torch.Tensor) or valid_lens.dim() != 1 or valid_lens.shape[0] != B:
        raise ValueError(f"[{op}] valid_lens: got {_what(valid_lens)}; wanted None "
                         "or (B,) lengths over global key positions")
    if valid_lens.dtype == torch.bool or valid_lens.is_complex():
        raise TypeError(f"[{op}] valid_lens: dtype {valid_lens.dtype}; wanted integer or floating lengths")
    lens = valid_lens.detach().double()
    for i, n in enumerate(lens.tolist()):
        if n != n:
            raise ValueError(f"[{op}] valid_lens: entry {i} is NaN; lengths must be numbers >= 0")
        if n < 0:
            raise ValueError(f"[{op}] valid_lens: entry {i} is {n:g}; lengths must be >= 0")


def _call_digest(*values):
    """A CRC32 of what every rank must pass alike (global lengths, options, sinks): compared by _layout."""
    crc = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            data = v.detach().cpu().contiguous().numpy().tobytes() + str(v.dtype).encode()
        else:
            data = repr(v).encode()
        crc = zlib.crc32(data, crc)
    return crc


def _refuse_dropout(op, attention):
    p = attention.attention.dropout.p if isinstance(attention, MultiHeadAttention) else attention.dropout
    if attention.training and p > 0:
        raise ValueError(f"[{op}] dropout: {p} in training mode; wanted 0 (the inner call's dropout mask is not "
                         "keyed by global positions, so ranks would not equal one process): call eval() or "
                         "set the dropout to 0")


def _check_attention(op, attention):
    if not isinstance(attention, (MultiHeadAttention, MultiheadAttention)):
        raise TypeError(f"[{op}] attention: got {type(attention).__name__}, wanted mha.torch.MultiHeadAttention "
                        "or mha.torch.MultiheadAttention")


class SequenceParallel(nn.Module):
    """Sequence (context) parallel attention: see the module's docstring.

    Chapter's module inside: forward(queries (B, Q_r, Dq), keys (B, K_r, Dk), values (B, K_r, Dv),
    valid_lens None|(B,) over global key positions, *, causal=False, window=None, softcap=None,
    alibi_slopes=None, sinks=None) -> (B, Q_r, num_hiddens).
    Drop-in inside: forward(query, key, value, key_padding_mask=None (B, K_r), need_weights=False,
    attn_mask=None (refused), is_causal=False, *, window=None, softcap=None, alibi_slopes=None,
    sinks=None) -> (attn_output, None); blocks along the drop-in's
    sequence dimension (1 with batch_first, else 0). Queries and keys of a rank cover the same
    positions (self-attention layout); every rank must call forward (and backward) together.
    """

    def __init__(self, attention, group=None, zigzag=False, method="ring"):
        super().__init__()
        op = "mha.torch.distributed.SequenceParallel"
        _check_attention(op, attention)
        if method not in ("ring", "all_gather"):
            raise ValueError(f"[{op}] method: {method!r}; wanted 'ring' (key/value blocks passed round the "
                             "ranks) or 'all_gather' (every rank gathers the whole sequence's keys and values)")
        self.attention = attention
        self.group = group
        self.zigzag = bool(zigzag)
        self.method = method

    def _layout(self, op, local_len, local_error, extra=(), key=0, same=0):
        """Every rank's block length, this rank's global positions and the gather order; key: this
        rank's dropout key, of which every rank takes rank 0's (self.key); same: the digest of what
        every rank must pass alike (_call_digest)."""
        rank, P = _world(self.group)
        facts = _agree(op, self.group, rank, P, local_error, (local_len, key, same) + tuple(extra))
        sizes = [int(s) for s in facts[:, 0]]
        call_key = int(facts[0, 1])
        digests = facts[:, 2].tolist()
        if len(set(digests)) != 1:
            raise ValueError(f"[{op}] valid_lens / options: ranks {[r for r in range(P) if digests[r] != digests[0]]} "
                             "passed other values than rank 0; wanted the same global lengths, window, softcap, "
                             "alibi_slopes and sinks on every rank")
        facts = torch.cat([facts[:, :1], facts[:, 3:]], 1)
        for j in range(1, facts.shape[1]):
            if len(set(facts[:, j].tolist())) != 1:
                raise ValueError(f"[{op}] the ranks' blocks disagree: {facts[:, j].tolist()} "
                                 "(batch size and widths must be equal on every rank)")
        if self.zigzag and len(set(sizes)) != 1 or self.zigzag and sizes[0] % 2:
            raise ValueError(f"[{op}] zigzag: block lengths {sizes}; wanted equal even lengths "
                             "(chunks r and 2P-1-r of 2P equal chunks)")
        length = sum(sizes)
        pieces = _chunks(length, P, self.zigzag)
        # global positions of each rank's rows, in rank order
        pos = torch.cat([torch.cat([torch.arange(s, s + n) for s, n in pieces[r]]) for r in range(P)])
        order = torch.argsort(pos) if self.zigzag else None
        return rank, P, sizes, pos[sum(sizes[:rank]):sum(sizes[:rank + 1])], order, call_key

    def _gather(self, x, dim, sizes, order, rank):
        return _Gather.apply(x, dim, sizes, order, self.group, rank)

    def forward(self, *args, **kwargs):
        if isinstance(self.attention, MultiHeadAttention):
            return self._chapter(*args, **kwargs)
        return self._drop_in(*args, **kwargs)

    def _chapter(self, queries, keys, values, valid_lens=None, *, causal=False, window=None, softcap=None,
                 alibi_slopes=None, sinks=None):
        op = "mha.torch.distributed.SequenceParallel"
        err = None
        ring = {}
        try:
            ring = self._call_options(op, self.attention, window, softcap, alibi_slopes, sinks)
            named = (("queries", queries), ("keys", keys), ("values", values))
            _check_blocks(op, named, "a tensor (B, L_rank, D)", 1)
            _check_widths(op, self.attention, named)
            _check_lengths(op, valid_lens, queries.shape[0])
        except (ValueError, TypeError) as e:
            err = e
        shape = (0, 0, 0, 0) if err else (queries.shape[0], queries.shape[2], keys.shape[2], values.shape[2])
        same = 0 if err else _call_digest(valid_lens, bool(causal), window, softcap, alibi_slopes, sinks)
        rank, P, sizes, pos, order, dkey = self._layout(op, 0 if err else queries.shape[1], err, shape,
                                                        ring.get("dropout_key", 0), same)
        if self.method == "ring":
            ring["dropout_key"] = dkey
            return self._ring_chapter(queries, keys, values, valid_lens, causal, (rank, P, sizes), ring)
        k = self._gather(keys, 1, sizes, order, rank)
        v = k if values is keys else self._gather(values, 1, sizes, order, rank)
        B = queries.shape[0]
        lens = None
        if causal:
            lens = (pos + 1).to(torch.float32).expand(B, -1)
        if valid_lens is not None:
            vl = valid_lens.to(torch.float32)[:, None].expand(B, pos.shape[0])
            lens = vl if lens is None else torch.minimum(lens, vl)
        if lens is not None:
            lens = lens.contiguous()
        return self.attention(queries, k, v, lens, softcap=softcap, sinks=sinks)

    def _call_options(self, op, a, window, softcap, alibi_slopes, sinks):
        """The call's checks of the module and its options: for the ring, its dropout (p, this rank's
        key) and score options (torch_ring.score_options); all_gather runs the inner module on
        whole-sequence keys, which takes softcap and sinks but not a window or ALiBi over this
        rank's rows."""
        if self.method == "ring":
            p, dkey = _ring_checks(op, a)
            options, sinks = _ring.score_options(op, a.num_heads, window, softcap, alibi_slopes, sinks)
            return dict(options, dropout_p=p, dropout_key=dkey, sinks=sinks)
        _refuse_dropout(op, a)
        for name, value in (("window", window), ("alibi_slopes", alibi_slopes)):
            if value is not None:
                raise ValueError(f"[{op}] {name}: given with method='all_gather', whose inner call sees this "
                                 "rank's rows as the first queries; wanted method='ring' (global positions)")
        return {}

    def _drop_in(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None,
                 is_causal=False, *, window=None, softcap=None, alibi_slopes=None, sinks=None):
        op = "mha.torch.distributed.SequenceParallel"
        a = self.attention
        sd = 1 if a.batch_first else 0
        err = None
        ring = {}
        try:
            ring = self._call_options(op, a, window, softcap, alibi_slopes, sinks)
            if key_padding_mask is not None and (not isinstance(key_padding_mask, torch.Tensor)
                                                 or key_padding_mask.dtype != torch.bool):
                raise ValueError(f"[{op}] key_padding_mask: got {_what(key_padding_mask)}"
                                 f"{'' if not isinstance(key_padding_mask, torch.Tensor) else ' ' + str(key_padding_mask.dtype)}; "
                                 "wanted None or a boolean (B, L_rank) tensor, True = masked")
            if attn_mask is not None:
                raise ValueError(f"[{op}] attn_mask: wanted None (pass is_causal=True and key_padding_mask; "
                                 "a mask over this rank's rows and all keys is not split here)")
            if need_weights:
                raise ValueError(f"[{op}] need_weights: True; wanted False (each rank has only its rows' weights)")
            named = (("query", query), ("key", key), ("value", value))
            _check_blocks(op, named, "a batched tensor (3 dimensions)", sd)
            _check_widths(op, a, named)
            if key_padding_mask is not None and tuple(key_padding_mask.shape) != (key.shape[1 - sd], key.shape[sd]):
                raise ValueError(f"[{op}] key_padding_mask: shape {tuple(key_padding_mask.shape)}; wanted "
                                 f"(B, L_rank) = {(key.shape[1 - sd], key.shape[sd])}, this rank's keys")
        except (ValueError, TypeError) as e:
            err = e
        shape = (0, 0, 0, 0) if err else (query.shape[1 - sd], query.shape[2], key.shape[2], value.shape[2])
        same = 0 if err else _call_digest(bool(is_causal), window, softcap, alibi_slopes, sinks)
        rank, P, sizes, pos, order, dkey = self._layout(op, 0 if err else query.shape[sd], err, shape,
                                                        ring.get("dropout_key", 0), same)
        if self.method == "ring":
            ring["dropout_key"] = dkey
            return self._ring_drop_in(query, key, value, key_padding_mask, is_causal, (rank, P, sizes, order), ring)
        k = self._gather(key, sd, sizes, order, rank)
        v = k if value is key else self._gather(value, sd, sizes, order, rank)
        kpm = None
        if key_padding_mask is not None:
            kpm = _Gather.apply(key_padding_mask.to(torch.float32), 1, sizes, order, self.group, rank) > 0.5
        mask = None
        if is_causal:  # (Q_rank, L) True = masked: keys after the query's global position
            mask = torch.arange(k.shape[sd])[None, :] > pos[:, None]
        out, _ = a(query, k, v, key_padding_mask=kpm, need_weights=False, attn_mask=mask, softcap=softcap, sinks=sinks)
        return out, None


    def _ring_plan(self, rank, P, sizes, B, H, d):
        length = sum(sizes)
        if self.zigzag:
            pieces = _chunks(length, P, True)
        else:
            pieces = [[(sum(sizes[:o]), sizes[o])] for o in range(P)]
        return _ring.Plan(self.group, rank, P, pieces, B, H, d, length)

    def _ring_chapter(self, queries, keys, values, valid_lens, causal, layout, ring):
        """layout: (rank, P, sizes); ring: _call_options' dropout and score options."""
        rank, P, sizes = layout
        a = self.attention
        a._materialise(queries, keys, values)
        layers = _ring.chapter_layers(a)
        d = a.num_hiddens // a.original_num_heads
        plan = self._ring_plan(rank, P, sizes, queries.shape[0], layers[0][0].shape[0] // d, d)
        lens = None if valid_lens is None else valid_lens.detach().to(torch.float32).numpy()
        sinks = ring.pop("sinks")
        # the chapter's -1e6 fill, or -inf under a window (as the module's own call)
        masks = dict(ring, lens=lens, causal=bool(causal), seed_fill="window" not in ring, zeros=False)
        dtype = queries.dtype
        bf16 = a.precision == "bfloat16" or dtype == torch.bfloat16
        x = [t.to(torch.float32) for t in (queries, keys, values)]
        q, k, v = (_ring.project(t, layer, bf16) for t, layer in zip(x, layers[:3]))
        heads = _ring.attention(plan, q, k, v, masks, bf16, sinks=sinks)
        return _ring.project(heads, layers[3], bf16).to(dtype)

    def _ring_drop_in(self, query, key, value, key_padding_mask, is_causal, layout, ring):
        """layout: (rank, P, sizes, order); ring: _call_options' dropout and score options."""
        rank, P, sizes, order = layout
        a = self.attention
        first = (lambda t: t) if a.batch_first else (lambda t: t.transpose(0, 1))
        dtype = query.dtype
        x = [first(t).to(torch.float32) for t in (query, key, value)]
        layers = _ring.drop_in_layers(a)
        d = a.head_dim
        plan = self._ring_plan(rank, P, sizes, x[0].shape[0], a.num_heads, d)
        keep = None
        if key_padding_mask is not None:  # every rank's columns, in global order
            masked = _Gather.apply(key_padding_mask.to(torch.float32), 1, sizes, order, self.group, rank) > 0.5
            keep = (~masked).to(torch.uint8).numpy()
        sinks = ring.pop("sinks")
        masks = dict(ring, causal=bool(is_causal), key_keep=keep, seed_fill=False,
                     zeros=a._fully_masked_rows == _core.FullyMaskedRows.ZEROS)
        bf16 = a.precision == "bfloat16" or dtype == torch.bfloat16
        q, k, v = (_ring.project(t, layer, bf16) for t, layer in zip(x, layers[:3]))
        heads = _ring.attention(plan, q, k, v, masks, bf16, sinks=sinks)
        return first(_ring.project(heads, layers[3], bf16)).to(dtype), None


def _ring_checks(op, a):
    """What the ring takes of the module: refusals of what it does not run; (dropout p, this rank's key)."""
    if isinstance(a, MultiHeadAttention):
        if a.head_gates is not None:
            raise ValueError(f"[{op}] head_gates: set on the module; wanted None with method='ring' "
                             "(prune the heads, or use method='all_gather')")
        p = a.attention.dropout.p
    else:
        for what, bad in (("bias_k/bias_v", a.bias_k is not None), ("add_zero_attn", a.add_zero_attn),
                          ("pruned heads", a._kept() is not None)):
            if bad:
                raise ValueError(f"[{op}] {what}: set on the drop-in; the ring runs the plain projections "
                                 "only (use method='all_gather')")
        p = a.dropout
    if a._rotary is not None:
        raise ValueError(f"[{op}] rotary: set on the module; wanted None with method='ring' "
                         "(use method='all_gather')")
    p = float(p) if a.training else 0.0
    return p, _dropout_key(p)


def _drop_in_call(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                  average_attn_weights=True, is_causal=False):
    """The drop-in's forward arguments by name (nn.MultiheadAttention's signature)."""
    return query, key, value, key_padding_mask, attn_mask, is_causal


def _sliced_heads(a, rank, P, args, kwargs):
    """HeadParallel's call on this rank's heads alone (their rows of W_q, W_k, W_v and columns of
    W_o; mha's fused kernel through nn::RingRows on one block), or None for a call that takes
    what this path does not run (then the whole module runs with the other heads gated off)."""
    chapter = isinstance(a, MultiHeadAttention)
    if a._rotary is not None:
        return None
    # float32/bfloat16/float16 (3-D) only: other dtypes go to the module's call, which refuses them
    tensors = lambda ts: all(isinstance(t, torch.Tensor) and t.dim() == 3
                             and t.dtype in (torch.float32, torch.bfloat16, torch.float16) for t in ts)
    if chapter:
        if a.head_gates is not None or kwargs or not 3 <= len(args) <= 4 or not tensors(args[:3]):
            return None
        lens = args[3] if len(args) == 4 else None
        if lens is not None and (not isinstance(lens, torch.Tensor) or lens.dim() != 1
                                 or lens.shape[0] != args[0].shape[0] or not bool((lens >= 0).all())):
            return None  # the module's call checks (and refuses) them
        first = lambda t: t
        x = list(args[:3])
        a._materialise(*x)
        layers = _ring.chapter_layers(a)
        d = a.num_hiddens // a.original_num_heads
        masks = dict(lens=None if lens is None else lens.detach().to(torch.float32).numpy(), causal=False,
                     key_keep=None, seed_fill=True, zeros=False)
        p = a.attention.dropout.p
    else:
        try:
            query, key, value, kpm, attn_mask, is_causal = _drop_in_call(*args, **kwargs)
        except TypeError:
            return None
        if (a.bias_k is not None or a.add_zero_attn or a._kept() is not None or attn_mask is not None
                or not tensors((query, key, value))
                or kpm is not None and (not isinstance(kpm, torch.Tensor) or kpm.dtype != torch.bool
                                        or tuple(kpm.shape) != ((key.shape[0], key.shape[1]) if a.batch_first
                                                                else (key.shape[1], key.shape[0])))):
            return None  # the module's call runs (and checks) them
        first = (lambda t: t) if a.batch_first else (lambda t: t.transpose(0, 1))
        x = [first(t) for t in (query, key, value)]
        layers = _ring.drop_in_layers(a)
        d = a.head_dim
        keep = None if kpm is None else (~kpm).to(torch.uint8).contiguous().numpy()
        masks = dict(lens=None, causal=bool(is_causal), key_keep=keep, seed_fill=False,
                     zeros=a._fully_masked_rows == _core.FullyMaskedRows.ZEROS)
        p = a.dropout
    try:
        _check_widths("", a, list(zip(("query", "key", "value"), x)))
    except ValueError:
        return None  # the module's call refuses them in its words
    H = layers[0][0].shape[0] // d
    B, Lq, Lk = x[0].shape[0], x[0].shape[1], x[1].shape[1]
    p = float(p) if a.training else 0.0
    masks.update(dropout_p=p, dropout_key=_dropout_key(p))  # every rank's generator alike (checked)
    share = H // P
    rows = slice(rank * share * d, (rank + 1) * share * d)
    dtype = x[0].dtype
    bf16 = a.precision == "bfloat16" or dtype == torch.bfloat16
    x = [t.to(torch.float32) for t in x]
    q, k, v = (_ring.project(t, (w[rows], None if b is None else b[rows]), bf16)
               for t, (w, b) in zip(x, layers[:3]))
    plan = _ring.Plan(None, 0, 1, [[(0, Lq)]], B, share, d, Lq, keys=(Lk, [[(0, Lk)]]))
    heads = _ring.attention(plan, q, k, v, masks, bf16, first_head=rank * share, all_heads=H)
    w_o, b_o = layers[3]
    y = _ring.project(heads, (w_o[:, rows], None), bf16)
    if b_o is not None:  # 1/P of W_o's bias on each rank: once in the sum
        y = y + b_o / P
    return y, first, dtype


def _out_bias(attention):
    if isinstance(attention, MultiHeadAttention):
        return attention.W_o.bias
    return attention.out_proj.bias


class HeadParallel(nn.Module):
    """Head (Megatron) parallel attention: see the module's docstring. forward takes what the inner
    module's forward takes (the whole sequence on every rank) and returns what it returns (the
    drop-in: (output, None))."""

    def __init__(self, attention, group=None):
        super().__init__()
        op = "mha.torch.distributed.HeadParallel"
        _check_attention(op, attention)
        self.attention = attention
        self.group = group

    def _sliced(self, a, rank, P, args, kwargs):
        args = [_SumInputGrads.apply(x, self.group) if isinstance(x, torch.Tensor) and x.is_floating_point()
                and x.requires_grad else x for x in args]
        kwargs = {n: _SumInputGrads.apply(x, self.group) if isinstance(x, torch.Tensor) and x.is_floating_point()
                  and x.requires_grad else x for n, x in kwargs.items()}
        got = _sliced_heads(a, rank, P, args, kwargs)
        if got is None:
            return None
        y, first, dtype = got
        y = first(_SumOutputs.apply(y, self.group)).to(dtype)
        return y if isinstance(a, MultiHeadAttention) else (y, None)

    def forward(self, *args, **kwargs):
        op = "mha.torch.distributed.HeadParallel"
        a = self.attention
        rank, P = _world(self.group)
        err = None
        rng = 0
        try:
            p = a.attention.dropout.p if isinstance(a, MultiHeadAttention) else a.dropout
            if a.training and p > 0:  # every rank's module must draw the same dropout key
                rng = zlib.crc32(torch.get_rng_state().numpy().tobytes())
            h = a.num_heads
            if h % P:
                raise ValueError(f"[{op}] num_heads: {h} is not divisible by the group's {P} ranks; wanted an "
                                 "equal share of heads per rank")
            if "head_mask" in kwargs:
                raise ValueError(f"[{op}] head_mask: wanted none (the wrapper gates the heads per rank)")
            if isinstance(a, MultiheadAttention) and kwargs.get("need_weights", True):
                raise ValueError(f"[{op}] need_weights: True; wanted False (each rank has its heads' weights only)")
        except ValueError as e:
            err = e
        states = _agree(op, self.group, rank, P, err, (rng,))[:, 0].tolist()
        if len(set(states)) != 1:
            raise ValueError(f"[{op}] dropout: the ranks' torch generators differ (CRC32 of their states: "
                             f"{states}); wanted the same state on every rank (seed every rank alike), so that "
                             "each draws one process's dropout key")
        sliced = self._sliced(a, rank, P, args, kwargs)
        if sliced is not None:
            return sliced
        share = a.num_heads // P
        gates = torch.zeros(a.num_heads)
        gates[rank * share:(rank + 1) * share] = 1
        args = [_SumInputGrads.apply(x, self.group) if isinstance(x, torch.Tensor) and x.is_floating_point()
                and x.requires_grad else x for x in args]
        out = a(*args, head_mask=gates, **kwargs)
        y = out[0] if isinstance(out, tuple) else out
        b = _out_bias(a)
        if b is not None:  # every rank adds W_o's bias: keep 1/P of it on each
            y = y - b * (P - 1) / P
        y = _SumOutputs.apply(y, self.group)
        return (y, None) if isinstance(out, tuple) else y
