"""bench.py --decode: mha's decode kernel (mha._core._decode_attention: Qn new
queries over a KV cache of K keys per batch row, 32 query heads of 128)
beside the time to read the cache once at the memory bandwidth measured in
this run, and beside ONNX Runtime's MultiHeadAttention with past_key /
past_value where that peer is installed (bench/ort_peer.py).

- ms: median wall time of one step after a warm-up step, from Python (the
  caches are used in place; q is copied in, the output out).
- stream GB/s: numpy's copy of 2 x 256 MiB buffers (one thread), bytes read
  plus bytes written, measured before and after each case (the larger
  counts). `mha bench --decode` measures it on all threads, from C++.
- x read: the step's time over the cache bytes at that bandwidth.
- module: the same step through the module's cached call, m(x, x, x,
  cache=cache) (projections of the Qn new positions, the append, the decode
  kernel, W_o), each row rewound to K afterwards: mha.MultiHeadAttention
  (the d2l chapter's, 4096 features in 32 heads) when the cache has 32
  heads, mha.TorchMultiheadAttention with num_kv_heads=8 when it has 8.
  x read: its time over the cache-read time; x read+W: over the time to
  read the cache and the module's weights once.
- ORT: fp32 cache and as many cache heads as query heads only (the op has
  no grouped heads; GroupQueryAttention would be another op), and only when
  its copy of the cache fits in memory. Outputs checked against mha's first
  (tolerance 1e-4 x max |output|). mha/ORT: mha's time over ORT's.
"""
import time

CASES = [  # (B, Qn, K, Hkv, dtype); 32 query heads of 128 throughout
    (B, Qn, K, Hkv, dt) for B in (1, 8) for K in (4096, 32768) for Hkv in (32, 8) for dt in ("f32", "bf16")
    for Qn in (1, 4, 16)
]
HQ, D = 32, 128


def available_bytes():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def stream_bandwidth(np, budget_s=0.3):
    a = np.ones(64 << 20, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    t_end = time.perf_counter() + budget_s
    while time.perf_counter() < t_end or best == float("inf"):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best


def to_bf16_bits(np, x):
    """float32 -> bfloat16 bits (uint16), rounded to nearest even."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_case(np, B, Qn, K, Hkv, dtype):
    rng = np.random.default_rng(0)
    q = rng.random((B, HQ, Qn, D), np.float32) * 2 - 1
    k = rng.random((B, Hkv, K, D), np.float32) * 2 - 1
    v = rng.random((B, Hkv, K, D), np.float32) * 2 - 1
    if dtype == "bf16":
        k, v = to_bf16_bits(np, k), to_bf16_bits(np, v)
    return q, k, v, np.full(B, K, np.int64)


def module_step(np, mha, B, Qn, K, Hkv, dtype, time_call, budget):
    """(module name, seconds per cached step, weight bytes): see the module row above."""
    E, Ekv = HQ * D, Hkv * D
    rng = np.random.default_rng(1)
    if Hkv == HQ:
        m, name, weight_bytes = mha.MultiHeadAttention(E, HQ), "MultiHeadAttention", 4 * 4 * E * E
    else:
        w = {"in_proj_weight": (rng.random((E + 2 * Ekv, E), np.float32) - 0.5) * 0.04,
             "out_proj.weight": (rng.random((E, E), np.float32) - 0.5) * 0.04}
        m = mha.TorchMultiheadAttention.from_state_dict(w, num_heads=HQ, num_kv_heads=Hkv, batch_first=True)
        name, weight_bytes = f"TorchMultiheadAttention kv{Hkv}", 4 * ((E + 2 * Ekv) * E + E * E)
    m.eval()
    cache = m.kv_cache(B, K + Qn, dtype="float32" if dtype == "f32" else "bfloat16")
    chunk = rng.random((B, 1024, Ekv), np.float32) * 2 - 1  # the same 1024 rows again: timing only
    for at in range(0, K, 1024):
        n = min(1024, K - at)
        cache.append(chunk[:, :n], chunk[:, :n])
    x = rng.random((B, Qn, E), np.float32) * 2 - 1

    def step():
        m(x, x, x, cache=cache)
        for b in range(B):
            cache.truncate(b, K)

    return name, time_call(step, budget), weight_bytes


def main(threads, quick, budget, time_call, ort_missing, np):
    import mha
    import ort_peer
    print(f"decode step, {HQ} query heads of {D}; ONNX Runtime: "
          f"{'skipped: ' + ort_missing if ort_missing else 'onnxruntime (Python package, build-venv)'}")
    print(f"\n{'case':36} {'thr':>3} {'mha ms':>9} {'GB/s':>6} {'stream':>7} {'read ms':>8} {'x read':>7}"
          f" {'ORT ms':>9} {'mha/ORT':>8}")
    notes = []
    for t in threads:
        mha.set_num_threads(t)
        for (B, Qn, K, Hkv, dtype) in CASES:
            if quick and (Qn != 1 or B != 1):
                continue
            name = f"B{B} Qn{Qn} K{K} {HQ}/{Hkv} heads {dtype}"
            nbytes = 2 * B * Hkv * K * D * (4 if dtype == "f32" else 2)
            if nbytes > 0.3 * available_bytes():
                print(f"{name:36} {t:>3} skipped: cache {nbytes / 1e9:.1f} GB, over 30% of the available memory")
                continue
            q, k, v, lens = make_case(np, B, Qn, K, Hkv, dtype)
            bw = stream_bandwidth(np)
            want = mha._core._decode_attention(q, k, v, lens)
            s = time_call(lambda: mha._core._decode_attention(q, k, v, lens), budget)
            bw = max(bw, stream_bandwidth(np))
            read = nbytes / bw
            ort = ""
            if not ort_missing and dtype == "f32" and Hkv == HQ and 3 * nbytes < 0.6 * available_bytes():
                try:
                    o, err = ort_peer.time_decode(name, q, k, v, want, t, budget)
                    ort = f"{o * 1e3:>9.3f} {s / o:>8.2f}"
                    notes.append(f"  {name} threads={t}: output max |diff| / max |mha| = {err:.1e}")
                except RuntimeError as e:
                    ort = f"{'failed':>9}"
                    notes.append(f"  {name} threads={t}: {e}")
            print(f"{name:36} {t:>3} {s * 1e3:>9.3f} {nbytes / s / 1e9:>6.1f} {bw / 1e9:>7.1f} {read * 1e3:>8.3f}"
                  f" {s / read:>7.2f} {ort}", flush=True)
            del q, k, v, want
            mod, ms, wbytes = module_step(np, mha, B, Qn, K, Hkv, dtype, time_call, budget)
            read_w = (nbytes + wbytes) / bw
            print(f"  {mod:34} {t:>3} {ms * 1e3:>9.3f} {'':>6} {'':>7} {read_w * 1e3:>8.3f} {ms / read:>7.2f}"
                  f"  x read+W {ms / read_w:.2f}", flush=True)
    if notes:
        print("\nONNX Runtime checks (before timing):")
        print("\n".join(notes))
