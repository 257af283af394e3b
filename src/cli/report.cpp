// `aitune report tune_report.json -o page.html`: a tune report as an HTML page.
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "aitune/error.hpp"
#include "aitune/tune_report_html.hpp"
#include "commands.hpp"

namespace aitune::cli {

Command add_report(CLI::App& app) {
  auto* sub = app.add_subcommand("report", "Render a tune report (tune_report.json) as a self-contained HTML page");
  auto report = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  sub->add_option("report", *report, "the tune_report.json a tune wrote")->required();
  sub->add_option("-o,--output", *output, "the page to write (default: the report's path with .html)");
  return {sub, [report, output] {
            std::ifstream in(*report);
            if (!in) throw Error(ErrorCode::kIo, "cannot read the report '" + *report + "'");
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
            }
            const std::string partial = target + ".partial";
            {
              std::ofstream out(partial, std::ios::trunc);
              out << page;
              if (!out) throw Error(ErrorCode::kIo, "cannot write the page '" + target + "'");
            }
            if (std::rename(partial.c_str(), target.c_str()) != 0)
              throw Error(ErrorCode::kIo, "cannot write the page '" + target + "'");
            std::cout << "wrote " << target << "\n";
            return 0;
          }};
}

}  // namespace aitune::cli
