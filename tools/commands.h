// tools/commands.h: each command of the mha tool registers itself here.
//
// A command file adds its subcommand, options and callback to the app; the
// callback does its work through the library and throws on error (main()
// turns any exception into a message on stderr and exit status 1).
#pragma once

#include <CLI/CLI.hpp>

namespace mha::tools {

void add_demo_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_viz_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_prune_command(CLI::App& app);

}  // namespace mha::tools
