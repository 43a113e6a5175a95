"""Shared pieces of the training tests: random attention cases, the seed's
module loaded with our parameters and fed our dropout mask, and error norms."""
import numpy as np
import torch

import seed_reference as seed

# Lengths that exercise every path: 1 and primes, a few composites, up to 70.
LENGTHS = [1, 2, 3, 5, 7, 8, 13, 16, 31, 37, 64, 70]


class FixedDropout(torch.nn.Module):
    """nn.Dropout with a given mask of multipliers (0 or 1/(1-p))."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def forward(self, x):
        return x * self.mask


def random_case(rng, max_len=70):
    """A random MultiHeadAttention problem, as a dict of its settings and inputs."""
    heads = int(rng.integers(1, 9))
    head_dim = int(rng.integers(1, 10))
    B = int(rng.integers(1, 5))
    Q = int(rng.choice([x for x in LENGTHS if x <= max_len]))
    K = int(rng.choice([x for x in LENGTHS if x <= max_len]))
    dq, dk, dv = (int(x) for x in rng.integers(1, 24, size=3))
    kind = rng.choice(["none", "batch", "query"])
    lens = None
    if kind != "none":
        shape = (B,) if kind == "batch" else (B, Q)
        # 0, fractions and lengths past K, as well as ordinary ones.
        lens = rng.integers(0, 2 * K + 4, size=shape).astype(np.float32) * 0.5
    return dict(
        num_hiddens=heads * head_dim, num_heads=heads, bias=bool(rng.integers(0, 2)),
        dropout=float(rng.choice([0.0, 0.0, 0.3, 0.6])),
        queries=rng.standard_normal((B, Q, dq)).astype(np.float32),
        keys=rng.standard_normal((B, K, dk)).astype(np.float32),
        values=rng.standard_normal((B, K, dv)).astype(np.float32),
        valid_lens=lens,
        grad_output=rng.standard_normal((B, Q, heads * head_dim)).astype(np.float32),
    )


def seed_module_like(m, case, mask=None, dtype=torch.float32):
    """The seed's module with m's parameters and, if given, m's dropout mask."""
    q, k, v = case["queries"], case["keys"], case["values"]
    t = seed.make_seed_module(case["num_hiddens"], case["num_heads"], q.shape[2], k.shape[2],
                              v.shape[2], case["bias"], dropout=case["dropout"])
    t.load_state_dict({n: torch.from_numpy(a) for n, a in m.state_dict().items()})
    t = t.to(dtype)
    if mask is not None:
        B, h, Q, K = mask.shape
        t.attention.dropout = FixedDropout(torch.from_numpy(mask).reshape(B * h, Q, K).to(dtype))
    return t


def seed_gradients(t, case, dtype=torch.float32):
    """Autograd through the seed's code: input gradients and parameter gradients."""
    inputs = [torch.tensor(case[n], dtype=dtype, requires_grad=True)
              for n in ("queries", "keys", "values")]
    lens = None if case["valid_lens"] is None else torch.from_numpy(case["valid_lens"])
    out = t(*inputs, lens)
    out.backward(torch.from_numpy(case["grad_output"]).to(dtype))
    params = {n: p.grad.detach().numpy() for n, p in t.named_parameters()}
    return [x.grad.detach().numpy() for x in inputs], params, out.detach().numpy()


def normalised_error(got, want):
    """max |got - want| / max |want|: the error relative to the tensor's scale."""
    want = np.asarray(want, np.float64)
    scale = np.abs(want).max() if want.size else 0.0
    err = np.abs(np.asarray(got, np.float64) - want).max() if want.size else 0.0
    return err / scale if scale > 0 else err
