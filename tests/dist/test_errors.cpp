// docs/errors.md's rows reached from "C++ (mpirun)": mha::dist's errors,
// which need an MPI run. Each row has a trigger here, run on every rank; the
// ranks it names must throw the mha::Error the row shows (placeholders like
// <rank> match any text). tests/cpp/errors/test_error_catalogue.cpp does the
// same for the rows reached from plain C++.
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "dist_test_util.h"

namespace mha::dist::test {
namespace {

struct Row {
  std::string id, message;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// The rows whose "reached from" cell lists C++ (mpirun).
std::vector<Row> mpirun_rows() {
  std::ifstream in(std::string(MHA_SOURCE_DIR) + "/docs/errors.md");
  std::vector<Row> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream ls(line.substr(1));
    while (std::getline(ls, cell, '|')) cells.push_back(trim(cell));
    if (cells.size() < 3) continue;
    bool mpirun = false;
    std::istringstream ss(cells[2]);
    std::string s;
    while (std::getline(ss, s, ',')) mpirun |= trim(s) == "C++ (mpirun)";
    if (mpirun) rows.push_back({cells[0].substr(1, cells[0].size() - 2), cells[1].substr(1, cells[1].size() - 2)});
  }
  return rows;
}

// `pattern` with each <placeholder> matching any non-empty text.
bool message_matches(const std::string& pattern, const std::string& got) {
  std::string re;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '<') {
      const size_t end = pattern.find('>', i);
      if (end != std::string::npos && end > i + 1 && pattern.find_first_of(" <", i + 1) > end) {
        re += ".+?";
        i = end;
        continue;
      }
    }
    if (std::string("\\^$.|?*+()[]{}").find(pattern[i]) != std::string::npos) re += '\\';
    re += pattern[i];
  }
  return std::regex_match(got, std::regex(re));
}

// A trigger runs on every rank; `thrower` is the rank that must throw (-1: all).
struct Trigger {
  int thrower;
  std::function<void()> run;
};

// A RingAttention of 8 features in 2 heads for inputs of widths 7, 6, 5.
RingAttention ring(const Communicator& c) { return RingAttention(c, 8, 2, reference_module(8, 2, true, 7, 6, 5, 1)->state_dict()); }

