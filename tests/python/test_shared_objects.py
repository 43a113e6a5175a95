"""Objects a Python program shares between threads: a KVCache, a module's
gradients, an AttentionModel, an optimiser. The bindings release the GIL
while they compute; each of these objects serialises its own calls
(python/bindings/object_lock.h), so sharing one is safe: every call runs whole, and
the result is one of the serial orders. Before, eight threads appending to
one cache overran its capacity and corrupted the heap (glibc abort)."""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import mha


def run_threads(fn, n=8, reps=25):
    """fn(thread, rep) on n threads at once; returns the exceptions raised."""
    errors, start = [], threading.Barrier(n)

    def work(i):
        start.wait()
        for r in range(reps):
            try:
                fn(i, r)
            except Exception as e:  # noqa: BLE001 - collected for the assertion
                errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def in_child(code):
    """Runs `code` in a fresh interpreter (a heap corruption aborts it, not the test run)."""
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ))
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_a_cache_shared_by_threads_fills_to_capacity_then_refuses():
    out = in_child("""
        import threading, numpy as np, mha
        m = mha.MultiHeadAttention(32, 4, seed=1).eval()
        x = np.random.default_rng(0).standard_normal((2, 1, 32)).astype(np.float32)
        cache = m.kv_cache(2, 64)
        outcomes, start = [], threading.Barrier(8)
        def work():
            start.wait()
            for _ in range(20):
                try:
                    m(x, x, x, cache=cache); outcomes.append("ok")
                except ValueError as e:
                    outcomes.append(str(e))
        ts = [threading.Thread(target=work) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print(outcomes.count("ok"), cache.lengths, set(o for o in outcomes if o != "ok"))
    """)
    ok, rest = out.split(" ", 1)
    assert int(ok) == 64, out
    assert rest.startswith("[64, 64]"), out
    assert "do not fit row 0 (length 64, capacity 64)" in rest, out


def test_a_shared_cache_holds_the_positions_of_some_serial_order():
    rng = np.random.default_rng(2)
    m = mha.MultiHeadAttention(16, 2, seed=3).eval()
    steps = [rng.standard_normal((1, 1, 16)).astype(np.float32) for _ in range(8)]
    cache = m.kv_cache(1, 8)
    outs = {}

    def step(i, r):
        outs[i] = m(steps[i], steps[i], steps[i], cache=cache)

    assert not run_threads(step, n=8, reps=1)
    assert cache.lengths == [8]
    # Each stored key is one of the steps' projected keys, each step once.
    keys = cache.keys(0)  # (heads, 8, head_dim)
    alone = []
    for x in steps:
        c = m.kv_cache(1, 1)
        m(x, x, x, cache=c)
        alone.append(c.keys(0)[:, 0])
    order = [next(i for i, a in enumerate(alone) if np.array_equal(keys[:, p], a)) for p in range(8)]
    assert sorted(order) == list(range(8))
    # Replaying that order serially gives every thread's output bit for bit.
    serial = m.kv_cache(1, 8)
    for i in order:
        np.testing.assert_array_equal(m(steps[i], steps[i], steps[i], cache=serial), outs[i])


def test_cache_methods_from_threads_during_calls():
    out = in_child("""
        import threading, numpy as np, mha
        m = mha.MultiHeadAttention(16, 2).eval()
        x = np.ones((2, 1, 16), np.float32)
        cache = m.kv_cache(2, 16)
        start = threading.Barrier(4)
        def caller():
            start.wait()
            for _ in range(200):
                try: m(x, x, x, cache=cache)
                except ValueError: cache.reset()
        def inspector():
            start.wait()
            for i in range(200):
                cache.lengths; repr(cache); cache.keys(i % 2); cache.values(1)
                if i % 7 == 0: cache.reorder([1, 0])
                if i % 11 == 0:
                    try: cache.truncate(0, 1)
                    except ValueError: pass
        ts = [threading.Thread(target=f) for f in (caller, caller, inspector, inspector)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("done", max(cache.lengths) <= 16)
    """)
    assert out.strip() == "done True"


@pytest.mark.parametrize("kind", ["chapter", "drop-in"])
def test_backward_from_threads_accumulates_every_calls_gradients(kind):
    # A module's gradients are one thread's business in C++; from Python the
    # backward calls of threads are serialised: the accumulated gradients are
    # n times one call's.
    x = np.random.default_rng(4).standard_normal((2, 5, 16)).astype(np.float32)
    if kind == "chapter":
        m = mha.MultiHeadAttention(16, 2, seed=5)
    else:
        state = {"in_proj_weight": np.random.default_rng(6).standard_normal((48, 16)).astype(np.float32) * 0.2,
                 "out_proj.weight": np.eye(16, dtype=np.float32)}
        m = mha.TorchMultiheadAttention.from_state_dict(state, num_heads=2, batch_first=True)
        m.train()
    g = np.ones((2, 5, 16), np.float32)

    def fwd():
        out = m(x, x, x)
        return out[0] if isinstance(out, tuple) else out

    fwd()
    m.backward(g)
    one = {k: v.copy() for k, v in m.grads().items()}
    m.zero_grad()

    def step(i, r):
        ctx = m.forward_with_context(x, x, x)[-1]
        m.backward(ctx, g)

    assert not run_threads(step, n=8, reps=5)
    for k, v in m.grads().items():
        np.testing.assert_allclose(v, 40 * one[k], rtol=1e-4, atol=1e-4, err_msg=k)


def test_attention_model_and_optimiser_shared_by_threads():
    out = in_child("""
        import threading, numpy as np, mha
        model = mha.AttentionModel(10, 10, 16, num_hiddens=32, num_heads=4, num_layers=2, seed=1)
        opt = mha.optim.Adam(model.layer(0))
        tokens = np.random.default_rng(0).integers(0, 10, (4, 16))
        start = threading.Barrier(6)
        def train():
            start.wait()
            for _ in range(30):
                logits = model(tokens)
                model.backward(np.ones_like(logits) * 1e-3)
        def other():
            start.wait()
            for i in range(30):
                model.grads(); model.state_dict(); opt.step(); opt.zero_grad()
                model.train(i % 2 == 0)
        ts = [threading.Thread(target=f) for f in (train, train, train, train, other, other)]
        [t.start() for t in ts]; [t.join() for t in ts]
        print("done", all(np.isfinite(v).all() for v in model.state_dict().values()))
    """)
    assert out.strip() == "done True"
