"""One module called from 8 Python threads at once (the binding releases the
GIL during the computation) gives exactly the serial results."""
import threading

import numpy as np

import mha


def test_eight_python_threads_give_the_serial_results():
    rng = np.random.default_rng(0)
    m = mha.MultiHeadAttention(32, 4, 0.2, bias=True, seed=3)
    m.eval()
    cases = []
    for i in range(8):
        q = rng.standard_normal((2, 3 + i, 12)).astype(np.float32)
        kv = rng.standard_normal((2, 5 + i, 10)).astype(np.float32)
        cases.append((q, kv, rng.standard_normal((2, 5 + i, 6)).astype(np.float32), np.array([i % 5, 4])))
    serial = [m(*c) for c in cases]
    results = [[] for _ in cases]
    start = threading.Barrier(len(cases))

    def work(i):
        start.wait()
        for rep in range(10):
            j = (i + rep) % len(cases)
            results[i].append((j, m(*cases[j])))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for per_thread in results:
        assert len(per_thread) == 10
        for j, out in per_thread:
            np.testing.assert_array_equal(out, serial[j])
