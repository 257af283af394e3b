// cli_main: the `aitune` console script of the wheel runs the C++ command line.
#include <nanobind/stl/pair.h>
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
      [](const std::vector<nb::object>& argv, const std::vector<std::pair<std::string, std::string>>& external) {
        // Bytes, as the kernel gave them: a file name need not be UTF-8. A str is
        // encoded as os.fsencode does (surrogateescape), so sys.argv's undecodable
        // bytes come back as they were.
        std::vector<std::string> args;
        args.reserve(argv.size());
        for (const auto& a : argv) {
          nb::bytes raw = nb::isinstance<nb::bytes>(a) ? nb::borrow<nb::bytes>(a)
                          : nb::isinstance<nb::str>(a) ? nb::steal<nb::bytes>(PyUnicode_EncodeFSDefault(a.ptr()))
                                                       : throw nb::type_error("cli_main: each argument must be str or bytes");
          if (!raw.is_valid()) throw nb::python_error();
          args.emplace_back(raw.c_str(), raw.size());
        }
        std::vector<cli::ExternalCommand> commands;
        for (const auto& [name, description] : external) commands.push_back({name, description});
        nb::gil_scoped_release release;
        int rc = cli::run(args, commands);
        std::cout.flush();
        return rc;
      },
      nb::arg("argv"), nb::arg("external") = std::vector<std::pair<std::string, std::string>>{},
      "Runs the aitune command line (argv[0] is the program name) on arguments given as bytes; returns the exit "
      "code. external: (name, description) of the commands the caller runs itself (serve, loadtest), listed in "
      "--help and in the unknown-command error with the C++ ones.");
}

}  // namespace aitune::python
