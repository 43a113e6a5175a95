// tests/cpp/error_catalogue.h: the triggers of docs/errors.md's rows, by
// part of the library. test_error_catalogue.cpp walks the catalogue and runs,
// for every row that lists C++, the trigger of its id; each trigger must
// throw the mha::Error the row shows.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "mha/mha.h"

namespace mha::test {

using Triggers = std::map<std::string, std::function<void()>>;

Triggers training_triggers();  // test_error_catalogue_training.cpp: model, loss, task, optim, trainer, checkpoints
Triggers torch_triggers();     // test_error_catalogue_torch.cpp: masks, TorchMultiheadAttention, backward
Triggers plot_triggers();      // test_error_catalogue_plot.cpp: plot, head_offsets, the tool's figure helpers
Triggers cache_triggers();     // test_error_catalogue_cache.cpp: key/value caches (mha/kv_cache.h)

inline Tensor ones(Shape s) { return Tensor(std::move(s), 1.0f); }

// A path in the temporary folder, unique to this process.
inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mha_errors_" + std::to_string(getpid()) + "_" + name)).string();
}

}  // namespace mha::test
