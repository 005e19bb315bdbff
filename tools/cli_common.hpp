#pragma once
// Shared pieces of the profile / allocate / eval subcommands: list parsing, scorer and
// protection settings, text windows, and a progress display on stderr.

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv_cli {

/// Splits "a,b,c" (empty items dropped).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

/// Parses "0.1,0.2" into numbers.
/// @throws depthkv::Error on a malformed number
inline std::vector<double> parse_doubles(const std::string& s, const char* what) {
  std::vector<double> out;
  for (const std::string& item : split_list(s)) {
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (...) {
      used = 0;
    }
    DEPTHKV_CHECK(used == item.size() && std::isfinite(v), what << ": '" << item << "' is not a number");
    out.push_back(v);
  }
  DEPTHKV_CHECK(!out.empty(), what << ": empty list");
  return out;
}

/// Token-selection settings shared by profile, eval and allocate (they must agree for a profile to
/// describe what eval prunes; profile files record them in `calibration.selection`).
struct SelectionSettings {
  int sinks = 4;    ///< attention-sink tokens every head keeps
  int window = 16;  ///< recent window every head keeps = SnapKV's observation window
  int kernel = 7;   ///< SnapKV pooling kernel (max pooling)

  depthkv::Protection protection() const { return {sinks, window}; }
  depthkv::ScorerConfig scorer(const std::string& name) const {
    depthkv::ScorerConfig c;
    c.kind = depthkv::parse_scorer_kind(name);
    c.window = window;
    c.kernel = kernel;
    c.pooling = depthkv::Pooling::kMax;
    return c;
  }
  std::string describe() const {
    std::ostringstream os;
    os << "sinks=" << sinks << " window=" << window << " kernel=" << kernel;
    return os.str();
  }
  void check() const {
    DEPTHKV_CHECK(sinks >= 0 && window >= 1 && kernel >= 1 && kernel % 2 == 1,
                  "bad selection settings: " << describe() << " (sinks >= 0, window >= 1, odd kernel)");
  }
  /// Registers --sinks, --window and (with_kernel) --kernel on a subcommand.
  template <class App>
  void add_options(App* c, bool with_kernel) {
    c->add_option("--sinks", sinks, "attention-sink tokens every head keeps")->capture_default_str();
    c->add_option("--window", window, "recent tokens every head keeps (= SnapKV observation window)")
        ->capture_default_str();
    if (with_kernel)
      c->add_option("--kernel", kernel, "SnapKV max-pooling kernel (odd)")->capture_default_str();
  }
};

/// Token windows of `context + continuation` tokens from a story corpus (the splitting rule of
/// depthkv/llama/text_windows.hpp), window indices [skip, skip + n).
/// @throws depthkv::Error when the text yields fewer windows than asked for
/// With `pre_tokenized`, `text_path` is a file of token ids (for models whose tokenizer depthkv
/// cannot run, e.g. a GGUF `gpt2` vocabulary) and `tok` may be null.
inline std::vector<depthkv::llama::EvalWindow> load_windows(const std::string& text_path,
                                                            const depthkv::llama::Tokenizer* tok, int context,
                                                            int continuation, int skip, int n,
                                                            bool pre_tokenized = false, int vocab_size = 0) {
  DEPTHKV_CHECK(context >= 1 && continuation >= 2, "--context must be >= 1 and --continuation >= 2");
  DEPTHKV_CHECK(n >= 1 && skip >= 0, "--windows must be >= 1 and --skip >= 0");
  std::vector<int> ids;
  if (pre_tokenized) {
    ids = depthkv::llama::read_token_file(text_path, vocab_size);
  } else {
    DEPTHKV_CHECK(tok != nullptr, "no tokenizer for this model: pass --tokenizer FILE, or pre-tokenized input with --tokens FILE");
    ids = depthkv::llama::encode_stories(*tok, depthkv::llama::split_stories(depthkv::llama::read_text_file(text_path)));
  }
  const auto windows = depthkv::llama::token_windows(ids, context + continuation, skip, n);
  const long long available = static_cast<long long>(ids.size()) / (context + continuation);
  DEPTHKV_CHECK(static_cast<int>(windows.size()) == n,
                "'" << text_path << "' has " << available << " windows of " << context + continuation
                    << " tokens; asked for " << n << " after skipping " << skip);
  return depthkv::llama::split_windows(windows, context);
}

/// Index of the first story starting at or after token `end` of the story stream (stories
/// encoded with BOS, as the windows are): the first story wholly after the calibration windows.
inline int first_story_after(const depthkv::llama::Tokenizer& tok, const std::vector<std::string>& stories,
                             long long end) {
  long long pos = 0;
  for (std::size_t i = 0; i < stories.size(); ++i) {
    if (pos >= end) return static_cast<int>(i);
    pos += static_cast<long long>(tok.encode(stories[i], true, false).size());
  }
  return static_cast<int>(stories.size());
}

/// File name part of a path.
inline std::string base_name(const std::string& path) {
  const std::size_t s = path.find_last_of('/');
  return s == std::string::npos ? path : path.substr(s + 1);
}

/// Progress on stderr: a bar with ETA when stderr is a terminal, plain lines every ~10% otherwise.
class Progress {
 public:
  explicit Progress(std::string label) : label_(std::move(label)), tty_(isatty(2) != 0), t0_(clock::now()) {}
  void update(long long done, long long total) {
    if (total <= 0) return;
    const double f = static_cast<double>(done) / static_cast<double>(total);
    const double el = std::chrono::duration<double>(clock::now() - t0_).count();
    const double eta = done > 0 ? el * (1.0 - f) / f : 0.0;
    if (tty_) {
      const int width = 30, fill = static_cast<int>(f * width);
      std::fprintf(stderr, "\r%s [%s%s] %3.0f%% %lld/%lld  elapsed %.0fs  ETA %.0fs ", label_.c_str(),
                   std::string(static_cast<std::size_t>(fill), '#').c_str(),
                   std::string(static_cast<std::size_t>(width - fill), '.').c_str(), 100 * f, done, total, el, eta);
      if (done == total) std::fprintf(stderr, "\n");
    } else {
      const int decile = static_cast<int>(f * 10);
      if (decile > last_decile_ || done == total) {
        last_decile_ = decile;
        std::fprintf(stderr, "%s: %lld/%lld (%.0f%%), elapsed %.1fs, ETA %.1fs\n", label_.c_str(), done, total, 100 * f,
                     el, eta);
      }
    }
    std::fflush(stderr);
  }

 private:
  using clock = std::chrono::steady_clock;
  std::string label_;
  bool tty_;
  clock::time_point t0_;
  int last_decile_ = -1;
};

/// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace depthkv_cli
