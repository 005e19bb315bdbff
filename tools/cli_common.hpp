#pragma once
// Shared pieces of the subcommands: list parsing, the keep-ratio range, token-selection
// settings, text windows, and a progress display on stderr.

#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "depthkv/detail/atomic_file.hpp"
#include "depthkv/detail/timer.hpp"
#include "depthkv/error.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/text_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/token_scorer.hpp"

namespace depthkv_cli {

namespace cli_detail {

/// Checks one numeric command-line value against [lo, hi] (`hi_text`: how the upper bound is
/// shown). @return an empty string, or why the value is refused: empty, not a number (the whole
/// text must be one), NaN, or outside the range. Integer texts are compared exactly (long
/// double holds every 64-bit integer), so "99999999999999999999" is refused instead of being
/// saturated to 2^63-1 by the option's conversion.
inline std::string numeric_error(const std::string& in, long double lo, long double hi, const std::string& range) {
  if (in.empty()) return "expected a number, got an empty value";
  char* end = nullptr;
  const long double v = std::strtold(in.c_str(), &end);
  if (end == in.c_str() || *end != '\0') return "expected a number, got '" + in + "'";
  if (!(v >= lo && v <= hi)) return "must be in " + range + ", got " + in;
  return std::string();
}

inline std::string bound_text(long double v) {
  std::ostringstream o;
  if (v == std::floor(v) && std::fabs(v) < 1e20L)
    o << std::fixed << std::setprecision(0) << v;  // integers in full: 18446744073709551615
  else
    o << std::setprecision(19) << v;
  return o.str();
}

}  // namespace cli_detail

/// The largest value `at_least` accepts: 2^63-1, the largest of the `long long` options.
inline constexpr long double kMaxOptionValue = 9223372036854775807.0L;

/// A CLI11 validator for numeric options: the value must be a number >= `min` and at most
/// kMaxOptionValue; an empty value, a text that is not a number and NaN are refused too (CLI11
/// alone turns '' into 0). E.g. `->check(at_least(0))` makes `--steps -1` an error
/// "--steps: must be >= 0, got -1" and `--steps ''` "--steps: expected a number, got an empty value".
inline CLI::Validator at_least(double min) {
  const std::string b = cli_detail::bound_text(min);
  const long double lo = min;
  return CLI::Validator(
      [lo, b](std::string& in) -> std::string {
        const std::string e = cli_detail::numeric_error(in, lo, kMaxOptionValue, "[" + b + ", 2^63-1]");
        if (!e.empty() && e.rfind("must be", 0) == 0) {
          if (std::strtold(in.c_str(), nullptr) > kMaxOptionValue)
            return "must be at most 2^63-1 (9223372036854775807), got " + in;
          return "must be >= " + b + ", got " + in;  // below min, or NaN
        }
        return e;
      },
      ">= " + b);
}

/// A CLI11 validator: the value must be a number in [lo, hi] (empty values, non-numbers and NaN
/// are refused).
inline CLI::Validator in_range(long double lo, long double hi) {
  const std::string b = "[" + cli_detail::bound_text(lo) + ", " + cli_detail::bound_text(hi) + "]";
  return CLI::Validator([lo, hi, b](std::string& in) -> std::string { return cli_detail::numeric_error(in, lo, hi, b); },
                        b);
}

/// A CLI11 validator: the value must be a number > `min` (empty values, non-numbers and NaN are
/// refused), at most kMaxOptionValue.
inline CLI::Validator greater_than(double min) {
  const std::string b = cli_detail::bound_text(min);
  const long double lo = min;
  return CLI::Validator(
      [lo, b](std::string& in) -> std::string {
        std::string e = cli_detail::numeric_error(in, lo, kMaxOptionValue, "(" + b + ", 2^63-1]");
        if (e.empty() && std::strtold(in.c_str(), nullptr) == lo) e = "must be > " + b + ", got " + in;
        return e;
      },
      "> " + b);
}

/// A CLI11 validator: the value must be a finite number (empty values, non-numbers, NaN and
/// infinities are refused); for options whose range the command checks itself (`--keep`).
inline CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const std::string e = cli_detail::numeric_error(in, -LDBL_MAX, LDBL_MAX, "finite");
        if (e.rfind("must be", 0) == 0) return "expected a finite number, got " + in;
        return e;
      },
      "NUMBER");
}

