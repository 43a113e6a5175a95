#include "mha/tensor.h"

#include <limits>
#include <string>
#include <utility>

#include "core/memory.h"
#include "mha/error.h"

namespace mha {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(op, "shape ", shape_str(shape), " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d)
      fail(op, "shape ", shape_str(shape), " has more elements than fit in 64 bits");
    n *= d;
  }
  return n;
}

TensorView TensorView::split_heads(int64_t num_heads) const {
  // (B, L, h*d) with strides (sB, sL, 1) -> (B, h, L, d) with (sB, d, sL, 1).
  TensorView out;
  out.data = data;
  out.rank = 4;
  const int64_t d = shape[2] / num_heads;
  out.shape[0] = shape[0]; out.stride[0] = stride[0];
  out.shape[1] = num_heads; out.stride[1] = d;
  out.shape[2] = shape[1]; out.stride[2] = stride[1];
  out.shape[3] = d; out.stride[3] = 1;
  return out;
}

Tensor::Tensor(Shape shape, float fill) : shape_(std::move(shape)) {
  const int64_t n = checked_numel(shape_);
  // Before allocating: the byte size must fit in 64 bits and in the limit.
  const uint64_t bytes = core::MemoryPlan("Tensor").add("shape", shape_).total();
  core::check_bytes("Tensor", "shape " + shape_str(shape_), bytes);
  data_.assign(static_cast<size_t>(n), fill);
}

Tensor::Tensor(Shape shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  const int64_t n = checked_numel(shape_);
  if (n != static_cast<int64_t>(data_.size()))
    fail("Tensor", "values: ", data_.size(), " values given for shape ", shape_str(shape_),
         " which holds ", n);
}

int64_t Tensor::size(int64_t axis) const {
  const int64_t r = dim();
  const int64_t a = axis < 0 ? axis + r : axis;
  if (a < 0 || a >= r) fail("Tensor.size", "axis ", axis, " is out of range for rank ", r);
  return shape_[static_cast<size_t>(a)];
}

int64_t Tensor::offset(std::initializer_list<int64_t> index) const {
  if (static_cast<int64_t>(index.size()) != dim())
    fail("Tensor.at", "index has ", index.size(), " entries, tensor has rank ", dim());
  int64_t off = 0;
  size_t axis = 0;
  for (int64_t i : index) {
    if (i < 0 || i >= shape_[axis])
      fail("Tensor.at", "index ", i, " is out of range on axis ", axis, " of shape ",
           shape_str(shape_));
    off = off * shape_[axis] + i;
    ++axis;
  }
  return off;
}

float& Tensor::at(std::initializer_list<int64_t> index) { return data_[offset(index)]; }
float Tensor::at(std::initializer_list<int64_t> index) const { return data_[offset(index)]; }

Tensor Tensor::reshape(Shape shape) const {
  if (checked_numel(shape, "Tensor.reshape") != numel())
    fail("Tensor.reshape", "cannot reshape ", shape_str(shape_), " to ", shape_str(shape));
  return Tensor(std::move(shape), data_);
}

TensorView Tensor::view() const {
  if (dim() > TensorView::kMaxRank)
    fail("Tensor.view", "rank ", dim(), " is above the view's maximum of ", TensorView::kMaxRank);
  TensorView v;
  v.data = const_cast<float*>(data_.data());
  v.rank = static_cast<int>(dim());
  int64_t stride = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[i] = shape_[static_cast<size_t>(i)];
    v.stride[i] = stride;
    stride *= v.shape[i];
  }
  return v;
}

}  // namespace mha
