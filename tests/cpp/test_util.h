// tests/cpp/test_util.h: random tensors and closeness checks for the C++ tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mha/error.h"
#include "mha/torch_mha.h"
#include "mha/random.h"
#include "mha/tensor.h"

namespace mha::test {

inline Tensor random_tensor(Shape shape, Generator& gen, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(std::move(shape));
  for (float& x : t.values()) x = gen.uniform(lo, hi);
  return t;
}

// |a - b| <= atol + rtol * |b| elementwise, with the worst offender reported.
inline ::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol,
                                            double atol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs "
                                         << shape_str(b.shape());
  double worst = 0.0;
  int64_t at = -1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data()[i], y = b.data()[i];
    const double excess = std::fabs(x - y) - (atol + rtol * std::fabs(y));
    if (!(excess <= 0.0) && (at < 0 || excess > worst || std::isnan(excess))) {
      worst = excess;
      at = i;
    }
  }
  if (at >= 0)
    return ::testing::AssertionFailure() << "element " << at << ": " << a.data()[at] << " vs "
                                         << b.data()[at] << " (rtol " << rtol << ", atol " << atol
                                         << ")";
  return ::testing::AssertionSuccess();
}

// Runs `f` and checks it throws mha::Error whose message contains `needle`.
template <typename F>
::testing::AssertionResult throws_with(F&& f, const std::string& needle) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message '" << e.what() << "' lacks '" << needle << "'";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "no exception (wanted one mentioning '" << needle << "')";
}

// Options of a batch-first drop-in ((B, L, E) inputs); TorchMhaOptions{} is
// PyTorch's sequence-first default.
inline TorchMhaOptions batch_first_options() {
  TorchMhaOptions o;
  o.batch_first = true;
  return o;
}

}  // namespace mha::test
