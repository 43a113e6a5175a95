// mha/tensor.h: a small owning float32 tensor and a non-owning strided view.
//
// Tensor is row-major and contiguous; it owns its data in a std::vector.
// TensorView is what kernels take: a pointer, a shape and strides (in
// elements), with the innermost dimension contiguous. Views are how the
// d2l chapter's transpose_qkv becomes free: the projected (B, L, h*d) buffer is seen
// as (B, h, L, d) by choosing strides, without a copy.
//
//   mha::Tensor x({2, 4, 100}, 1.0f);      // ones(2, 4, 100)
//   float v = x.at({1, 3, 99});
//   mha::TensorView heads = x.view().split_heads(5);   // (2, 5, 4, 20)
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace mha {

// A tensor's shape: one extent per axis, outermost first.
using Shape = std::vector<int64_t>;

// Number of elements of `shape`; throws mha::Error if a dimension is negative
// or the product overflows int64 (checked before anything is allocated).
int64_t checked_numel(const Shape& shape, const char* op = "Tensor");

// A non-owning strided view of float32 data, rank <= 4: what kernels take.
// Element (i0, ..., i_{rank-1}) is at data + sum(i_a * stride[a]); the
// innermost axis is contiguous (stride 1). A view never checks bounds.
struct TensorView {
  static constexpr int kMaxRank = 4;  // the most axes a view has
  float* data = nullptr;              // element (0, 0, 0, 0); not owned
  int rank = 0;                       // number of axes in use
  int64_t shape[kMaxRank] = {0, 0, 0, 0};   // extent of each axis
  int64_t stride[kMaxRank] = {0, 0, 0, 0};  // step of each axis, in elements

  // Extent of axis i (0 <= i < rank; not checked).
  int64_t size(int i) const { return shape[i]; }
  // Pointer to element (i0, i1, ..., i_{n-1}); indices past `rank` are ignored.
  float* ptr(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return data + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  // (B, L, h*d) -> (B, h, L, d) without copying: the d2l chapter's transpose_qkv.
  TensorView split_heads(int64_t num_heads) const;
};

// An owning, row-major, contiguous float32 tensor of any rank. Copies are
// deep. Constructors throw mha::Error for a negative dimension, an element
// count that overflows 64 bits or a size above mha::memory_limit(), before
// allocating anything.
class Tensor {
 public:
  // The empty tensor: rank 0, no elements (used as "absent").
  Tensor() = default;
  // A tensor of `shape` filled with `fill`.
  explicit Tensor(Shape shape, float fill = 0.0f);
  // A tensor of `shape` holding `values` (row-major); sizes must agree.
  Tensor(Shape shape, std::vector<float> values);

  // The extent of each axis.
  const Shape& shape() const { return shape_; }
  // The rank (number of axes); 0 for the empty tensor.
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Extent of `axis`; negative axes count from the end. Throws mha::Error
  // when the axis is out of range for the rank.
  int64_t size(int64_t axis) const;
  // Number of elements (the product of the shape).
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  // True for the rank-0 tensor made by Tensor(); a tensor with a zero
  // extent, e.g. (2, 0), is not empty.
  bool empty() const { return shape_.empty(); }

  // The elements, row-major.
  float* data() { return data_.data(); }
  // The elements, row-major.
  const float* data() const { return data_.data(); }
  // The elements, row-major; resizing the vector breaks the tensor.
  std::vector<float>& values() { return data_; }
  // The elements, row-major.
  const std::vector<float>& values() const { return data_; }

  // Element at `index` (one entry per axis). Throws mha::Error when the
  // index has the wrong length or an entry is out of range.
  float& at(std::initializer_list<int64_t> index);
  // Element at `index` (one entry per axis); see the other overload.
  float at(std::initializer_list<int64_t> index) const;

  // Same data, new shape with the same element count; throws mha::Error
  // naming both shapes when the counts differ.
  Tensor reshape(Shape shape) const;
  // A view of the whole tensor; throws mha::Error when the rank is above 4.
  TensorView view() const;

  // Same shape and equal elements (as floats: NaN != NaN, 0 == -0).
  friend bool operator==(const Tensor& a, const Tensor& b) {
    return a.shape_ == b.shape_ && a.data_ == b.data_;
  }

 private:
  int64_t offset(std::initializer_list<int64_t> index) const;
  Shape shape_;
  std::vector<float> data_;
};

}  // namespace mha
