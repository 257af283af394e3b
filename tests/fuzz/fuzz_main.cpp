// Deterministic mutation fuzzer for aitune's parsers of untrusted bytes: the .npy
// reader, the checkpoint manifest, graph-spec JSON and the ONNX external-data scanner.
//
// Usage: aitune_fuzz TARGET RUNS [SEED_DIR...]
//   TARGET   npy | manifest | graph_spec | external_data
//   RUNS     how many mutated inputs to try
//   SEED_DIR directories whose files (matching the target) join the built-in seeds:
//            the test fixtures (tests/fixtures/make_models.py), saved manifests.
// An aitune::Error is the expected answer to bad input; anything else (another
// exception, a broken round trip, and under ASan/UBSan any memory or UB error) is a
// crash: the input is written to aitune-fuzz-crash-TARGET-N.bin and the run fails.
// Built with g++ (no libFuzzer needed), seeded with a fixed value: every CI run tries the
// same inputs, so a failure reproduces.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "aitune/checkpoint.hpp"
#include "aitune/error.hpp"
#include "aitune/graph_spec.hpp"
#include "aitune/onnx_external_data.hpp"
#include "aitune/onnx_value_info.hpp"
#include "io/npy_reader.hpp"
#include "seeds.hpp"

namespace fs = std::filesystem;
using namespace aitune;

namespace {

// A failed invariant inside a target (distinct from aitune::Error, the accepted answer).
struct Broken : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void fuzz_npy(const std::string& bytes) {
  std::istringstream in(bytes);
  Tensor t = detail::read_npy(in, "fuzz.npy");
  if (static_cast<int64_t>(t.nbytes()) != t.view().numel() * static_cast<int64_t>(dtype_size(t.dtype())))
    throw Broken("tensor size disagrees with its shape");
}

void fuzz_manifest(const std::string& bytes) {
  auto m = CheckpointManifest::from_json(bytes);
  // What loads must write and load again to the same manifest.
  auto again = CheckpointManifest::from_json(m.to_json());
  if (!(again == m)) throw Broken("manifest does not round-trip through to_json");
}

void fuzz_graph_spec(const std::string& bytes) {
  auto spec = GraphSpec::from_json(bytes);
  auto again = GraphSpec::from_json(spec.to_json());
  if (again.to_json() != spec.to_json()) throw Broken("graph spec does not round-trip through to_json");
}

void fuzz_external_data(const std::string& bytes) {
  for (const auto& location : onnx_external_data_locations_in(bytes, "fuzz.onnx"))
    if (location.size() > kOnnxMaxLocationBytes) throw Broken("location longer than the bound");
}

void fuzz_value_info(const std::string& bytes) {
  for (const auto& name : onnx_values_without_rank_in(bytes, "fuzz.onnx"))
    if (name.size() > bytes.size()) throw Broken("a value name longer than the model");
}

struct Target {
  const char* name;
  std::function<void(const std::string&)> run;
  std::vector<std::string> extensions;  // seed files of SEED_DIR that fit this target
  std::vector<std::string> (*builtin)();
};

const std::vector<Target>& targets() {
  static const std::vector<Target> t = {
      {"npy", fuzz_npy, {".npy"}, fuzz::npy_seeds},
      {"manifest", fuzz_manifest, {"manifest.json"}, fuzz::manifest_seeds},
      {"graph_spec", fuzz_graph_spec, {".graph_spec.json"}, fuzz::graph_spec_seeds},
      {"external_data", fuzz_external_data, {".onnx"}, fuzz::onnx_seeds},
      {"value_info", fuzz_value_info, {".onnx"}, fuzz::onnx_seeds},
  };
  return t;
}

// Structure-blind mutations plus a few that aim at the parsers' limits (deep nesting,
// long runs, large varints and lengths).
class Mutator {
 public:
  explicit Mutator(const std::vector<std::string>& seeds) : seeds_(seeds) {}

  std::string next() {
    std::string s = seeds_[pick(seeds_.size())];
    const int rounds = 1 + static_cast<int>(pick(4));
    for (int r = 0; r < rounds; ++r) mutate(s);
    if (s.size() > kMaxInput) s.resize(kMaxInput);
    return s;
  }

 private:
  static constexpr std::size_t kMaxInput = 1 << 20;

