// Subcommand dispatch and the translation of aitune::Error into exit codes.
#include "cli.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>

#include "aitune/error.hpp"
#include "aitune/version.hpp"
#include "commands.hpp"

namespace aitune::cli {
namespace {

int exit_code(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kShapeMismatch:
    case ErrorCode::kDTypeMismatch: return 2;
    case ErrorCode::kProviderUnavailable:
    case ErrorCode::kBackendUnavailable:
    case ErrorCode::kUnsupportedDType: return 3;  // cannot run here: a provider, a backend that needs Python, a dtype
    case ErrorCode::kModelInvalid: return 4;
    case ErrorCode::kCheckpointCorrupt: return 5;
    case ErrorCode::kIo: return 6;
    default: return 1;
  }
}

}  // namespace

std::string human_bytes(std::uintmax_t bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// The first word that names no subcommand where one is expected (`aitune bogus`, `aitune
// cache bogus`), or empty: CLI11 answers those with "A subcommand is required", which does
// not say that the word given was not one.
std::string unknown_subcommand(const CLI::App& app, const std::vector<std::string>& args) {
  const CLI::App* current = &app;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word.empty() || word[0] == '-') return {};
    auto subs = current->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return {};
    auto found = std::find_if(subs.begin(), subs.end(), [&](const CLI::App* s) { return s->check_name(word); });
    if (found == subs.end()) {
      std::string names;
      for (const auto* s : subs) names += (names.empty() ? "" : ", ") + s->get_name();
      std::string where = current == &app ? "aitune" : "aitune " + current->get_name();
      return "unknown command '" + word + "' for " + where + " (commands: " + names + ")";
    }
    current = *found;
  }
  return {};
}

int run(const std::vector<std::string>& args) { return run(args, {}); }

int run(const std::vector<std::string>& args, const std::vector<ExternalCommand>& external) {
  CLI::App app{"aitune: tune and run ONNX models with ONNX Runtime", args.empty() ? "aitune" : args[0]};
  // (the codes exit_code gives, listed where a script's author looks for them)
  app.footer("Exit codes: 0 done; 1 another error; 2 a bad argument or input (a shape or dtype the model does "
             "not take); 3 cannot run here (a provider, a backend or a dtype this machine lacks); 4 an invalid or "
             "missing model; 5 a corrupt checkpoint; 6 a file that cannot be read or written.");
  app.set_version_flag("--version", std::string(version()));
  app.require_subcommand(1);
  std::map<CLI::App*, Action> actions;
  for (auto add : {add_doctor, add_inspect, add_run, add_tune}) {
    Command command = add(app);
    actions[command.sub] = std::move(command.action);
  }
  for (auto add : {add_debug_precision, add_report}) {  // diagnosis: precision debugging, the report page
    Command command = add(app);
    actions[command.sub] = std::move(command.action);
  }
  {  // export-triton, registered apart from the list above so that edits to either stay independent
    Command command = add_export_triton(app);
    actions[command.sub] = std::move(command.action);
  }
  {  // cache list|clean
    Command command = add_cache(app);
    actions[command.sub] = std::move(command.action);
  }
  for (const auto& command : external) {  // listed before the footer, with the C++ commands
    CLI::App* sub = app.add_subcommand(command.name, command.description);
    sub->allow_extras();
    actions[sub] = [name = command.name] {
      std::cerr << "aitune: error: '" << name << "' is run by the aitune Python package (the console script)\n";
      return 1;
    };
  }
  if (std::string unknown = unknown_subcommand(app, args); !unknown.empty()) {
    std::cerr << "aitune: error: " << unknown << "\nRun with --help for more information.\n";
    return 2;
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend() - (args.empty() ? 0 : 1));
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (or the help) and has its own codes (105, 106, 109...);
    // every usage error exits with the documented 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto* sub : app.get_subcommands())
      if (auto it = actions.find(sub); it != actions.end()) return it->second();
    return 1;
  } catch (const Error& e) {
    std::cerr << "aitune: error: " << e.what() << "\n";
    return exit_code(e.code());
  } catch (const std::exception& e) {
    std::cerr << "aitune: internal error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace aitune::cli
