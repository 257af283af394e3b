// `aitune report tune_report.json -o page.html`: a tune report as an HTML page.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/tune_report_html.hpp"
#include "commands.hpp"

namespace aitune::cli {

namespace fs = std::filesystem;

namespace {

// The report a directory names: its own tune_report.json (a tune's output directory), or a
// checkpoint's only graphs/<graph>/tune_report.json; several are refused, each named, so
// that a checkpoint directory is not read as a JSON file ("not valid JSON").
std::string report_in(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  if (fs::is_regular_file(fs::path(path) / "tune_report.json", ec)) return (fs::path(path) / "tune_report.json").string();
  std::vector<std::string> found;
  for (const auto& graph : fs::directory_iterator(fs::path(path) / "graphs", ec))
    if (fs::is_regular_file(graph.path() / "tune_report.json", ec)) found.push_back((graph.path() / "tune_report.json").string());
  std::sort(found.begin(), found.end());
  if (found.size() == 1) return found.front();
  if (found.empty())
    throw Error(ErrorCode::kInvalidArgument, "'" + path + "' is a directory without a tune_report.json (nor a checkpoint's "
                                             "graphs/<graph>/tune_report.json); pass the report file");
  std::string names;
  for (const auto& f : found) names += "\n  " + f;
  throw Error(ErrorCode::kInvalidArgument, "'" + path + "' holds the reports of " + std::to_string(found.size()) +
                                               " graphs; pass one of them:" + names);
}

// ": <why>" from errno after a failed open, write or rename ("" where none is set): the
// message said only "cannot write the page" for a missing directory or a directory there.
std::string reason() { return errno ? std::string(": ") + std::strerror(errno) : std::string(); }

}  // namespace

Command add_report(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Render a tune report (tune_report.json) as a self-contained HTML page");
  auto report = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  sub->add_option("report", *report, "the tune_report.json a tune wrote, or a directory holding one (a checkpoint with one graph)")->required()->check(non_empty_path());
  sub->add_option("-o,--output", *output, "the page to write (default: the report's path with .html)")->check(non_empty_path());
  return {sub, [report, output] {
            *report = report_in(*report);
            errno = 0;
            std::ifstream in(*report);
            if (!in) throw Error(ErrorCode::kIo, "cannot read the report '" + *report + "'" + reason());
            std::stringstream text;
            text << in.rdbuf();
            std::string page;
            try {
              page = tune_report_html(text.str());
            } catch (const Error& e) {
              throw Error(e.code(), "'" + *report + "': " + e.what());
            }
            std::string target = *output;
            if (target.empty()) {
              const auto dot = report->rfind('.');
              target = (dot == std::string::npos || report->find('/', dot) != std::string::npos ? *report
                                                                                                 : report->substr(0, dot)) +
                       ".html";
              // A report of a checkpoint gets its page beside the checkpoint, not in it: a file
              // there outside the manifest is lost on the next save over it (a probe).
              // A module section of a pipeline checkpoint lies inside the pipeline's: beside the
              // outermost, named after each one on the way (`pipe.ait.enc.graph_x...`; beside the
              // section the page was inside the pipeline, and its next save removed it).
              const fs::path graph = fs::path(*report).parent_path().filename();
              std::string suffix = (graph.empty() ? "" : "." + graph.string()) + ".tune_report.html";
              for (auto checkpoint = Checkpoint::enclosing_checkpoint(target); !checkpoint.empty();
                   checkpoint = Checkpoint::enclosing_checkpoint(target)) {
                const fs::path at = fs::path(checkpoint).lexically_normal();
                const fs::path name = at.has_filename() ? at.filename() : at.parent_path().filename();
                target = at.string() + suffix;
                suffix = "." + name.string() + suffix;
              }
            } else if (const auto checkpoint = Checkpoint::enclosing_checkpoint(target); !checkpoint.empty()) {
              throw Error(ErrorCode::kInvalidArgument, "refusing to write the page into the checkpoint '" + checkpoint +
                                                           "' ('" + target + "'): its files are its manifest's, and a "
                                                           "save over it removes any other; write it elsewhere (-o)");
            }
            // (A file of a checkpoint is never replaced, `-o ckpt/manifest.json` wrote the page
            // over the manifest: the checkpoint no longer loaded; refused above with any page into one.)
            std::error_code exists_error;
            // The page never replaces the report it is made from (`-o r.json`, or a report
            // named r.html: the JSON was gone and the next `aitune report` said "not JSON").
            std::error_code same_error;
            if (fs::exists(target, exists_error) && fs::equivalent(target, *report, same_error))
              throw Error(ErrorCode::kInvalidArgument, "refusing to write the page over the report it is made from ('" +
                                                           target + "'); write it elsewhere (-o PAGE.html)");
            const std::string partial = target + ".partial";
            {
              errno = 0;
              std::ofstream out(partial, std::ios::trunc);
              out << page;
              out.flush();
              if (!out) {
                const std::string why = reason();
                std::remove(partial.c_str());
                throw Error(ErrorCode::kIo, "cannot write the page '" + target + "'" + why);
              }
            }
            if (std::rename(partial.c_str(), target.c_str()) != 0) {
              const std::string why = reason();  // a directory there, another file system
              std::remove(partial.c_str());
              throw Error(ErrorCode::kIo, "cannot write the page '" + target + "'" + why);
            }
            std::cout << "wrote " << target << "\n";
            return 0;
          }};
}

}  // namespace aitune::cli
