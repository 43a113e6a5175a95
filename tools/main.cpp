// The mha command-line tool: `mha <command> --help` describes each command.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "outputs.h"
#include "mha/memory.h"
#include "mha/version.h"

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or a file, so that progress shows as it
  // happens (`mha prune | tee log`), not in blocks of 4 KiB.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"mha: multi-head attention, exact to the d2l chapter's PyTorch code"};
  app.set_version_flag("--version", std::string("mha ") + mha::kVersion);
  app.require_subcommand(1);
  // Before any command runs: the most bytes one library call may allocate.
  app.add_option_function<uint64_t>("--memory-limit", [](uint64_t bytes) { mha::set_memory_limit(bytes); },
                                    "Most bytes one call may allocate (e.g. 512MB, 8GB; default: physical memory)")
      ->check(mha::tools::non_negative_size())
      ->transform(CLI::AsSizeValue(false));
  mha::tools::add_demo_command(app);
  mha::tools::add_run_command(app);
  mha::tools::add_bench_command(app);
  mha::tools::add_viz_command(app);
  mha::tools::add_train_command(app);
  mha::tools::add_prune_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::string cmd = "mha";
    for (const CLI::App* sub : app.get_subcommands()) cmd += " " + sub->get_name();
    std::fprintf(stderr, "%s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  return 0;
}