/// The validator of every `--threads`: [0, depthkv::llama::kMaxThreads] (0: OpenMP's default).
inline CLI::Validator thread_count() { return in_range(0, depthkv::llama::kMaxThreads); }

/// The validator of `--min-tokens`: -1 (the default safeguard floor) or a count >= 0.
inline CLI::Validator min_tokens_value() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        const std::string e = cli_detail::numeric_error(in, -1, 2147483647.0L, "[-1, 2147483647]");
        if (!e.empty()) {
          if (e.rfind("must be", 0) == 0)
            return "must be -1 (the default safeguard floor) or a count >= 0, got " + in;
          return e;
        }
        const long double v = std::strtold(in.c_str(), nullptr);
        if (v < 0 && v != -1) return "must be -1 (the default safeguard floor) or a count >= 0, got " + in;
        return std::string();
      },
      "-1 or >= 0");
}

/// Writes an output file through `write(std::ostream&)` atomically
/// (depthkv/detail/atomic_file.hpp): the path holds either its previous contents or the whole new
/// file, also when the program is interrupted; a full disk or a device that refuses the bytes
/// (/dev/full) is an error, not a success.
/// @param what what the file holds, for messages ("CSV", "gnuplot script")
/// @throws depthkv::Error "cannot write 'path' (<what>): <reason>" when it cannot be written
template <class Write>
void write_output_file(const std::string& path, const char* what, Write&& write) {
  std::ostringstream out(std::ios::binary);
  write(static_cast<std::ostream&>(out));
  depthkv::detail::write_file_atomically(path, out.str(), "'" + path + "' (" + what + ")", __func__);
}

/// Refuses a lookahead that does not fit the model's context after `context` tokens (what
/// `observe_lookahead` refuses too, but before any full run is spent).
/// @param what what the context is, for the message ("prompt", "--context")
/// @throws depthkv::Error naming --lookahead and the most that fits
inline void check_lookahead(int lookahead, long long context, int seq_len, const char* what) {
  DEPTHKV_CHECK(lookahead <= 0 || context + lookahead <= seq_len,
                "--lookahead " << lookahead << ": " << lookahead << " greedy tokens after the " << what << " of "
                               << context << " tokens do not fit the model's context of " << seq_len
                               << " tokens (at most " << std::max<long long>(0, seq_len - context) << ")");
}

/// A JSON document as text for output: file names given on the command line need not be UTF-8,
/// so invalid bytes are written as U+FFFD instead of failing after the work is done.
template <class Json>
std::string json_text(const Json& j, int indent = 2) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

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

/// The keep ratios every subcommand accepts: (0, 1].
/// @param flag the option that gave `keep` (eval's "--keeps", allocate's and generate's "--keep")
/// @throws depthkv::Error naming `flag` otherwise
inline void check_keep(double keep, const char* flag) {
  DEPTHKV_CHECK(keep > 0.0 && keep <= 1.0, flag << ": " << keep << " outside (0, 1]");
}

/// `--pooling` through the library's depthkv::parse_pooling.
/// @param name one of the library's pooling names ("none", "max" or "avg")
/// @throws depthkv::Error on another name: the library's message, prefixed with "--pooling: "
inline depthkv::Pooling parse_pooling(const std::string& name) {
  try {
    return depthkv::parse_pooling(name);
  } catch (const depthkv::Error& e) {
    std::string why = e.message();
    const std::string own = "parse_pooling: ";  // DEPTHKV_CHECK's prefix: said once, by this function
    if (why.compare(0, own.size(), own) == 0) why.erase(0, own.size());
    DEPTHKV_FAIL("--pooling: " << why);
  }
}

