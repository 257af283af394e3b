// OwnedDirectory and the sweeps of directories whose process died, for the front end's cache and scratch directories.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "aitune/process_directory.hpp"
#include "bindings.hpp"

namespace nb = nanobind;

namespace aitune::python {

void bind_process_directory(nb::module_& m) {
  nb::class_<StaleDirectory>(m, "StaleDirectory")
      .def_ro("path", &StaleDirectory::path)
      .def_ro("pid", &StaleDirectory::pid)
      .def_ro("bytes", &StaleDirectory::bytes)
      .def("__repr__", [](const StaleDirectory& s) {
        return "StaleDirectory('" + s.path + "', pid=" + std::to_string(s.pid) + ", bytes=" + std::to_string(s.bytes) + ")";
      });
  nb::class_<OwnedDirectory>(m, "OwnedDirectory",
                             "A directory '<parent>/<prefix><pid>-<random>' locked (flock) for this process while "
                             "the object lives; sweeps skip it.")
      .def_static("create", &OwnedDirectory::create, nb::arg("parent"), nb::arg("prefix"))
      .def_prop_ro("path", &OwnedDirectory::path)
      .def_prop_ro("held", &OwnedDirectory::held)
      .def("remove", &OwnedDirectory::remove, "Removes the tree, then releases the lock.")
      .def("release", &OwnedDirectory::release, "Releases the lock; the directory stays.")
      .def("__repr__", [](const OwnedDirectory& d) { return "OwnedDirectory('" + d.path() + "')"; });
  m.def("process_alive", &process_alive, nb::arg("pid"));
  m.def("find_stale_directories", &find_stale_directories, nb::arg("parent"), nb::arg("prefix"),
        "Entries '<parent>/<prefix><pid>-...' whose process is gone and whose lock nobody holds.");
  m.def("remove_stale_directories",
        [](const std::string& parent, const std::string& prefix) { return remove_stale_directories(parent, prefix); },
        nb::arg("parent"), nb::arg("prefix"),
        "find_stale_directories, each removed; returns those removed.");
  m.def("sibling_prefix", &sibling_prefix, nb::arg("name"), nb::arg("kind"),
        "'.<name><kind>': the prefix of what a save to a target named `name` makes beside it; a name over 120 bytes "
        "is cut to 100 and a digest of it.");
  m.def("default_cache_root", &default_cache_root,
        "$AITUNE_CACHE_DIR, else $XDG_CACHE_HOME/aitune, else ~/.cache/aitune.");
}

}  // namespace aitune::python
