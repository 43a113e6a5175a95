// tools/mask_args.cpp: --causal and --window (mask_args.h).
#include "mask_args.h"

#include <limits>
#include <map>
#include <string>

#include "outputs.h"

namespace mha::tools {

CallMasks MaskArgs::call_masks() const {
  CallMasks m;
  m.causal = causal;
  // CLI11 has taken exactly two values, each >= -1 (add_mask_options).
  if (!window.empty()) m.window = {window.at(0), window.at(1)};
  if (any()) m.fully_masked_rows = FullyMaskedRows::Zeros;
  return m;
}

void add_mask_options(CLI::App* cmd, MaskArgs& args) {
  static const std::map<std::string, Causal> kCausal{{"top-left", Causal::TopLeft},
                                                     {"bottom-right", Causal::BottomRight}};
  cmd->add_option_function<std::string>(
         "--causal", [&args](const std::string& name) { args.causal = kCausal.at(name); },
         "Causal masking: top-left (query i sees keys j <= i, PyTorch's is_causal) or bottom-right "
         "(j <= i + K - Q, FlashAttention's)")
      ->transform(CLI::IsMember({"top-left", "bottom-right"}, CLI::ignore_case));
  cmd->add_option("--window", args.window,
                  "A sliding window LEFT,RIGHT: query i sees keys i + K - Q - LEFT .. i + K - Q + RIGHT "
                  "(FlashAttention's window_size; -1 leaves a side unbounded)")
      ->delimiter(',')
      ->expected(2)
      ->transform(integer_in(-1, std::numeric_limits<int32_t>::max()));
}

bool key_in_range(Causal causal, const Window& window, int64_t q, int64_t Q, int64_t k, int64_t K) {
  const int64_t diagonal = q + K - Q;  // bottom right: the window's and BottomRight causal's
  if (causal == Causal::TopLeft && k > q) return false;
  if (causal == Causal::BottomRight && k > diagonal) return false;
  if (window.left >= 0 && k < diagonal - window.left) return false;
  if (window.right >= 0 && k > diagonal + window.right) return false;
  return true;
}

}  // namespace mha::tools
