"""bench/bench_greedy.py: greedy decoding of a small trained model, with a KV
cache against the d2l chapter's re-projecting loop.

    MHA_BUILD=build PYTHONPATH=build/python /usr/bin/python3 bench/bench_greedy.py [--quick]

The model is mha.AttentionModel (embedding + d2l's sinusoidal positions +
LAYERS residual layers of the chapter's MultiHeadAttention + a linear
read-out), trained here for a few hundred Adam steps, with the chapter's
causal valid lengths (query t sees keys 0..t), on next-token prediction of
x[t] = (x[t - 4] + 1) mod VOCAB. It then continues a prompt of PROMPT
tokens greedily (argmax of each step's logits), three ways:

- cached: each layer's mha.MultiHeadAttention called on the new position
  only, m(x, x, x, cache=c): it projects that one position and attends over
  the cached keys and values of the earlier ones.
- re-projecting: the chapter's Transformer decoder at prediction time. Each
  layer keeps the inputs of every earlier step, concatenates the new one and
  attends from the new position over all of them, m(x, S, S): every step
  projects all t earlier positions again (O(t D^2) per step, O(n^2 D^2) in
  all, against the cache's O(n D^2 + n^2 D)).
- torch: the same re-projecting loop on the chapter's PyTorch module
  (tests/python/seed_reference.py) holding the same weights: the peer.

All three feed the prompt one position at a time and produce the same
tokens (checked before timing; tests/python/test_greedy_decode.py holds the
logits to 1e-5). Printed per length n (tokens generated): total wall time
of each loop (best of 9 rounds, the loops interleaved in each), re-projecting
/ cached (the ratio grows with n), torch / cached; and the share of generated
tokens that follow the training rule (the model was trained on 64-token
sequences; it drifts on longer ones, which changes no timing: every loop
produces the same tokens).
"""
import argparse
import pathlib
import sys
import time

import numpy as np

VOCAB, HIDDENS, HEADS, LAYERS, PROMPT, PERIOD = 16, 128, 4, 2, 8, 4


def sequences(rng, batch, length):
    """(batch, length) token ids with x[t] = (x[t - PERIOD] + 1) mod VOCAB."""
    x = np.empty((batch, length), np.int64)
    x[:, :PERIOD] = rng.integers(0, VOCAB, size=(batch, PERIOD))
    for t in range(PERIOD, length):
        x[:, t] = (x[:, t - PERIOD] + 1) % VOCAB
    return x


def train_model(mha, max_len, steps=400, batch=32, length=64, seed=0):
    """An AttentionModel trained on next-token prediction with causal lengths;
    returns (model, final loss, final accuracy on the scored positions)."""
    model = mha.AttentionModel(VOCAB, VOCAB, max_len, num_hiddens=HIDDENS, num_heads=HEADS,
                               num_layers=LAYERS, positions=mha.Positions.SINUSOIDAL, seed=seed)
    opt = mha.optim.Adam(model, lr=3e-3)
    rng = np.random.default_rng(seed)
    causal = np.tile(np.arange(1, length + 1, dtype=np.float32), (batch, 1))  # the chapter's dec_valid_lens
    loss = acc = float("nan")
    for _ in range(steps):
        seq = sequences(rng, batch, length + 1)
        model.zero_grad()
        loss, grad, correct, scored = mha.cross_entropy(model(seq[:, :-1], causal), seq[:, 1:])
        model.backward(grad)
        mha.optim.clip_grad_norm(model, 1.0)
        opt.step()
        acc = correct / scored
    model.eval()
    return model, loss, acc


class Weights:
    """The trained model's pieces, as numpy arrays and mha modules in evaluation mode."""

    def __init__(self, mha, model):
        sd = model.state_dict()
        self.embedding = sd["embedding.weight"]
        self.positions = np.asarray(model.positions)
        self.readout_w, self.readout_b = sd["readout.weight"], sd["readout.bias"]
        self.layer_states = [{n: sd[f"layers.{i}.{n}"] for n in ("W_q.weight", "W_k.weight", "W_v.weight",
                                                                  "W_o.weight")}
                             for i in range(model.num_layers)]
        self.layers = []
        for state in self.layer_states:
            m = mha.MultiHeadAttention(num_hiddens=HIDDENS, num_heads=HEADS).eval()
            m.load_state_dict(state)
            self.layers.append(m)

    def input(self, token, t):  # (1, 1, D): the model's X_0 at position t
        return (self.embedding[token] + self.positions[t])[None, None, :]

    def logits(self, x):  # (1, 1, D) -> (V,)
        return x[0, 0] @ self.readout_w.T + self.readout_b


def residual(x, a):
    return x + a if LAYERS > 1 else a


def greedy_cached(w, prompt, steps):
    """(tokens, logits of each generated token): steps tokens after the prompt."""
    n = len(prompt) + steps
    caches = [m.kv_cache(batch_size=1, max_len=n) for m in w.layers]
    tokens, out = list(prompt), []
    for t in range(n - 1):
        x = w.input(tokens[t], t)
        for m, c in zip(w.layers, caches):
            x = residual(x, m(x, x, x, cache=c))
        if t + 1 >= len(prompt):
            logits = w.logits(x)
            out.append(logits)
            tokens.append(int(np.argmax(logits)))
    return tokens, np.array(out)


