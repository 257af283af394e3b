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

}  // namespace aitune::cli
