#include "fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "mha/mha.h"
#include "run_inputs.h"

namespace mha::fuzz {

namespace {

[[noreturn]] void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

}  // namespace

void safetensors_one_input(const uint8_t* data, size_t size) {
  set_memory_limit(kFuzzMemoryLimit);
  SafetensorsFile file;
  try {
    file = parse_safetensors(data, size, "fuzz");
  } catch (const Error&) {
    return;  // refused with a message: the expected outcome for most inputs
  }
  std::map<std::string, Tensor> f32;
  for (const auto& [name, raw] : file.tensors) {
    try {
      Tensor t = to_float_tensor(raw, name);
      if (t.numel() * static_cast<int64_t>(dtype_size(raw.dtype)) !=
          static_cast<int64_t>(raw.bytes.size()))
        invariant_failed("to_float_tensor returned a tensor of another size");
      if (raw.dtype == DType::F32) f32.emplace(name, std::move(t));
    } catch (const Error&) {
      // e.g. a tensor above the memory limit
    }
  }
  // A file mha accepts, written back by mha, must read back the same.
  std::vector<uint8_t> bytes;
  try {
    bytes = serialize_safetensors(f32, file.metadata);
  } catch (const Error&) {
    return;
  }
  const SafetensorsFile again = parse_safetensors(bytes.data(), bytes.size(), "round trip");
  if (again.tensors.size() != f32.size() || again.metadata != file.metadata)
    invariant_failed("round trip changed the set of tensors or the metadata");
  for (const auto& [name, t] : f32) {
    const RawTensor& r = again.tensors.at(name);
    if (r.dtype != DType::F32 || r.shape != t.shape() ||
        r.bytes.size() != static_cast<size_t>(t.numel()) * 4 ||
        (t.numel() && std::memcmp(r.bytes.data(), t.data(), r.bytes.size()) != 0))
      invariant_failed("round trip changed a tensor");
  }
}

void run_inputs_one_input(const uint8_t* data, size_t size) {
  set_memory_limit(kFuzzMemoryLimit);
  tools::RunInputs in;
  try {
    in = tools::run_inputs_from(parse_safetensors(data, size, "fuzz"), "fuzz");
  } catch (const Error&) {
    return;
  }
  // A module whose lazy widths adopt the inputs', as `mha run` would with
  // weights of matching widths.
  MultiHeadAttention attention(/*num_hiddens=*/8, /*num_heads=*/2, 0.0f, /*bias=*/true, /*seed=*/1);
  attention.eval();
  Tensor out;
  try {
    out = attention(in.queries, in.keys, in.values, in.valid_lens);
  } catch (const Error&) {
    return;
  }
  const Shape wanted = {in.queries.size(0), in.queries.size(1), 8};
  if (out.shape() != wanted) invariant_failed("forward returned the wrong shape");
  // The fused kernel forms the weights only here, so here the memory limit
  // may refuse them.
  Tensor w;
  try {
    w = attention.attention_weights();
  } catch (const Error&) {
    return;
  }
  if (w.shape() != Shape{in.queries.size(0), 2, in.queries.size(1), in.keys.size(1)})
    invariant_failed("attention_weights has the wrong shape");
}

}  // namespace mha::fuzz
