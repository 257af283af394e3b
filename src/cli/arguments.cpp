// Ranges and checks of the command line's numbers, and safe file names for outputs.
#include "arguments.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "aitune/error.hpp"

namespace aitune::cli {

void take_session_options(std::map<std::string, std::string>& options, OnnxSessionConfig& config) {
  for (auto [key, field] : {std::pair{"intra_op_threads", &config.intra_op_threads},
                            std::pair{"inter_op_threads", &config.inter_op_threads}})
    if (auto it = options.find(key); it != options.end()) {
      // (its upper bound is the session's own: OnnxSession::check_config says it)
      *field = static_cast<int>(parse_integer(it->second, 0, std::numeric_limits<int>::max(),
                                              std::string("--provider-option ") + key));
      options.erase(it);
    }
  if (auto it = options.find("graph_optimization_level"); it != options.end()) {
    config.graph_optimization_level = parse_graph_optimization_level(it->second);
    options.erase(it);
  }
}

CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& input) -> std::string { return input.empty() ? "an empty path names no file" : ""; }, "PATH");
}

CLI::Validator finite_in(double lo, double hi) {
  auto describe = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  const std::string range = "a finite number in [" + describe(lo) + ", " + describe(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& input) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(input, v) || !std::isfinite(v) || v < lo || v > hi)
          return "'" + input + "' is not " + range;
        return {};
      },
      range);
}

int64_t parse_integer(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value < lo || value > hi)
    throw Error(ErrorCode::kInvalidArgument, what + ": '" + text + "' is not an integer in [" + std::to_string(lo) +
                                                 ", " + std::to_string(hi) + "]");
  return value;
}

std::string output_file_name(const std::string& name) {
  std::string out;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || (c == '.' && i > 0);
    if (keep) {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  out += ".npy";
  if (name.empty() || out.size() > 255)
    throw Error(ErrorCode::kInvalidArgument, "output name '" + name.substr(0, 64) + (name.size() > 64 ? "...'" : "'") +
                                                 " cannot be a file name (" +
                                                 (name.empty() ? std::string("it is empty") : "over 255 bytes once escaped") +
                                                 "); --save-outputs writes each output as NAME.npy");
  return out;
}

void check_output_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path file = fs::absolute(path).lexically_normal();
  if (fs::is_directory(file, ec))
    throw Error(ErrorCode::kIo, "cannot write " + what + " to '" + path + "': it is a directory");
  if (!fs::is_directory(file.parent_path(), ec))
    throw Error(ErrorCode::kIo, "cannot write " + what + " to '" + path + "': its directory '" +
                                    file.parent_path().string() + "' does not exist");
}

}  // namespace aitune::cli
