// Entry point of the standalone `aitune` executable.
#include <string>
#include <vector>

#include "cli.hpp"

int main(int argc, char** argv) { return aitune::cli::run(std::vector<std::string>(argv, argv + argc)); }