  std::size_t pick(std::size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  void mutate(std::string& s) {
    static const unsigned char kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x0a, 0x12, 0x22, 0x2a, 0x3a,
                                                 '[',  '{',  '"',  '\'', ',',  ':',  '(',  ')',  '-',  '9'};
    const std::size_t at = pick(s.size() + 1);
    switch (pick(10)) {
      case 0:  // flip a bit
        if (!s.empty()) s[at % s.size()] ^= static_cast<char>(1u << pick(8));
        break;
      case 1:  // set a byte to an interesting value
        if (!s.empty()) s[at % s.size()] = static_cast<char>(kInteresting[pick(sizeof kInteresting)]);
        break;
      case 2:  // erase a range
        if (!s.empty()) s.erase(at % s.size(), 1 + pick(std::min<std::size_t>(64, s.size())));
        break;
      case 3:  // insert random bytes
        for (std::size_t n = 1 + pick(8); n > 0; --n) s.insert(s.begin() + static_cast<std::ptrdiff_t>(std::min(at, s.size())), static_cast<char>(pick(256)));
        break;
      case 4: {  // duplicate a chunk elsewhere
        if (s.empty()) break;
        const std::size_t from = pick(s.size()), len = 1 + pick(std::min<std::size_t>(256, s.size() - from));
        const std::string chunk = s.substr(from, len);
        s.insert(std::min(at, s.size()), chunk);
        break;
      }
      case 5: {  // splice with another seed
        const std::string& other = seeds_[pick(seeds_.size())];
        if (other.empty()) break;
        const std::size_t from = pick(other.size());
        s = s.substr(0, std::min(at, s.size())) + other.substr(from);
        break;
      }
      case 6: {  // a long run of one interesting byte (nesting, spaces, digits)
        static const char kRuns[] = {'[', '{', ' ', '9', '(', ',', '\x0a', '\xff'};
        s.insert(std::min(at, s.size()), std::string(1 + pick(pick(2) ? 200 : 20000), kRuns[pick(sizeof kRuns)]));
        break;
      }
      case 7: {  // overwrite 1, 2, 4 or 8 bytes with an extreme integer (lengths, sizes)
        if (s.empty()) break;
        const std::size_t width = std::size_t{1} << pick(4);
        const std::uint64_t values[] = {0, 1, 0x7f, 0xff, 0xffff, 0x7fffffff, 0xffffffff, ~std::uint64_t{0}, 1u << 31};
        std::uint64_t v = values[pick(std::size(values))];
        for (std::size_t i = 0; i < width && at % s.size() + i < s.size(); ++i, v >>= 8)
          s[at % s.size() + i] = static_cast<char>(v & 0xff);
        break;
      }
      case 8: {  // nest a JSON value deeply: "key": [[[...value...]]]
        const auto colon = s.find(':', std::min(at, s.size()));
        if (colon == std::string::npos) {
          s.resize(std::min(at, s.size()));  // else truncate
          break;
        }
        const auto end = s.find_first_of(",}", colon);
        const std::size_t depth = 1 + pick(pick(2) ? 100 : 50000);
        if (end != std::string::npos) s.insert(end, std::string(depth, ']'));
        s.insert(colon + 1, std::string(depth, '['));
        break;
      }
      default: {  // replace a digit run with a huge or negative number (JSON fields)
        const auto d = s.find_first_of("0123456789", std::min(at, s.size()));
        if (d == std::string::npos) break;
        const auto e = s.find_first_not_of("0123456789", d);
        static const char* kNumbers[] = {"-1", "4294967297", "1e400", "-9223372036854775809", "1.5",
                                         "99999999999999999999999", "0", "100000"};
        s.replace(d, (e == std::string::npos ? s.size() : e) - d, kNumbers[pick(std::size(kNumbers))]);
        break;
      }
    }
  }

  const std::vector<std::string>& seeds_;
  std::mt19937_64 rng_{0x5eedu};
};

bool fits(const fs::path& file, const Target& target) {
  const std::string name = file.filename().string();
  for (const auto& ext : target.extensions)
    if (name.size() >= ext.size() && name.compare(name.size() - ext.size(), ext.size(), ext) == 0) return true;
  return false;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: aitune_fuzz npy|manifest|graph_spec|external_data RUNS [SEED_DIR...]\n";
    return 2;
  }
  const Target* target = nullptr;
  for (const auto& t : targets())
    if (t.name == std::string(argv[1])) target = &t;
  if (!target) {
    std::cerr << "aitune_fuzz: unknown target '" << argv[1] << "'\n";
    return 2;
  }
  const long runs = std::atol(argv[2]);
  std::vector<std::string> seeds = target->builtin();
  for (int i = 3; i < argc; ++i) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(argv[i], ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_regular_file() && fits(it->path(), *target) && it->file_size() <= (1u << 20))
        seeds.push_back(read_file(it->path()));
  }

  // Every seed is itself an input; then the mutants.
  Mutator mutator(seeds);
  long accepted = 0, refused = 0;
  for (long i = 0; i < runs + static_cast<long>(seeds.size()); ++i) {
    const std::string input = i < static_cast<long>(seeds.size()) ? seeds[static_cast<std::size_t>(i)] : mutator.next();
    try {
      target->run(input);
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      const std::string crash = "aitune-fuzz-crash-" + std::string(target->name) + "-" + std::to_string(i) + ".bin";
      std::ofstream(crash, std::ios::binary) << input;
      std::cerr << "aitune_fuzz " << target->name << ": input " << i << " escaped as " << typeid(e).name() << ": "
                << e.what() << " (saved as " << crash << ")\n";
      return 1;
    }
  }
  std::cout << "aitune_fuzz " << target->name << ": " << runs + static_cast<long>(seeds.size()) << " executions ("
            << seeds.size() << " seeds), " << accepted << " accepted, " << refused << " refused with aitune::Error, "
            << "no crash\n";
  return 0;
}
