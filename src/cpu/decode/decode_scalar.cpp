// The decode kernel for the baseline x86-64 target: fused::Scalar4's four
// floats in plain loops. Correctness, not speed, is the point of this path.
#include <cmath>
#include <cstdint>

#include "cpu/decode/decode_job.h"
#include "cpu/fused/simd_scalar.h"
#include "cpu/decode/decode_impl.h"

namespace mha::kernels::decode {

struct ScalarDecode : fused::Scalar4 {
  static float reduce_add(Reg x) { return (x.v[0] + x.v[1]) + (x.v[2] + x.v[3]); }
  static float reduce_max(Reg x) { return std::max(std::max(x.v[0], x.v[1]), std::max(x.v[2], x.v[3])); }
  static Reg load_bf16(const uint16_t* p) { return map([&](int i) { return core::from_bf16(p[i]); }); }
  static void load_bf16_pair(const uint16_t* p, Reg& even, Reg& odd) {
    even = map([&](int i) { return core::from_bf16(p[2 * i]); });
    odd = map([&](int i) { return core::from_bf16(p[2 * i + 1]); });
  }
};

const DecodeIsaKernels kScalarDecode = decode_kernels<ScalarDecode>();

}  // namespace mha::kernels::decode
