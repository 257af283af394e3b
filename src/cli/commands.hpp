// Private to the CLI: one registration function per subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "aitune/tensor.hpp"

namespace aitune::cli {

/// What runs when a subcommand was chosen; returns the exit code.
using Action = std::function<int()>;
/// A subcommand added to the app and its action.
struct Command {
  CLI::App* sub;
  Action action;
};
Command add_doctor(CLI::App& app);
Command add_inspect(CLI::App& app);
Command add_run(CLI::App& app);
Command add_tune(CLI::App& app);
Command add_export_triton(CLI::App& app);
Command add_debug_precision(CLI::App& app);
Command add_report(CLI::App& app);
Command add_cache(CLI::App& app);

/// "12.3 MB" style size.
std::string human_bytes(std::uintmax_t bytes);

}  // namespace aitune::cli
