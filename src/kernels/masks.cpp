// mha::Mask (mha/masks.h): boolean and additive masks, checked when made.
#include "mha/masks.h"

#include <cmath>

#include "mha/error.h"

namespace mha {

int64_t Mask::numel() const { return is_none() ? 0 : checked_numel(shape_, "Mask"); }

Mask Mask::keep(Shape shape, std::vector<uint8_t> keep) {
  const int64_t n = checked_numel(shape, "Mask.keep");
  if (n != static_cast<int64_t>(keep.size()))
    fail("Mask.keep", "keep: ", keep.size(), " values given for shape ", shape_str(shape),
         " which holds ", n);
  for (uint8_t& x : keep) x = x != 0;
  Mask m;
  m.kind_ = Kind::Keep;
  m.shape_ = std::move(shape);
  m.keep_ = std::move(keep);
  return m;
}

Mask Mask::additive(Tensor bias) {
  // NaN would poison the softmax and +inf makes exp(inf - inf) = NaN: a
  // caller who wants "always attend" has no use for either.
  for (int64_t i = 0; i < bias.numel(); ++i) {
    const float x = bias.data()[i];
    if (std::isnan(x) || x == INFINITY)
      fail("Mask.additive", "bias: element ", i, " of shape ", shape_str(bias.shape()), " is ", x,
           "; an additive mask takes finite values or -inf");
  }
  Mask m;
  m.kind_ = Kind::Additive;
  m.shape_ = bias.shape();
  m.bias_ = std::move(bias);
  return m;
}

Mask mask_from_torch_mha(Shape shape, const std::vector<uint8_t>& masked_out) {
  std::vector<uint8_t> keep(masked_out.size());
  for (size_t i = 0; i < keep.size(); ++i) keep[i] = masked_out[i] == 0;
  return Mask::keep(std::move(shape), std::move(keep));
}

Mask mask_from_sdpa(Shape shape, const std::vector<uint8_t>& takes_part) {
  return Mask::keep(std::move(shape), takes_part);
}

namespace {

// "[op] mask: an additive mask of shape (2, 6); wanted a boolean mask".
void require_boolean(const char* op, const Mask& mask) {
  if (mask.is_keep()) return;
  if (mask.is_none()) fail(op, "mask: no mask (Mask()); wanted a boolean mask");
  fail(op, "mask: an additive mask of shape ", shape_str(mask.shape()), "; wanted a boolean mask");
}

}  // namespace

std::vector<uint8_t> mask_to_torch_mha(const Mask& keep_mask) {
  require_boolean("mask_to_torch_mha", keep_mask);
  std::vector<uint8_t> out(keep_mask.keep_values().size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = keep_mask.keep_values()[i] == 0;
  return out;
}

std::vector<uint8_t> mask_to_sdpa(const Mask& keep_mask) {
  require_boolean("mask_to_sdpa", keep_mask);
  return keep_mask.keep_values();
}

void check_mask_shape(const char* op, const char* arg, const Mask& mask, const Shape& wanted) {
  if (mask.is_none()) return;
  if (mask.shape() != wanted)
    fail(op, arg, ": shape ", shape_str(mask.shape()), " is not ", shape_str(wanted));
}

}  // namespace mha
