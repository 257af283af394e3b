// The `aitune` command line, callable from main() and from the Python extension.
#pragma once

#include <string>
#include <vector>

namespace aitune::cli {

/// Runs the command line with `args` (args[0] is the program name); returns the exit
/// code. An aitune::Error is printed as one line "aitune: error: ..." and mapped to an
/// exit code (2 bad input, 3 provider unavailable, 4 model invalid, 5 checkpoint
/// corrupt, 6 I/O, 1 anything else); a command line that does not parse or a number
/// outside its range exits with 2 too.
int run(const std::vector<std::string>& args);

/// A command the hosting process runs itself before calling `run` (the wheel's `serve` and
/// `loadtest`, on Ray Serve, which has no C++ API): named and described in `--help` and in
/// the unknown-command error like the C++ commands. Reaching it here is the host's
/// mistake: exit 1, saying so.
struct ExternalCommand {
  std::string name;
  std::string description;
};

/// `run`, with the host's own commands listed among the C++ ones.
int run(const std::vector<std::string>& args, const std::vector<ExternalCommand>& external);

}  // namespace aitune::cli