/// Token-selection settings of every subcommand: `--sinks`, `--recent`, `--obs-window`, `--kernel`,
/// `--pooling`, `--output-aware`, `--head-alloc` and `--head-alpha`. A profile describes what eval, allocate and generate prune only when they
/// agree; profile files record them in `calibration.selection` (a depthkv::SelectionRecord, same
/// names). Every subcommand has the same defaults, so that a profile measured with them describes
/// what eval, allocate and generate prune with them.
struct SelectionSettings {
  int sinks = 4;               ///< attention-sink tokens every head keeps
  int recent = 16;             ///< recent tokens every head keeps
  int obs_window = 16;         ///< SnapKV's observation window (queries scored); pyramid's window
  int kernel = 7;              ///< SnapKV's pooling kernel (odd)
  std::string pooling = "max"; ///< SnapKV's pooling: none, max or avg
  bool output_aware = false;   ///< output-aware (CriticalKV) rescaling of h2o, snapkv and tova scores
  std::string head_alloc = "uniform";  ///< cross-head split of each layer's budget: uniform or adaptive
  double head_alpha = depthkv::kDefaultHeadAlpha;  ///< the adaptive split's per-head floor fraction
  int lookahead = 0;           ///< greedy tokens after the context whose attention the scorers observe (0: off)
  double context_weight = 0;   ///< with a lookahead: the weight of the context's own window (ScorerConfig::context_weight)
  int tiers = 0;               ///< --tiers (allocate, eval): the optimal policy's tiers (0: no limit; PruneSpec::tiers)

  depthkv::Protection protection() const { return {sinks, recent}; }
  /// The spec these flags describe, with scorer `name` (budget, policy, schedule, safeguard: the
  /// spec's defaults; the request sets them).
  /// @throws depthkv::Error on an unknown scorer, pooling or head allocation
  depthkv::PruneSpec spec(const std::string& name) const {
    depthkv::PruneSpec s;
    s.scorer = depthkv::scorer_config(name);
    s.scorer.window = obs_window;
    s.scorer.kernel = kernel;
    s.scorer.pooling = parse_pooling(pooling);
    s.scorer.output_aware = output_aware;
    s.scorer.lookahead = lookahead;
    s.scorer.context_weight = lookahead > 0 ? context_weight : 0.0;
    s.protection = protection();
    s.head_split = {head_allocation(), head_alpha};
    return s;
  }
  depthkv::ScorerConfig scorer(const std::string& name) const { return spec(name).scorer; }
  depthkv::HeadAllocation head_allocation() const { return depthkv::parse_head_allocation(head_alloc); }
  /// @return "sinks=S recent=R obs_window=W kernel=K pooling=P" (and the output-aware / head
  ///   settings when they are not the defaults: depthkv::PruneSpec::describe_selection)
  std::string describe() const { return spec("h2o").describe_selection(); }
  /// @throws depthkv::Error on negative counts, an observation window < 1, an even or
  ///   non-positive kernel, an unknown pooling or head allocation, --head-alpha outside [0, 1],
  ///   or --context-weight > 0 without --lookahead
  void check() const {
    parse_pooling(pooling);
    DEPTHKV_CHECK(head_alloc == "uniform" || head_alloc == "adaptive",
                  "--head-alloc: unknown head allocation '" << head_alloc << "' (expected uniform or adaptive)");
    DEPTHKV_CHECK(sinks >= 0 && recent >= 0 && obs_window >= 1 && kernel >= 1 && kernel % 2 == 1 && lookahead >= 0,
                  "bad selection settings: " << describe()
                                             << " (--sinks, --recent, --lookahead >= 0; --obs-window >= 1; odd --kernel >= 1)");
    DEPTHKV_CHECK(context_weight == 0 || lookahead > 0,
                  "--context-weight " << context_weight << " needs --lookahead N > 0 (it weighs the context's window "
                                      << "beside the lookahead's queries)");
  }
  /// Registers --sinks, --recent, --obs-window, --kernel and --pooling on a subcommand, and makes
  /// the older spellings (`old_window`: what --window meant there; generate's --sink) errors that
  /// name the new flags.
  template <class App>
  void add_options(App* c, const std::string& old_window, bool old_sink = false) {
    c->add_option("--sinks", sinks, "attention-sink tokens every head keeps")->capture_default_str()->check(at_least(0));
    c->add_option("--recent", recent, "recent tokens every head keeps")->capture_default_str()->check(at_least(0));
    c->add_option("--obs-window", obs_window, "SnapKV observation window (last queries scored); pyramid's window")
        ->capture_default_str()
        ->check(at_least(1));
    c->add_option("--kernel", kernel, "SnapKV pooling kernel (odd)")->capture_default_str()->check(at_least(1));
    c->add_option("--pooling", pooling, "SnapKV pooling: none, max or avg")->capture_default_str();
    c->add_flag("--output-aware", output_aware,
                "output-aware scores (CriticalKV): h2o, snapkv and tova scores times ||W_o V||_1 per head");
    c->add_option("--head-alloc", head_alloc,
                  "split of each layer's budget across its KV heads: uniform, or adaptive (AdaKV: best tokens of "
                  "all heads, per-head floor --head-alpha)")
        ->capture_default_str();
    c->add_option("--head-alpha", head_alpha, "adaptive --head-alloc: each head keeps at least this fraction of the "
                                              "layer's per-head budget")
        ->capture_default_str()
        ->check(in_range(0, 1));
    c->add_option("--lookahead", lookahead,
                  "score by the attention of the model's next N greedy tokens after the context (decoded on the full "
                  "cache, then removed) instead of the context's queries; 0: off")
        ->capture_default_str()
        ->check(at_least(0));
    c->add_option("--context-weight", context_weight,
                  "with --lookahead: also observe the context's own last --obs-window queries, score = lookahead score "
                  "+ W x (SnapKV window score scaled to the lookahead's mass); 0: the lookahead alone")
        ->capture_default_str()
        ->check(at_least(0));
    renamed(c, "--window", old_window);
    if (old_sink) renamed(c, "--sink", "--sinks N");
  }

