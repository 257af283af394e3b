// cli_main: the `aitune` console script of the wheel runs the C++ command line.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <iostream>

#include "bindings.hpp"
#include "cli.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_cli(nb::module_& m) {
  m.def(
      "cli_main",
      [](const std::vector<std::string>& argv) {
        int rc = cli::run(argv);
        std::cout.flush();
        return rc;
      },
      nb::arg("argv"), nb::call_guard<nb::gil_scoped_release>(),
      "Runs the aitune command line (argv[0] is the program name); returns the exit code.");
}

}  // namespace aitune::python
