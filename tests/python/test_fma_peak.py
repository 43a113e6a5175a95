"""The benchmarks' FMA peak (mha._core._fma_peak, src/cpu/gemm/fma_peak.h):
what it reports, not how fast it is (benchmarks measure speed)."""
import math

import mha


def test_the_peak_names_the_gemms_instruction_set_and_is_a_rate():
    one = mha._core._fma_peak(1, 0.02)
    assert set(one) == {"isa", "threads", "gflops"}
    assert one["isa"] in ("scalar", "avx2", "avx512")
    assert one["threads"] == 1
    assert math.isfinite(one["gflops"]) and one["gflops"] > 0
    both = mha._core._fma_peak(2, 0.02)
    assert both["threads"] == 2 and both["isa"] == one["isa"] and both["gflops"] > 0