  /// Registers --tiers (allocate and eval): the optimal policy's budgets in at most K tiers.
  /// @param scope what the flag applies to, for the help text
  template <class App>
  void add_tiers_option(App* c, const std::string& scope) {
    c->add_option("--tiers", tiers,
                  "budgets of the optimal policy in at most K tiers (" + scope +
                      "): tiers of layers whose budgets differ by at most one token, for engines that share one "
                      "block table per group of layers (vLLM's KV-cache groups); the total stays exact; 0: no limit")
        ->capture_default_str()
        ->check(at_least(0));
  }

 private:
  /// A hidden option `old_name` whose use is an error naming its replacement.
  template <class App>
  static void renamed(App* c, const std::string& old_name, const std::string& replacement) {
    const std::string msg = old_name + " is no longer an option: use " + replacement;
    c->template add_option_function<std::string>(
         old_name, [msg](const std::string&) { throw depthkv::Error(msg); }, "")
        ->group("");
  }
};

/// `--preset NAME`: the library's named preset (depthkv::preset_spec, depthkv/preset.hpp, where
/// "best" is described) bound to the flags it sets. The protection (`--sinks`, `--recent`,
/// `--obs-window`, `--kernel`) stays the flags', and so does `--lookahead` when given. Any other
/// flag the preset sets cannot be given with it. Each request's scorer is chosen by
/// depthkv::preset (the candidate of the lowest predicted loss).
struct PresetSettings {

  std::string name;  ///< empty: no preset

  bool active() const { return !name.empty(); }
  /// Whether `--lookahead` was on the command line (after parsing; false before `add_option`).
  bool lookahead_given() const { return lookahead_given_ && lookahead_given_(); }

  /// Registers `--preset` on a subcommand whose other options are already registered; `sets`
  /// are the flags it excludes there (those of `apply` that the subcommand has).
  template <class App>
  void add_option(App* c, const std::vector<std::string>& sets) {
    auto* o = c->add_option("--preset", name,
                            "a named configuration: best (the README's: --output-aware snapkv (--pooling max) "
                            "and h2o, head-optimal budgets per KV head from head curves (profile: --head-curves), "
                            "--head-alloc uniform, --lookahead 32 unless given, per request the scorer of the lower "
                            "predicted loss; chosen on calibration windows, docs/results/preset.md, lookahead.md), or "
                            "retrieval (best with the snapkv-keydiff scorer, not output-aware, and each KV head keeping "
                            "at least half the uniform budget; chosen on RULER calibration tasks, docs/results/ruler.md)");
    o->type_name("NAME");
    for (const std::string& f : sets) o->excludes(f);
    const auto* lookahead = c->get_option_no_throw("--lookahead");
    lookahead_given_ = [lookahead] { return lookahead != nullptr && lookahead->count() > 0; };
    const auto* weight = c->get_option_no_throw("--context-weight");
    weight_given_ = [weight] { return weight != nullptr && weight->count() > 0; };
  }