def greedy_reprojecting(w, prompt, steps):
    """greedy_cached's tokens the chapter's way: each layer's inputs so far
    concatenated and projected again every step."""
    n = len(prompt) + steps
    states = [None] * len(w.layers)
    tokens, out = list(prompt), []
    for t in range(n - 1):
        x = w.input(tokens[t], t)
        for i, m in enumerate(w.layers):
            states[i] = x if states[i] is None else np.concatenate([states[i], x], axis=1)
            x = residual(x, m(x, states[i], states[i]))
        if t + 1 >= len(prompt):
            logits = w.logits(x)
            out.append(logits)
            tokens.append(int(np.argmax(logits)))
    return tokens, np.array(out)


def torch_decoder(w):
    """greedy(prompt, steps) on the chapter's PyTorch module with w's weights."""
    import torch
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "python"))
    from seed_reference import make_seed_module
    layers = []
    for state in w.layer_states:
        m = make_seed_module(HIDDENS, HEADS, HIDDENS, HIDDENS, HIDDENS, False).eval()
        m.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        layers.append(m)
    E, P = torch.from_numpy(w.embedding), torch.from_numpy(w.positions)
    Wr, br = torch.from_numpy(w.readout_w), torch.from_numpy(w.readout_b)

    @torch.no_grad()
    def greedy(prompt, steps):
        n = len(prompt) + steps
        states = [None] * len(layers)
        tokens, out = list(prompt), []
        for t in range(n - 1):
            x = (E[tokens[t]] + P[t])[None, None, :]
            for i, m in enumerate(layers):
                states[i] = x if states[i] is None else torch.cat([states[i], x], dim=1)
                a = m(x, states[i], states[i], None)
                x = x + a if LAYERS > 1 else a
            if t + 1 >= len(prompt):
                logits = x[0, 0] @ Wr.T + br
                out.append(logits.numpy())
                tokens.append(int(torch.argmax(logits)))
        return tokens, np.array(out)
    return greedy


def best_times(fns, repeats):
    """The best wall time of each of fns over repeats rounds, the loops
    interleaved in every round (so that load from other processes falls on
    all of them alike)."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="lengths 64 and 128, one repeat")
    ap.add_argument("--threads", type=int, default=1, help="mha's and torch's threads (default 1)")
    ap.add_argument("--no-torch", action="store_true", help="skip the chapter's PyTorch loop")
    args = ap.parse_args()
    import mha
    mha.set_num_threads(args.threads)
    lengths = [64, 128] if args.quick else [64, 128, 256, 512]
    repeats = 1 if args.quick else 9
    t0 = time.perf_counter()
    model, loss, acc = train_model(mha, PROMPT + max(lengths))
    print(f"model: vocab {VOCAB}, {HIDDENS} features, {HEADS} heads, {LAYERS} layers; trained "
          f"{time.perf_counter() - t0:.1f} s: last loss {loss:.3f}, next-token accuracy {acc:.3f}")
    w = Weights(mha, model)
    torch_greedy = None
    if not args.no_torch:
        import torch
        torch.set_num_threads(args.threads)
        torch_greedy = torch_decoder(w)
    prompt = [int(x) for x in sequences(np.random.default_rng(1), 1, PROMPT)[0]]
    print(f"prompt {prompt}; threads {args.threads}; best of {repeats}")
    print(f"{'n':>5} {'cached s':>9} {'reproj s':>9} {'reproj/cached':>14} {'torch s':>9} {'torch/cached':>13}"
          f"  rule followed")
    for n in lengths:
        tokens, _ = greedy_cached(w, prompt, n)
        ref, _ = greedy_reprojecting(w, prompt, n)
        if tokens != ref:
            sys.exit(f"bench_greedy: n={n}: cached tokens differ from the re-projecting loop's")
        if torch_greedy is not None and torch_greedy(prompt, n)[0] != tokens:
            sys.exit(f"bench_greedy: n={n}: tokens differ from the chapter's PyTorch loop's")
        follows = np.mean([tokens[t] == (tokens[t - PERIOD] + 1) % VOCAB for t in range(PROMPT, len(tokens))])
        loops = [lambda: greedy_cached(w, prompt, n), lambda: greedy_reprojecting(w, prompt, n)]
        if torch_greedy is not None:
            loops.append(lambda: torch_greedy(prompt, n))
        times = best_times(loops, repeats)
        tc, tr = times[0], times[1]
        line = f"{n:>5} {tc:>9.3f} {tr:>9.3f} {tr / tc:>14.2f}"
        if torch_greedy is not None:
            line += f" {times[2]:>9.3f} {times[2] / tc:>13.2f}"
        else:
            line += f" {'-':>9} {'-':>13}"
        print(line + f"  {follows:.2f}")


if __name__ == "__main__":
    main()
