// mha/tensor.h: a small owning float32 tensor and a non-owning strided view.
//
// Tensor is row-major and contiguous; it owns its data in a std::vector.
// TensorView is what kernels take: a pointer, a shape and strides (in
// elements), with the innermost dimension contiguous. Views are how the
// seed's transpose_qkv becomes free: the projected (B, L, h*d) buffer is seen
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

using Shape = std::vector<int64_t>;

// Number of elements of `shape`; throws mha::Error if a dimension is negative
// or the product overflows int64 (checked before anything is allocated).
int64_t checked_numel(const Shape& shape, const char* op = "Tensor");

struct TensorView {
  static constexpr int kMaxRank = 4;
  float* data = nullptr;
  int rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t stride[kMaxRank] = {0, 0, 0, 0};

  int64_t size(int i) const { return shape[i]; }
  // Pointer to element (i0, i1, ..., i_{n-1}); indices past `rank` are ignored.
  float* ptr(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return data + i0 * stride[0] + i1 * stride[1] + i2 * stride[2] + i3 * stride[3];
  }
  // (B, L, h*d) -> (B, h, L, d) without copying: the seed's transpose_qkv.
  TensorView split_heads(int64_t num_heads) const;
};

class Tensor {
 public:
  Tensor() = default;
  // A tensor of `shape` filled with `fill`.
  explicit Tensor(Shape shape, float fill = 0.0f);
  // A tensor of `shape` holding `values` (row-major); sizes must agree.
  Tensor(Shape shape, std::vector<float> values);

  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  bool empty() const { return shape_.empty(); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::vector<float>& values() { return data_; }
  const std::vector<float>& values() const { return data_; }

  float& at(std::initializer_list<int64_t> index);
  float at(std::initializer_list<int64_t> index) const;

  // Same data, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // A view of the whole tensor (rank <= 4).
  TensorView view() const;

  friend bool operator==(const Tensor& a, const Tensor& b) {
    return a.shape_ == b.shape_ && a.data_ == b.data_;
  }

 private:
  int64_t offset(std::initializer_list<int64_t> index) const;
  Shape shape_;
  std::vector<float> data_;
};

}  // namespace mha
