// src/cpu/fused/isa_table.h: the table of entry points one instruction
// set's kernel exports (fused_job.h's IsaKernels), written once.
//
// Included by fused_<isa>.cpp after kernel_impl.h and backward_impl.h,
// inside that file's target region, so that the functions instantiated here
// are compiled for its instruction set:
//
//   const IsaKernels kAvx2Kernels = isa_kernels<Avx2, Avx2Tiles>();
//
// The table is a constant expression (addresses of functions), so it is
// initialised before any code runs and no static-initialisation order can
// see it empty.

namespace mha::kernels::fused {

template <class V, class T>
size_t isa_backward_scratch_floats(int64_t Q, int64_t d, int64_t dv, int64_t rows) {
  using KB = BackwardKernel<V, T>;
  return KB::scratch_floats(KB::shape_of(Q, d, dv, rows));
}

template <class V, class T>
constexpr IsaKernels isa_kernels() {
  using K = Kernel<V, T>;
  return {V::kName,
          K::MQ,
          &K::scratch_floats,
          &K::forward_chunk,
          &K::weights_chunk,
          &isa_backward_scratch_floats<V, T>,
          &BackwardKernel<V, T>::chunk};
}

}  // namespace mha::kernels::fused
