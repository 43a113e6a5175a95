// The mha command-line tool: `mha <command> --help` describes each command.
//
// Exit status: 0 on success (also --help and --version); 2 for a usage error,
// a command line CLI11 refuses (an unknown option or command, a missing
// required option, a value not of the option's kind or outside its range,
// an option given without the one that makes it apply); 1 for every other
// failure (a file that cannot be read or written, a value the command
// refuses once it runs, standard output that could not be written).
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "outputs.h"
#include "mha/memory.h"
#include "mha/version.h"

namespace {

// "mha train": the tool and the command given (for the message prefix), and
// the command alone for the message's [operation].
std::string command_of(const CLI::App& app, std::string* op) {
  std::string cmd = "mha";
  *op = "mha";
  for (const CLI::App* sub : app.get_subcommands()) {
    cmd += " " + sub->get_name();
    *op = sub->get_name();
  }
  return cmd;
}

// Standard output is the result of most commands (`mha demo > table.txt`):
// a write that failed (a full disk, /dev/full, a closed pipe) is a failure.
int check_stdout(const CLI::App& app, int status) {
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return status;  // a usage error or failure keeps its status below
  std::string op;
  const std::string cmd = command_of(app, &op);
  std::fprintf(stderr, "%s: error: [%s] standard output: a write failed (a full disk, or a closed pipe or "
               "terminal); the command's output was lost\n", cmd.c_str(), op.c_str());
  return status != 0 ? status : 1;
}

// The first word that is neither an option nor --memory-limit's value, if it
// is not a command: CLI11 would only say that a subcommand is required.
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--memory-limit") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    for (const CLI::App* sub : app.get_subcommands({})) if (sub->get_name() == a) return "";
    return a;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  // Line-buffered even into a pipe or a file, so that progress shows as it
  // happens (`mha prune | tee log`), not in blocks of 4 KiB.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CLI::App app{"mha: multi-head attention, exact to the d2l chapter's PyTorch code"};
  app.set_version_flag("--version", std::string("mha ") + mha::kVersion);
  app.require_subcommand(1);
  // Before any command runs: the most bytes one library call may allocate.
  app.add_option_function<uint64_t>("--memory-limit", [](uint64_t bytes) { mha::set_memory_limit(bytes); },
                                    "Most bytes one call may allocate (e.g. 512MB, 8GB; 1 KB = 1024 bytes; "
                                    "default and 0: physical memory)")
      ->type_name("SIZE")
      ->transform(mha::tools::size_in_bytes());
  mha::tools::add_demo_command(app);
  mha::tools::add_run_command(app);
  mha::tools::add_bench_command(app);
  mha::tools::add_viz_command(app);
  mha::tools::add_train_command(app);
  mha::tools::add_prune_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version (exit code 0) print what they were asked for.
    if (e.get_exit_code() == 0) return check_stdout(app, app.exit(e));
    std::string op;
    const std::string cmd = command_of(app, &op);
    const std::string unknown = app.get_subcommands().empty() ? unknown_command(app, argc, argv) : "";
    if (!unknown.empty())
      std::fprintf(stderr, "mha: error: [mha] '%s' is not a command; wanted demo, run, bench, viz, train or prune "
                   "(see mha --help)\n", unknown.c_str());
    else
      std::fprintf(stderr, "%s: error: [%s] %s (see %s --help)\n", cmd.c_str(), op.c_str(), e.what(), cmd.c_str());
    return check_stdout(app, 2);
  } catch (const std::exception& e) {
    std::string op;
    const std::string cmd = command_of(app, &op);
    std::fprintf(stderr, "%s: error: %s\n", cmd.c_str(), e.what());
    return check_stdout(app, 1);
  }
  return check_stdout(app, 0);
}