std::map<std::string, Trigger> triggers() {
  const Communicator& c = world();
  return {
      {"dist.peer", {-1, [&c] {
                       const float x = 0;
                       c.send(&x, 1, c.size(), 0);
                     }}},
      {"dist.tag", {-1, [&c] {
                      float x = 0;
                      c.recv(&x, 1, 0, -1);
                    }}},
      {"dist.count", {-1, [&c] { c.all_reduce_sum(nullptr, -1); }}},
      {"dist.message_count", {1, [&c] {
                                std::vector<float> x(4, 0.0f);
                                if (c.rank() == 0) c.send(x.data(), 3, 1, 5);
                                if (c.rank() == 1) c.recv(x.data(), 4, 0, 5);
                              }}},
      {"dist.agree", {0, [&c] {
                        auto ref = reference_module(8, 2, false, 7, 6, 5, 1);
                        HeadParallelAttention hp(c, 8, 2, ref->state_dict());
                        const Tensor q = randn({2, 3, 7}, 2), v = randn({2, 4, 5}, 3);
                        // Rank 1 alone passes keys of the wrong width.
                        hp.forward(q, randn({2, 4, c.rank() == 1 ? 5 : 6}, 4), v);
                      }}},
      {"dist.head_mask", {-1, [&c] {
                            auto ref = reference_module(8, 2, false, 7, 6, 5, 1);
                            HeadParallelAttention hp(c, 8, 2, ref->state_dict());
                            CallMasks masks;
                            masks.attn_mask = Mask::keep({8, 3, 4}, std::vector<uint8_t>(96, 1));
                            hp.forward(randn({4, 3, 7}, 2), randn({4, 4, 6}, 3), randn({4, 4, 5}, 4), {}, masks);
                          }}},
      {"dist.ring_rank", {-1, [&c] { ring(c).forward(randn({2, 2, 7}, 1), randn({2, 6}, 2), randn({2, 2, 5}, 3)); }}},
      {"dist.ring_batch",
       {-1, [&c] { ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({3, 2, 5}, 3)); }}},
      {"dist.ring_positions",
       {-1, [&c] { ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 3, 5}, 3)); }}},
      {"dist.ring_dropout", {-1, [&c] { ring(c).set_dropout(1.5f, 0); }}},
      {"dist.ring_masks", {-1, [&c] {
                             CallMasks masks;
                             masks.attn_mask = Mask::keep({2, 2}, std::vector<uint8_t>(4, 1));
                             ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {}, masks);
                           }}},
      {"dist.ring_sinks_count", {-1, [&c] {
                                   ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {},
                                                   CallMasks(), {0.5f, 1.0f, 2.0f});
                                 }}},
      {"dist.ring_sinks_finite", {-1, [&c] {
                                    ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {},
                                                    CallMasks(), {0.5f, INFINITY});
                                  }}},
      {"dist.ring_sinks_twice", {-1, [&c] {
                                   CallMasks masks;
                                   masks.scores.sinks = {0.5f, 1.0f};
                                   ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {},
                                                   masks, {0.5f, 1.0f});
                                 }}},
      {"dist.ring_docs_rows", {-1, [&c] {
                                 ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {},
                                                 CallMasks(), {}, {0, 2});
                               }}},
      {"dist.ring_docs_offsets", {-1, [&c] {
                                    // Each rank's 2 positions: 2P in all; offsets that stop at 3.
                                    ring(c).forward(randn({1, 2, 7}, 1), randn({1, 2, 6}, 2), randn({1, 2, 5}, 3), {},
                                                    CallMasks(), {}, {0, 1, 3});
                                  }}},
      {"dist.ring_ranks_differ", {-1, [&c] {
                                    const float sink = c.rank() == 1 ? 2.0f : 1.0f;  // rank 1's differs
                                    ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3), {},
                                                    CallMasks(), {0.5f, sink});
                                  }}},
      {"dist.ring_width",
       {-1, [&c] { ring(c).forward(randn({2, 2, 7}, 1), randn({2, 2, 5}, 2), randn({2, 2, 5}, 3)); }}},
      {"dist.ring_batch_ranks", {0, [&c] {
                                   const int64_t B = c.rank() == 1 ? 3 : 2;
                                   ring(c).forward(randn({B, 2, 7}, 1), randn({B, 2, 6}, 2), randn({B, 2, 5}, 3));
                                 }}},
      {"dist.ring_no_keys",
       {-1, [&c] { ring(c).forward(randn({2, 2, 7}, 1), randn({2, 0, 6}, 2), randn({2, 0, 5}, 3)); }}},
      {"dist.ring_no_forward", {-1, [&c] { ring(c).backward(randn({2, 2, 8}, 1)); }}},
      {"dist.ring_grad_shape", {-1, [&c] {
                                  RingAttention r = ring(c);
                                  r.forward(randn({2, 2, 7}, 1), randn({2, 2, 6}, 2), randn({2, 2, 5}, 3));
                                  r.backward(randn({2, 2, 9}, 4));
                                }}},
      {"dist.ring_memory_limit", {-1, [&c] {
                                    RingAttention r = ring(c);
                                    const Tensor q = randn({2, 64, 7}, 1), k = randn({2, 64, 6}, 2),
                                                 v = randn({2, 64, 5}, 3);
                                    const uint64_t saved = memory_limit();
                                    set_memory_limit(1024);  // after the inputs: tensors check it too
                                    try {
                                      r.forward(q, k, v);
                                    } catch (...) {
                                      set_memory_limit(saved);
                                      throw;
                                    }
                                    set_memory_limit(saved);
                                  }}},
      {"dist.split_color", {-1, [&c] { c.split(-1, 0); }}},
      // 3 groups divide no run of 2 or 4 ranks.
      {"dist.grid_groups", {-1, [&c] {
                              GridAttention(c, 3, 8, 2, reference_module(8, 2, true, 7, 6, 5, 1)->state_dict());
                            }}},
      {"dist.grid_heads", {-1, [&c] {
                             GridAttention(c, 2, 8, 1, reference_module(8, 1, true, 7, 6, 5, 1)->state_dict());
                           }}},
  };
}

// Checked in main.cpp, around MPI's lifetime rather than inside it.
const std::set<std::string> kCheckedByMain = {"dist.not_running", "dist.finalized"};

TEST(ErrorCatalogue, EveryMpirunRowGivesItsMessage) {
  const Communicator& c = world();
  const auto table = triggers();
  const auto rows = mpirun_rows();
  ASSERT_FALSE(rows.empty()) << "docs/errors.md has no C++ (mpirun) rows";
  std::set<std::string> ids;
  for (const Row& row : rows) {
    ids.insert(row.id);
    if (row.id == "dist.not_running") {
      EXPECT_TRUE(message_matches(row.message, early_errors()[row.id]))
          << row.id << ": got \"" << early_errors()[row.id] << "\", wanted \"" << row.message << "\"";
      continue;
    }
    if (kCheckedByMain.count(row.id)) continue;
    const auto it = table.find(row.id);
    ASSERT_NE(it, table.end()) << "no trigger for catalogue row '" << row.id << "'";
    std::string got;
    try {
      it->second.run();
    } catch (const Error& e) {
      got = e.what();
    }
    c.barrier();  // the next trigger starts with every rank past this one
    if (it->second.thrower >= 0 && it->second.thrower != c.rank()) continue;
    if (it->second.thrower >= c.size()) continue;
    EXPECT_TRUE(message_matches(row.message, got)) << row.id << ": got \"" << got << "\", wanted \"" << row.message
                                                   << "\"";
  }
  for (const auto& [id, trigger] : table) EXPECT_TRUE(ids.count(id)) << "trigger '" << id << "' has no row";
  for (const std::string& id : kCheckedByMain) EXPECT_TRUE(ids.count(id)) << "row '" << id << "' missing";
}

}  // namespace
}  // namespace mha::dist::test