  /// The scorers the preset chooses from for each request, in tie order (depthkv::preset_candidates).
  std::vector<std::string> candidates() const { return depthkv::preset_candidates(name); }

  /// The lookahead the request gives (`--lookahead` on the command line), if any.
  std::optional<int> lookahead(const SelectionSettings& sel) const {
    return lookahead_given() ? std::optional<int>(sel.lookahead) : std::nullopt;
  }
  /// The context weight the request gives (`--context-weight` on the command line), if any.
  std::optional<double> context_weight(const SelectionSettings& sel) const {
    return weight_given_ && weight_given_() ? std::optional<double>(sel.context_weight) : std::nullopt;
  }

  /// Sets the selection flags, the scorers (the candidates, comma-separated), the policy(-ies)
  /// and profile's head curves to the preset's spec (depthkv::preset_spec; each pointer may be null).
  /// @throws depthkv::Error on an unknown preset name
  void apply(SelectionSettings& sel, std::string* scorers, std::string* policies, bool* head_curves = nullptr) const {
    if (!active()) return;
    depthkv::check_preset_name(name, "--preset");
    const depthkv::PruneSpec base =
        depthkv::preset_spec(name, depthkv::PruneSpec{}, lookahead(sel), context_weight(sel));
    sel.pooling = depthkv::to_string(base.scorer.pooling);
    sel.output_aware = base.scorer.output_aware;
    sel.head_alloc = depthkv::to_string(base.head_split.mode);
    sel.head_alpha = base.head_split.alpha;
    sel.lookahead = base.scorer.lookahead;
    sel.context_weight = base.scorer.context_weight;
    if (scorers) {
      scorers->clear();
      for (const std::string& c : candidates()) *scorers += (scorers->empty() ? "" : ",") + c;
    }
    if (policies) *policies = depthkv::to_string(base.policy);
    if (head_curves) *head_curves = true;
  }

 private:
  std::function<bool()> lookahead_given_;  // whether --lookahead was on the command line
  std::function<bool()> weight_given_;     // whether --context-weight was on the command line
};

/// Decodes the escapes \n, \r, \t and \\ of a command-line value (so that a shell user can
/// type a separator such as '\n\n\n').
/// @throws depthkv::Error naming `flag` on another escape or a trailing backslash
inline std::string unescape(const std::string& s, const std::string& flag) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') {
      out += s[i];
      continue;
    }
    DEPTHKV_CHECK(i + 1 < s.size(), flag << ": '" << s << "' ends in a lone backslash (write \\\\ for one)");
    const char c = s[++i];
    if (c == 'n') out += '\n';
    else if (c == 'r') out += '\r';
    else if (c == 't') out += '\t';
    else if (c == '\\') out += '\\';
    else DEPTHKV_FAIL(flag << ": unknown escape '\\" << c << "' in '" << s << "' (known: \\n \\r \\t \\\\)");
  }
  return out;
}

/// The document split of a profile file's record (the default TinyStories rule when none is
/// recorded).
/// @throws depthkv::Error on an unknown rule
inline depthkv::llama::DocumentSplit document_split(const depthkv::DocumentRecord& r) {
  using depthkv::llama::DocumentSplit;
  if (!r.recorded()) return DocumentSplit();
  r.validate();
  if (r.rule == "opening") return DocumentSplit::opening(r.marker);
  if (r.rule == "separator") return DocumentSplit::separator(r.marker);
  return DocumentSplit::whole();
}

/// The record of a split for a profile file (unrecorded for the default, so that files of the
/// default split stay as they were).
inline depthkv::DocumentRecord document_record(const depthkv::llama::DocumentSplit& s) {
  if (s.is_default()) return {};
  return {s.rule_name(), s.marker};
}

/// `--doc-separator` and `--doc-opening` of profile and eval: how a --text file is cut into
/// documents (each encoded with BOS before it) before the token windows are cut.
struct DocumentSettings {
  depthkv::llama::DocumentSplit split;  ///< the TinyStories rule unless a flag was given
  bool given = false;                   ///< --doc-separator or --doc-opening was given

  /// Registers both flags (mutually exclusive, neither with --tokens) on a subcommand.
  /// @param default_help what applies when neither is given
  template <class App>
  void add_options(App* c, const std::string& default_help) {
    auto* sep = c->template add_option_function<std::string>(
        "--doc-separator",
        [this](const std::string& v) {
          split = depthkv::llama::DocumentSplit::separator(unescape(v, "--doc-separator"));
          given = true;
        },
        "documents of --text are the pieces between occurrences of STR (each trimmed of surrounding "
        "whitespace; \\n \\r \\t \\\\ are decoded; e.g. '<|endoftext|>'); an error when STR is not in the "
        "text. '' (empty): no splitting, windows over the whole text as one document");
    sep->type_name("STR");
    auto* open = c->template add_option_function<std::string>(
        "--doc-opening",
        [this](const std::string& v) {
          split = depthkv::llama::DocumentSplit::opening(unescape(v, "--doc-opening"));
          given = true;
        },
        "documents of --text start at blank-line-separated paragraphs beginning with STR (paragraphs "
        "joined with one newline; '': every paragraph is a document). Default: " +
            default_help);
    open->type_name("STR");
    sep->excludes(open);
    sep->excludes("--tokens");
    open->excludes("--tokens");
  }
};

/// The documents of `text` (read from `path`) under `split`.
/// @throws depthkv::Error naming the file and the flags when a separator is not in the text
inline std::vector<std::string> split_text(const std::string& text, const std::string& path,
                                           const depthkv::llama::DocumentSplit& split) {
  DEPTHKV_CHECK(split.rule != depthkv::llama::SplitRule::kSeparator || text.empty() ||
                    text.find(split.marker) != std::string::npos,
                "'" << path << "' does not contain the document " << split.describe()
                    << ": give the --doc-separator that is in it, or --doc-separator '' for no splitting");
  return depthkv::llama::split_documents(text, split);
}

/// Token windows of `context + continuation` tokens from a corpus (the splitting rule of
/// depthkv/llama/text_windows.hpp, documents cut by `split`), window indices [skip, skip + n).
/// @throws depthkv::Error when the text yields fewer windows than asked for
/// With `pre_tokenized`, `text_path` is a file of token ids (for models whose tokenizer depthkv
/// cannot run), `tok` may be null and `split` is not used.
inline std::vector<depthkv::llama::EvalWindow> load_windows(const std::string& text_path,
                                                            const depthkv::llama::TextTokenizer* tok, int context,
                                                            int continuation, int skip, int n,
                                                            bool pre_tokenized = false, int vocab_size = 0,
                                                            const depthkv::llama::DocumentSplit& split = {}) {
  DEPTHKV_CHECK(context >= 1 && continuation >= 2, "--context must be >= 1 and --continuation >= 2");
  DEPTHKV_CHECK(n >= 1 && skip >= 0, "--windows must be >= 1 and --skip >= 0");
  std::vector<int> ids;
  if (pre_tokenized) {
    ids = depthkv::llama::read_token_file(text_path, vocab_size);
  } else {
    DEPTHKV_CHECK(tok != nullptr, "no tokenizer for this model: pass --tokenizer FILE, or pre-tokenized input with --tokens FILE");
    ids = depthkv::llama::encode_stories(*tok, split_text(depthkv::llama::read_text_file(text_path), text_path, split));
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
inline int first_story_after(const depthkv::llama::TextTokenizer& tok, const std::vector<std::string>& stories,
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

using depthkv::detail::seconds_since;

}  // namespace depthkv_cli
