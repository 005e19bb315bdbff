#pragma once
/// @file profile_io.hpp
/// @brief Profile files: the measured loss curves of a model (one set per token scorer), its
/// identity and the calibration description, as versioned JSON (nlohmann/json). Optional: not in
/// the umbrella header, because the core headers depend on Eigen only.
///
/// ## Schema (version 1)
/// @code{.json}
/// {
///   "format": "depthkv-profile", "version": 1,
///   "model": {"file": "stories260K.bin", "size": 1185376, "header_hash": "fnv1a64:0123456789abcdef",
///             "header_bytes": 65536},
///   "n_layers": 5,
///   "keep_ratios": [0.05, 0.1, 0.2, 0.3, 0.5, 0.75],
///   "metric": "kl",                                   // the matrix allocate/eval use by default
///   "calibration": {"text_file": "tinystories_valid.txt", "context": 384, "continuation": 128,
///                   "skip": 0, "samples": 24, "window_begin": 0, "window_end": 24, "description": "",
///                   "selection": {"sinks": 4, "recent": 16, "obs_window": 16, "kernel": 7,
///                                 "pooling": "max"},                                   // optional
///                   "documents": {"rule": "separator", "marker": "<|endoftext|>"}},      // optional
///   "scorers": {
///     "h2o": {"n_samples": 24,
///             "kl":   {"mean": [[...n_ratios...], ...n_layers...], "stderr": [[...]]},
///             "dnll": {"mean": [[...]], "stderr": [[...]]},
///             "top1": {"mean": [[...]], "stderr": [[...]]},
///             "done": [[1, 1, ...], ...],             // only in partial (resumable) files
///             "heads": {"n_kv_heads": 4, "n_samples": 24, "kl": {...}, "dnll": {...}, "top1": {...},
///                       "done": [[...]]}}              // optional: head curves, see below
///   },
///   "layer_metrics": {"infonce/post_attn": {"mean": [...], "ci_low": [...], "ci_high": [...]}}, // optional
///   "layer_window": [512, 512, 512, 512, 512, 0, ...],  // optional
///   "kv_shape": {"n_kv_heads": 1, "head_dim": 256}      // optional (byte reports)
/// }
/// @endcode
/// `layer_window` (optional; absent: every layer global) is the model's sliding window of each
/// layer, 0 for a global one (`llama::LlamaConfig::layer_window`): the allocator caps a local
/// layer at window - 1 tokens (`window_caps`), and a local layer's curve was measured with its
/// window applied.
/// `calibration.selection` (optional; files written before it existed lack it) records the token
/// selection the curves were measured under: a `PruneSpec`'s selection keys
/// (`prune_spec_to_json` with `SpecFields::kSelection`: protection, the scorer's observation
/// window, kernel and pooling; output-aware and head split only when not the defaults;
/// lookahead only when not 0). Curves measured under other protection describe another pruning,
/// so callers compare it with their own spec (`PruneSpec::same_selection`). The older spellings
/// are read by `selection_from_json` and `measured_selection`, the one legacy reader.
/// `scorers.<name>.heads` (optional; files without it have no head curves) holds the scorer's
/// per-(layer, KV head) curves: the same matrices with `n_layers * n_kv_heads` rows, row
/// l * n_kv_heads + h being "only KV head h of layer l keeps the ratio, everything else full"
/// (`head_optimal_budgets` reads them; `done` only while partial).
/// `calibration.eviction_chunk` (optional; absent = 0) is the prefill chunk after each of which
/// the curves' pruned layers were evicted (`EvalConfig::chunked_plans`); 0 means one eviction
/// after the whole context.
/// `calibration.documents` (optional) records how the calibration text was cut into documents
/// before tokenization (`llama::DocumentSplit`): rule
/// "opening", "separator" or "whole" and its marker. It is written only when the split is not the
/// default; a file without it was split by the default TinyStories rule (opening "Once upon a time").
/// Every problem on load (invalid JSON or nesting deeper than 64 levels, another format or
/// version, a missing key, a wrong type or shape, an integer outside its range (e.g. a count of
/// 2^31), a NaN/null or negative loss or one beyond 1e9 in magnitude, unsorted ratios, another
/// model, a directory) throws `depthkv::Error` naming the file and the key; a value of the wrong
/// type is described by its type and a bounded prefix, never printed whole.
///
/// @code
/// depthkv::ProfileFile f;
/// f.model = depthkv::model_identity("stories260K.bin");
/// f.n_layers = 5; f.keep_ratios = prof.state().keep_ratios();
/// f.scorers["h2o"] = prof.state();
/// depthkv::save_profile(f, "profile.json");
/// depthkv::ProfileFile g = depthkv::load_profile("profile.json", "stories260K.bin");  // checks identity
/// depthkv::SensitivityProfile p = g.profile("h2o");                                  // file's metric
/// @endcode

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "depthkv/detail/atomic_file.hpp"
#include "depthkv/error.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/sensitivity_profile.hpp"
#include "depthkv/sensitivity_profiler.hpp"

namespace depthkv {

namespace detail {

/// @throws Error "'path' is a directory, not a <kind> file" when it is one (an std::ifstream
///   opens a directory, and reading it gives no bytes: empty text, not an error)
inline void check_not_directory(const std::string& path, const char* kind) {
  std::error_code ec;
  DEPTHKV_CHECK(!std::filesystem::is_directory(path, ec), "'" << path << "' is a directory, not a " << kind << " file");
}

}  // namespace detail

/// Which model a profile was measured on.
struct ModelIdentity {
  std::string file_name;           ///< base name of the model file (informative; not compared)
  std::uint64_t size = 0;          ///< file size in bytes
  std::string header_hash;         ///< "fnv1a64:" + 16 hex digits of FNV-1a 64 over the first header_bytes
  std::uint64_t header_bytes = 0;  ///< bytes hashed (min(file size, the requested count))
};

/// Computes a model file's identity.
/// @param path the model file
/// @param header_bytes how many leading bytes to hash (default 64 KiB: header and first weights)
/// @return name, size and header hash
/// @throws Error when the file cannot be read
inline ModelIdentity model_identity(const std::string& path, std::uint64_t header_bytes = 65536) {
  detail::check_not_directory(path, "model");
  std::ifstream in(path, std::ios::binary);
  DEPTHKV_CHECK(in.good(), "cannot open model file '" << path << "'");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  ModelIdentity id;
  const std::size_t slash = path.find_last_of("/\\");
  id.file_name = slash == std::string::npos ? path : path.substr(slash + 1);
  id.size = size;
  id.header_bytes = std::min(size, header_bytes);
  std::vector<char> buf(static_cast<std::size_t>(id.header_bytes));
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  DEPTHKV_CHECK(static_cast<std::uint64_t>(in.gcount()) == id.header_bytes, "cannot read model file '" << path << "'");
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  for (char c : buf) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  id.header_hash = std::string("fnv1a64:") + hex;
  return id;
}

/// How the calibration text was cut into documents (rule "": not recorded, i.e. the default
/// TinyStories rule). The names are llama::DocumentSplit's.
struct DocumentRecord {
  std::string rule;    ///< "opening", "separator", "whole", or "" (not recorded)
  std::string marker;  ///< the opening or the separator ("" for "whole")

  /// @return whether a split was recorded
  bool recorded() const { return !rule.empty(); }
  /// @throws Error unless unrecorded (both empty) or a known rule (a non-empty separator, no
  ///   marker for "whole")
  void validate() const {
    if (rule.empty() && marker.empty()) return;
    DEPTHKV_CHECK(rule == "opening" || (rule == "separator" && !marker.empty()) || (rule == "whole" && marker.empty()),
                  "bad document split: rule '" << rule << "' with marker '" << marker
                                               << "' (rule opening, separator with a non-empty marker, or whole)");
  }
};

/// How the calibration samples were drawn (so that evaluation can refuse overlapping windows).
struct CalibrationInfo {
  std::string text_file;      ///< calibration text file (as given on the command line)
  int context = 0;            ///< context tokens per window (prefilled, then pruned)
  int continuation = 0;       ///< continuation tokens per window (scored)
  long long skip = 0;         ///< windows skipped before the first calibration window 
  int samples = 0;            ///< number of calibration windows
  long long window_begin = 0; ///< first window index used (windows of context + continuation tokens)
  long long window_end = 0;   ///< one past the last window index used
  std::string description;    ///< free text
  /// The token selection the curves were measured under (`PruneSpec::same_selection`'s fields;
  /// optional in the file). `measured_selection` also reads it from older files.
  std::optional<PruneSpec> selection;
  int eviction_chunk = 0;     ///< 0: evicted once after the context; N: after every N-token prefill chunk
  DocumentRecord documents;   ///< how the text was cut into documents (optional in the file)
};

/// Per-layer values of a representation metric (e.g. InfoNCE per stage) with a confidence interval.
struct LayerMetric {
  std::vector<double> mean, ci_low, ci_high;  ///< one entry per layer (ci_* may be empty)
};

/// One scorer's head curves: the profiler state over n_layers * n_kv_heads units (row
/// l * n_kv_heads + h).
struct HeadCurves {
  int n_kv_heads = 0;
  ProfilerState state;
};

/// A whole profile file (see the schema in the file comment).
///
/// @code
/// depthkv::ProfileFile f = depthkv::load_profile("profile.json");
/// if (!f.has_scorer("snapkv")) { /* refuse */ }
/// auto p = f.profile("snapkv", depthkv::LossMetric::kKL);
/// @endcode
struct ProfileFile {
  static constexpr int kVersion = 1;  ///< the schema version this depthkv writes and reads

  ModelIdentity model;
  int n_layers = 0;
  std::vector<double> keep_ratios;
  std::string metric = "kl";                        ///< default metric: "kl", "dnll" or "top1"
  CalibrationInfo calibration;
  std::map<std::string, ProfilerState> scorers;     ///< scorer name ("h2o", "snapkv", ...) -> measurements
  std::map<std::string, LayerMetric> layer_metrics; ///< e.g. "infonce/post_attn" -> per-layer values
  std::map<std::string, HeadCurves> head_curves;    ///< scorer name -> its head curves (optional)
  std::vector<int> layer_window;                    ///< per layer: sliding window, 0 = global (empty: all global)
  int kv_heads = 0, head_dim = 0;                   ///< the model's KV shape (0: not recorded), for byte reports

  /// @return whether the file holds measurements for `scorer`
  bool has_scorer(const std::string& scorer) const { return scorers.count(scorer) != 0; }

  /// @return the allocator-ready profile of `scorer` for `metric`
  /// @throws Error when the scorer is missing (the message lists the ones present) or incomplete
  SensitivityProfile profile(const std::string& scorer, LossMetric metric) const {
    const auto it = scorers.find(scorer);
    if (it == scorers.end()) {
      std::string have;
      for (const auto& kv : scorers) have += (have.empty() ? "" : ", ") + kv.first;
      DEPTHKV_FAIL("the profile has no measurements for scorer '" << scorer << "' (it has: "
                                                                   << (have.empty() ? "none" : have) << ")");
    }
    DEPTHKV_CHECK(it->second.complete(), "the profile of scorer '" << scorer << "' is incomplete ("
                                                                   << it->second.n_done() << " of "
                                                                   << it->second.done.size() << " runs)");
    return it->second.metrics.profile(metric);
  }
  /// @return the profile of `scorer` for the file's default metric
  SensitivityProfile profile(const std::string& scorer) const { return profile(scorer, parse_loss_metric(metric)); }

  /// @return whether the file holds complete head curves for `scorer`
  bool has_head_curves(const std::string& scorer) const {
    const auto it = head_curves.find(scorer);
    return it != head_curves.end() && it->second.state.complete();
  }

  /// @return the head curves of `scorer` for `metric` (n_layers * n_kv_heads rows), allocator-ready
  ///   for `head_optimal_budgets`
  /// @throws Error when the scorer has no head curves (the message says how to measure them) or
  ///   they are incomplete
  SensitivityProfile head_profile(const std::string& scorer, LossMetric metric) const {
    const auto it = head_curves.find(scorer);
    DEPTHKV_CHECK(it != head_curves.end(), "the profile has no head curves for scorer '"
                                               << scorer << "': measure them with depthkv profile --head-curves");
    DEPTHKV_CHECK(it->second.state.complete(), "the head curves of scorer '" << scorer << "' are incomplete ("
                                                                             << it->second.state.n_done() << " of "
                                                                             << it->second.state.done.size()
                                                                             << " runs)");
    return it->second.state.metrics.profile(metric);
  }
  /// @return the head curves of `scorer` for the file's default metric
  SensitivityProfile head_profile(const std::string& scorer) const {
    return head_profile(scorer, parse_loss_metric(metric));
  }

  /// Checks consistency: layer count and ratios shared by every scorer, valid matrices, a known
  /// metric, layer metrics of n_layers entries.
  /// @throws Error naming what is wrong
  void validate() const {
    DEPTHKV_CHECK(n_layers >= 1, "n_layers " << n_layers << " must be >= 1");
    DEPTHKV_CHECK(layer_window.empty() || static_cast<int>(layer_window.size()) == n_layers,
                  "'layer_window' has " << layer_window.size() << " entries for " << n_layers << " layers");
    for (int w : layer_window) DEPTHKV_CHECK(w >= 0, "'layer_window' holds " << w << " (must be >= 0)");
    parse_loss_metric(metric);
    if (calibration.selection) calibration.selection->validate();
    calibration.documents.validate();
    for (const auto& kv : scorers) {
      try {
        kv.second.validate();
      } catch (const Error& e) {
        DEPTHKV_FAIL("scorer '" << kv.first << "': " << e.message());
      }
      DEPTHKV_CHECK(kv.second.n_layers() == n_layers,
                    "scorer '" << kv.first << "' has " << kv.second.n_layers() << " layers, the file " << n_layers);
      DEPTHKV_CHECK(kv.second.keep_ratios() == keep_ratios, "scorer '" << kv.first << "' has other keep ratios");
    }
    for (const auto& kv : head_curves) {
      const std::string w = "scorers." + kv.first + ".heads";
      DEPTHKV_CHECK(scorers.count(kv.first) != 0, "'" << w << "': head curves of a scorer without layer curves");
      DEPTHKV_CHECK(kv.second.n_kv_heads >= 1, "'" << w << ".n_kv_heads' " << kv.second.n_kv_heads << " must be >= 1");
      try {
        kv.second.state.validate();
      } catch (const Error& e) {
        DEPTHKV_FAIL("'" << w << "': " << e.message());
      }
      DEPTHKV_CHECK(kv.second.state.n_layers() == n_layers * kv.second.n_kv_heads,
                    "'" << w << "' has " << kv.second.state.n_layers() << " rows, expected n_layers x n_kv_heads = "
                        << n_layers * kv.second.n_kv_heads);
      DEPTHKV_CHECK(kv.second.state.keep_ratios() == keep_ratios, "'" << w << "' has other keep ratios");
    }
    for (const auto& kv : layer_metrics) {
      const auto n = static_cast<std::size_t>(n_layers);
      DEPTHKV_CHECK(kv.second.mean.size() == n && (kv.second.ci_low.empty() || kv.second.ci_low.size() == n) &&
                        (kv.second.ci_high.empty() || kv.second.ci_high.size() == n),
                    "layer metric '" << kv.first << "' does not have " << n_layers << " entries");
      for (double v : kv.second.mean) DEPTHKV_CHECK(std::isfinite(v), "layer metric '" << kv.first << "' has a NaN");
    }
  }
};

namespace detail {

inline nlohmann::json matrix_to_json(const Eigen::MatrixXd& m) {
  nlohmann::json rows = nlohmann::json::array();
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    nlohmann::json row = nlohmann::json::array();
    for (Eigen::Index c = 0; c < m.cols(); ++c) row.push_back(m(r, c));
    rows.push_back(row);
  }
  return rows;
}

/// Reads j[key] (with a readable error when missing or of the wrong type).
inline const nlohmann::json& json_at(const nlohmann::json& j, const std::string& key, const std::string& where) {
  DEPTHKV_CHECK(j.is_object(), "'" << where << "' is not an object");
  const auto it = j.find(key);
  DEPTHKV_CHECK(it != j.end(), "missing key '" << where << (where.empty() ? "" : ".") << key << "'");
  return *it;
}

/// A bounded description of a JSON value for error messages: its type, and for a scalar its text
/// (a string cut to 40 bytes). Never the whole value: dumping an array nested 70,000 deep
/// recurses once per level, and a huge value would flood the message.
inline std::string json_brief(const nlohmann::json& j) {
  using nlohmann::json;
  const auto count = [](std::size_t n, const char* one) {
    return std::to_string(n) + " " + one + (n == 1 ? "" : "s");
  };
  switch (j.type()) {
    case json::value_t::array: return "an array of " + count(j.size(), "element");
    case json::value_t::object: return "an object of " + count(j.size(), "key");
    case json::value_t::string: {
      constexpr std::size_t kMax = 40;
      const std::string& s = j.get_ref<const std::string&>();
      const bool cut = s.size() > kMax;
      // replace: a cut inside a UTF-8 sequence prints U+FFFD instead of throwing
      return "the string " + json(cut ? s.substr(0, kMax) : s).dump(-1, ' ', false, json::error_handler_t::replace) +
             (cut ? "... (" + std::to_string(s.size()) + " bytes)" : "");
    }
    case json::value_t::discarded: return "a discarded value";
    default: return j.dump();  // null, a boolean or a number: a few characters
  }
}

/// The most layers a profile file may hold (so that layers x KV heads fits an int).
constexpr long long kMaxLayers = 65536;

/// The largest magnitude of a loss-curve value (a mean or standard error of KL, NLL increase or
/// top-1 disagreement per token): larger values are no measurement, and sums over layers and
/// the allocator's slopes must stay finite.
constexpr double kMaxLoss = 1e9;

/// The deepest nesting of arrays and objects `parse_json` accepts (a profile file needs 6).
constexpr int kMaxJsonDepth = 64;

/// Parses JSON text, refusing nesting deeper than `kMaxJsonDepth` while parsing (so that no
/// value deeper than that reaches code that walks it recursively).
/// @throws Error on invalid JSON (nlohmann's message, cut to 200 characters) or deeper nesting
inline nlohmann::json parse_json(const std::string& text) {
  const nlohmann::json::parser_callback_t limit = [](int depth, nlohmann::json::parse_event_t event,
                                                     nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth)
      throw Error("arrays or objects nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit);
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the offending token, which may be megabytes long: a bounded prefix
    constexpr std::size_t kMax = 200;
    const std::string m = e.what();
    throw Error(m.size() <= kMax ? m : m.substr(0, kMax) + "... (" + std::to_string(m.size()) + " characters)");
  }
}

inline double json_number(const nlohmann::json& j, const std::string& where) {
  DEPTHKV_CHECK(j.is_number(), "'" << where << "' is not a number (" << json_brief(j) << ")");
  const double v = j.get<double>();
  DEPTHKV_CHECK(std::isfinite(v), "'" << where << "' is not finite");
  return v;
}

inline long long json_integer(const nlohmann::json& j, const std::string& where) {
  DEPTHKV_CHECK(j.is_number_integer(), "'" << where << "' is not an integer (" << json_brief(j) << ")");
  DEPTHKV_CHECK(!j.is_number_unsigned() || j.get<std::uint64_t>() <= static_cast<std::uint64_t>(
                                                                         std::numeric_limits<long long>::max()),
                "'" << where << "' " << j.get<std::uint64_t>() << " is out of range");
  return j.get<long long>();
}

/// An integer in [lo, hi] (e.g. a count stored as int: a file value of 2^31 must not wrap).
/// @throws Error naming `where` and the range otherwise
inline long long json_integer(const nlohmann::json& j, const std::string& where, long long lo, long long hi) {
  const long long v = json_integer(j, where);
  DEPTHKV_CHECK(v >= lo && v <= hi, "'" << where << "' " << v << " is out of range [" << lo << ", " << hi << "]");
  return v;
}

/// An int field of the file: in [lo, INT_MAX].
inline int json_int(const nlohmann::json& j, const std::string& where, int lo = 0) {
  return static_cast<int>(json_integer(j, where, lo, std::numeric_limits<int>::max()));
}

inline std::string json_string(const nlohmann::json& j, const std::string& where) {
  DEPTHKV_CHECK(j.is_string(), "'" << where << "' is not a string (" << json_brief(j) << ")");
  return j.get<std::string>();
}

inline std::vector<double> json_vector(const nlohmann::json& j, const std::string& where) {
  DEPTHKV_CHECK(j.is_array(), "'" << where << "' is not an array");
  std::vector<double> v;
  for (std::size_t i = 0; i < j.size(); ++i) v.push_back(json_number(j[i], where + "[" + std::to_string(i) + "]"));
  return v;
}

inline Eigen::MatrixXd json_matrix(const nlohmann::json& j, const std::string& where, int rows, int cols) {
  DEPTHKV_CHECK(j.is_array() && static_cast<int>(j.size()) == rows,
                "'" << where << "' must be an array of " << rows << " rows (wrong shape)");
  Eigen::MatrixXd m(rows, cols);
  for (int r = 0; r < rows; ++r) {
    const std::string w = where + "[" + std::to_string(r) + "]";
    const std::vector<double> row = json_vector(j[static_cast<std::size_t>(r)], w);
    DEPTHKV_CHECK(static_cast<int>(row.size()) == cols, "'" << w << "' has " << row.size() << " entries, expected "
                                                            << cols << " (wrong shape)");
    for (int c = 0; c < cols; ++c) m(r, c) = row[static_cast<std::size_t>(c)];
  }
  return m;
}

/// A profiler state as a scorer entry: {"n_samples", "kl", "dnll", "top1" ({"mean", "stderr"}),
/// "done" only while incomplete}.
inline nlohmann::json state_to_json(const ProfilerState& s) {
  nlohmann::json e;
  e["n_samples"] = s.metrics.n_samples;
  auto put = [&](const char* name, const SensitivityProfile& p) {
    e[name] = {{"mean", matrix_to_json(p.loss)}, {"stderr", matrix_to_json(p.loss_stderr)}};
  };
  put("kl", s.metrics.kl);
  put("dnll", s.metrics.dnll);
  put("top1", s.metrics.top1);
  if (!s.complete()) {
    nlohmann::json done = nlohmann::json::array();
    for (int l = 0; l < s.n_layers(); ++l) {
      nlohmann::json row = nlohmann::json::array();
      for (std::size_t k = 0; k < s.keep_ratios().size(); ++k) row.push_back(s.is_done(l, static_cast<int>(k)) ? 1 : 0);
      done.push_back(row);
    }
    e["done"] = done;
  }
  return e;
}

/// The inverse of `state_to_json` for matrices of `rows` rows; errors name keys under `w`.
inline ProfilerState state_from_json(const nlohmann::json& j, const std::string& w, const std::vector<double>& ratios,
                                     int rows) {
  const int R = static_cast<int>(ratios.size());
  ProfilerState s;
  s.metrics.n_samples = json_int(json_at(j, "n_samples", w), w + ".n_samples");
  auto get = [&](const char* name, SensitivityProfile& p) {
    const auto& e = json_at(j, name, w);
    const std::string we = w + "." + name;
    p.keep_ratios = ratios;
    p.loss = json_matrix(json_at(e, "mean", we), we + ".mean", rows, R);
    p.loss_stderr = json_matrix(json_at(e, "stderr", we), we + ".stderr", rows, R);
    for (const auto* m : {&p.loss, &p.loss_stderr})
      for (Eigen::Index r = 0; r < m->rows(); ++r)
        for (Eigen::Index k = 0; k < m->cols(); ++k)
          DEPTHKV_CHECK(std::abs((*m)(r, k)) <= kMaxLoss,
                        "'" << we << (m == &p.loss ? ".mean" : ".stderr") << "[" << r << "][" << k << "]' "
                            << (*m)(r, k) << " is not a loss (|value| <= " << kMaxLoss << ")");
  };
  get("kl", s.metrics.kl);
  get("dnll", s.metrics.dnll);
  get("top1", s.metrics.top1);
  s.done.assign(static_cast<std::size_t>(rows) * static_cast<std::size_t>(R), 1);
  if (j.contains("done")) {
    const Eigen::MatrixXd d = json_matrix(j["done"], w + ".done", rows, R);
    for (int l = 0; l < rows; ++l) {
      for (int k = 0; k < R; ++k) {
        DEPTHKV_CHECK(d(l, k) == 0.0 || d(l, k) == 1.0, "'" << w << ".done' holds " << d(l, k) << " (0 or 1 expected)");
        s.done[static_cast<std::size_t>(l) * static_cast<std::size_t>(R) + static_cast<std::size_t>(k)] =
            d(l, k) == 1.0 ? 1 : 0;
      }
    }
  }
  return s;
}

}  // namespace detail

// ---- PruneSpec as JSON ----------------------------------------------------------------------------

/// Which fields `prune_spec_to_json` writes: the token selection (a profile's
/// `calibration.selection`) or the whole spec.
enum class SpecFields { kSelection, kAll };

/// A spec as JSON. The selection keys: "sinks", "recent", "obs_window", "kernel", "pooling";
/// "output_aware", "head_alloc", "head_alpha" only when `has_head_settings()`; "lookahead" and
/// "context_weight" only when not 0. `kAll` adds "scorer" (its name), "policy", "budget" ({"keep": r} or
/// {"tokens": n}), "schedule" ({"mode", "chunk", "interval"}) and "safeguard" ({"min_tokens":
/// -1 automatic | 0 off | N, "margin"}), and "tiers" only when not 0.
/// @throws Error when the spec is invalid (`PruneSpec::validate`)
inline nlohmann::json prune_spec_to_json(const PruneSpec& s, SpecFields fields = SpecFields::kAll) {
  s.validate();
  nlohmann::json j = {{"sinks", s.protection.n_sink},    {"recent", s.protection.n_recent},
                      {"obs_window", s.scorer.window},   {"kernel", s.scorer.kernel},
                      {"pooling", to_string(s.scorer.pooling)}};
  if (s.has_head_settings()) {
    j["output_aware"] = s.scorer.output_aware;
    j["head_alloc"] = to_string(s.head_split.mode);
    j["head_alpha"] = s.head_split.alpha;
  }
  if (s.scorer.lookahead != 0) j["lookahead"] = s.scorer.lookahead;
  if (s.scorer.context_weight != 0.0) j["context_weight"] = s.scorer.context_weight;
  if (s.scorer.span_pooling) j["span_pooling"] = true;
  if (fields == SpecFields::kSelection) return j;
  j["scorer"] = scorer_name(s.scorer);
  j["policy"] = to_string(s.policy);
  j["budget"] = s.budget.is_ratio() ? nlohmann::json{{"keep", s.budget.ratio()}}
                                    : nlohmann::json{{"tokens", s.budget.total_tokens()}};
  j["schedule"] = {{"mode", to_string(s.schedule.mode)}, {"chunk", s.schedule.chunk}, {"interval", s.schedule.interval}};
  j["safeguard"] = {{"min_tokens", s.safeguard.min_tokens()}, {"margin", s.safeguard.margin}};
  if (s.tiers != 0) j["tiers"] = s.tiers;
  return j;
}

namespace detail {

/// An integer of `j[key]` in [lo, 1e9], as `int` (the message names `where.key`).
inline int spec_int(const nlohmann::json& j, const char* key, const std::string& where, long long lo = 0) {
  return static_cast<int>(json_integer(json_at(j, key, where), where + "." + key, lo, 1000000000));
}

/// The selection keys of `prune_spec_to_json` into `s` (output_aware, head_alloc, head_alpha,
/// lookahead, context_weight optional).
inline void selection_keys_from_json(const nlohmann::json& j, const std::string& w, PruneSpec& s) {
  s.protection.n_sink = spec_int(j, "sinks", w);
  s.protection.n_recent = spec_int(j, "recent", w);
  s.scorer.window = spec_int(j, "obs_window", w);
  s.scorer.kernel = spec_int(j, "kernel", w);
  s.scorer.pooling = parse_pooling(json_string(json_at(j, "pooling", w), w + ".pooling"));
  if (j.contains("output_aware")) {
    DEPTHKV_CHECK(j["output_aware"].is_boolean(),
                  "'" << w << ".output_aware' must be a boolean, got " << json_brief(j["output_aware"]));
    s.scorer.output_aware = j["output_aware"].get<bool>();
  }
  if (j.contains("head_alloc")) s.head_split.mode = parse_head_allocation(json_string(j["head_alloc"], w + ".head_alloc"));
  if (j.contains("head_alpha")) s.head_split.alpha = json_number(j["head_alpha"], w + ".head_alpha");
  if (j.contains("lookahead")) s.scorer.lookahead = spec_int(j, "lookahead", w);
  if (j.contains("context_weight")) s.scorer.context_weight = json_number(j["context_weight"], w + ".context_weight");
  if (j.contains("span_pooling")) {
    DEPTHKV_CHECK(j["span_pooling"].is_boolean(),
                  "'" << w << ".span_pooling' must be a boolean, got " << json_brief(j["span_pooling"]));
    s.scorer.span_pooling = j["span_pooling"].get<bool>();
  }
}

/// The keys `kAll` adds, where present.
inline void spec_keys_from_json(const nlohmann::json& j, const std::string& w, PruneSpec& s) {
  if (j.contains("scorer")) s.scorer = scorer_config(json_string(j["scorer"], w + ".scorer"), s.scorer);
  if (j.contains("policy")) s.policy = parse_allocation_policy(json_string(j["policy"], w + ".policy"));
  if (j.contains("budget")) {
    const nlohmann::json& b = j["budget"];
    DEPTHKV_CHECK(b.is_object() && (b.contains("keep") != b.contains("tokens")),
                  "'" << w << ".budget' must be {\"keep\": r} or {\"tokens\": n}, got " << json_brief(b));
    s.budget = b.contains("keep") ? Budget::keep(json_number(b["keep"], w + ".budget.keep"))
                                  : Budget::tokens(json_integer(b["tokens"], w + ".budget.tokens"));
  }
  if (j.contains("schedule")) {
    const nlohmann::json& sc = j["schedule"];
    const std::string ws = w + ".schedule";
    s.schedule.mode = parse_schedule_mode(json_string(json_at(sc, "mode", ws), ws + ".mode"));
    s.schedule.chunk = spec_int(sc, "chunk", ws, 1);
    s.schedule.interval = spec_int(sc, "interval", ws, 1);
  }
  if (j.contains("safeguard")) {
    const nlohmann::json& g = j["safeguard"];
    const std::string wg = w + ".safeguard";
    s.safeguard = Safeguard::from_min_tokens(spec_int(g, "min_tokens", wg, -1));
    if (g.contains("margin")) s.safeguard.margin = spec_int(g, "margin", wg);
  }
  if (j.contains("tiers")) s.tiers = spec_int(j, "tiers", w);
}

/// The older spelling of a selection record, {"n_sink", "n_recent", "window", "kernel"}: the
/// observation window is `window` and the pooling max.
inline PruneSpec legacy_selection_from_json(const nlohmann::json& j, const std::string& w) {
  PruneSpec s;
  s.protection.n_sink = spec_int(j, "n_sink", w);
  s.protection.n_recent = spec_int(j, "n_recent", w);
  s.scorer.window = spec_int(j, "window", w);
  s.scorer.kernel = spec_int(j, "kernel", w);
  s.scorer.pooling = Pooling::kMax;
  return s;
}

}  // namespace detail

/// The inverse of `prune_spec_to_json`: the selection keys are required, the others optional
/// (absent: `PruneSpec`'s defaults).
/// @param where the JSON path named in errors
/// @throws Error naming the key on a missing selection key, a wrong type, a value out of range
///   or an invalid spec ("bad selection settings in 'where': ...")
inline PruneSpec prune_spec_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    DEPTHKV_CHECK(j.is_object(), "'" << where << "' is not an object");
    PruneSpec s;
    detail::selection_keys_from_json(j, where, s);
    detail::spec_keys_from_json(j, where, s);
    s.validate();
    return s;
  } catch (const Error& e) {
    DEPTHKV_FAIL("bad selection settings in '" << where << "': " << e.message());
  }
}

/// A profile's `calibration.selection`: `prune_spec_from_json`, or the older spelling
/// (`detail::legacy_selection_from_json`) when "sinks" is absent and "n_sink" present.
/// @throws Error as `prune_spec_from_json`
inline PruneSpec selection_from_json(const nlohmann::json& j, const std::string& where) {
  if (!(j.is_object() && !j.contains("sinks") && j.contains("n_sink"))) return prune_spec_from_json(j, where);
  try {
    PruneSpec s = detail::legacy_selection_from_json(j, where);
    s.validate();
    return s;
  } catch (const Error& e) {
    DEPTHKV_FAIL("bad selection settings in '" << where << "': " << e.message());
  }
}


/// The token selection a profile was measured under: its `calibration.selection`, or for files
/// written before that field existed, the selection the profile's writer put at the start of the
/// calibration description: "sinks=S window=W kernel=K" (recent = observation window = W, max
/// pooling) or "sinks=S recent=R obs_window=W kernel=K pooling=P" (`describe_selection`'s form).
/// This and `selection_from_json` are the one reader of older profile files.
/// @return the selection; empty when neither says (a profile written by other code)
inline std::optional<PruneSpec> measured_selection(const ProfileFile& f) {
  if (f.calibration.selection) return f.calibration.selection;
  const std::string& d = f.calibration.description;
  const std::size_t at = d.find("sinks=");
  if (at == std::string::npos) return std::nullopt;
  int sinks = 0, recent = 0, window = 0, kernel = 0;
  char pooling[8] = {};
  PruneSpec s;
  if (std::sscanf(d.c_str() + at, "sinks=%d recent=%d obs_window=%d kernel=%d pooling=%7s", &sinks, &recent, &window,
                  &kernel, pooling) == 5)
    s.scorer.pooling = parse_pooling(pooling);
  else if (std::sscanf(d.c_str() + at, "sinks=%d window=%d kernel=%d", &sinks, &window, &kernel) == 3)
    recent = window;
  else
    return std::nullopt;
  s.protection = {sinks, recent};
  s.scorer.window = window;
  s.scorer.kernel = kernel;
  return s;
}

/// @param f the profile file
/// @return its JSON document (schema version `ProfileFile::kVersion`)
/// @throws Error when `f` is inconsistent (`ProfileFile::validate`)
inline nlohmann::json profile_to_json(const ProfileFile& f) {
  f.validate();
  nlohmann::json j;
  j["format"] = "depthkv-profile";
  j["version"] = ProfileFile::kVersion;
  j["model"] = {{"file", f.model.file_name},
                {"size", f.model.size},
                {"header_hash", f.model.header_hash},
                {"header_bytes", f.model.header_bytes}};
  j["n_layers"] = f.n_layers;
  j["keep_ratios"] = f.keep_ratios;
  if (!f.layer_window.empty()) j["layer_window"] = f.layer_window;
  if (f.kv_heads > 0) j["kv_shape"] = {{"n_kv_heads", f.kv_heads}, {"head_dim", f.head_dim}};
  j["metric"] = f.metric;
  const CalibrationInfo& c = f.calibration;
  j["calibration"] = {{"text_file", c.text_file}, {"context", c.context},     {"continuation", c.continuation},
                      {"skip", c.skip},           {"samples", c.samples},     {"window_begin", c.window_begin},
                      {"window_end", c.window_end}, {"description", c.description}};
  if (c.eviction_chunk != 0) j["calibration"]["eviction_chunk"] = c.eviction_chunk;
  if (c.selection) j["calibration"]["selection"] = prune_spec_to_json(*c.selection, SpecFields::kSelection);
  if (c.documents.recorded())
    j["calibration"]["documents"] = {{"rule", c.documents.rule}, {"marker", c.documents.marker}};
  j["scorers"] = nlohmann::json::object();
  for (const auto& kv : f.scorers) {
    nlohmann::json e = detail::state_to_json(kv.second);
    const auto h = f.head_curves.find(kv.first);
    if (h != f.head_curves.end()) {
      e["heads"] = detail::state_to_json(h->second.state);
      e["heads"]["n_kv_heads"] = h->second.n_kv_heads;
    }
    j["scorers"][kv.first] = e;
  }
  if (!f.layer_metrics.empty()) {
    j["layer_metrics"] = nlohmann::json::object();
    for (const auto& kv : f.layer_metrics) {
      j["layer_metrics"][kv.first] = {{"mean", kv.second.mean}, {"ci_low", kv.second.ci_low}, {"ci_high", kv.second.ci_high}};
    }
  }
  return j;
}

namespace detail {

/// Reads a profile's "model" object `m` into `id`.
/// @throws Error on a missing key or a wrong type or range (the message names the key)
inline void model_identity_from_json(const nlohmann::json& m, ModelIdentity& id) {
  id.file_name = json_string(json_at(m, "file", "model"), "model.file");
  id.size = static_cast<std::uint64_t>(
      json_integer(json_at(m, "size", "model"), "model.size", 0, std::numeric_limits<long long>::max()));
  id.header_hash = json_string(json_at(m, "header_hash", "model"), "model.header_hash");
  id.header_bytes = static_cast<std::uint64_t>(json_integer(json_at(m, "header_bytes", "model"), "model.header_bytes", 0,
                                                            std::numeric_limits<long long>::max()));
}

/// Reads a profile's "calibration" object `c` into `cal`.
/// @throws Error on a missing key, a wrong type or range, bad selection settings or an empty
///         document rule (the message names the key)
inline void calibration_from_json(const nlohmann::json& c, CalibrationInfo& cal) {
  cal.text_file = json_string(json_at(c, "text_file", "calibration"), "calibration.text_file");
  cal.context = json_int(json_at(c, "context", "calibration"), "calibration.context");
  cal.continuation = json_int(json_at(c, "continuation", "calibration"), "calibration.continuation");
  cal.skip = json_int(json_at(c, "skip", "calibration"), "calibration.skip");
  cal.samples = json_int(json_at(c, "samples", "calibration"), "calibration.samples");
  cal.window_begin = json_int(json_at(c, "window_begin", "calibration"), "calibration.window_begin");
  cal.window_end = json_int(json_at(c, "window_end", "calibration"), "calibration.window_end");
  cal.description = json_string(json_at(c, "description", "calibration"), "calibration.description");
  if (c.contains("eviction_chunk")) {
    const long long v = json_integer(c["eviction_chunk"], "calibration.eviction_chunk");
    DEPTHKV_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(),
                  "calibration.eviction_chunk must be >= 0, got " << v);
    cal.eviction_chunk = static_cast<int>(v);
  }
  if (c.contains("selection")) cal.selection = selection_from_json(c["selection"], "calibration.selection");
  if (c.contains("documents")) {
    const auto& d = c["documents"];
    cal.documents.rule =
        json_string(json_at(d, "rule", "calibration.documents"), "calibration.documents.rule");
    cal.documents.marker =
        json_string(json_at(d, "marker", "calibration.documents"), "calibration.documents.marker");
    DEPTHKV_CHECK(cal.documents.recorded(), "'calibration.documents.rule' is empty");
  }
}

/// Reads a profile's "scorers" object `sc` (layer curves, and head curves where held) into `f`,
/// whose `keep_ratios` and `n_layers` are already read.
/// @throws Error on a wrong type, shape or value (the message names the key)
inline void scorers_from_json(const nlohmann::json& sc, ProfileFile& f) {
  DEPTHKV_CHECK(sc.is_object(), "'scorers' is not an object");
  for (auto it = sc.begin(); it != sc.end(); ++it) {
    const std::string w = "scorers." + it.key();
    f.scorers[it.key()] = state_from_json(*it, w, f.keep_ratios, f.n_layers);
    if (it->contains("heads")) {
      const auto& h = (*it)["heads"];
      const std::string wh = w + ".heads";
      const long long H = json_integer(json_at(h, "n_kv_heads", wh), wh + ".n_kv_heads");
      DEPTHKV_CHECK(H >= 1 && H <= 4096, "'" << wh << ".n_kv_heads' " << H << " is out of range");
      HeadCurves hc;
      hc.n_kv_heads = static_cast<int>(H);
      hc.state = state_from_json(h, wh, f.keep_ratios, f.n_layers * hc.n_kv_heads);
      f.head_curves[it.key()] = hc;
    }
  }
}

/// Reads a profile's "layer_metrics" object `lm` into `metrics`.
/// @throws Error on a wrong type or a missing "mean" (the message names the key)
inline void layer_metrics_from_json(const nlohmann::json& lm, std::map<std::string, LayerMetric>& metrics) {
  DEPTHKV_CHECK(lm.is_object(), "'layer_metrics' is not an object");
  for (auto it = lm.begin(); it != lm.end(); ++it) {
    const std::string w = "layer_metrics." + it.key();
    LayerMetric v;
    v.mean = json_vector(json_at(*it, "mean", w), w + ".mean");
    if (it->contains("ci_low")) v.ci_low = json_vector((*it)["ci_low"], w + ".ci_low");
    if (it->contains("ci_high")) v.ci_high = json_vector((*it)["ci_high"], w + ".ci_high");
    metrics[it.key()] = v;
  }
}

}  // namespace detail

/// @param j a JSON document
/// @return the profile file it holds
/// @throws Error on another format or version, a missing key, a wrong type or shape, NaN/null
///         values, negative losses, unsorted ratios (the message names the key)
inline ProfileFile profile_from_json(const nlohmann::json& j) {
  using namespace detail;
  DEPTHKV_CHECK(j.is_object(), "not a JSON object");
  DEPTHKV_CHECK(json_string(json_at(j, "format", ""), "format") == "depthkv-profile",
                "'format' is not \"depthkv-profile\"");
  const long long version = json_integer(json_at(j, "version", ""), "version");
  DEPTHKV_CHECK(version == ProfileFile::kVersion,
                "unsupported profile version " << version << " (this depthkv reads version " << ProfileFile::kVersion << ")");
  ProfileFile f;
  model_identity_from_json(json_at(j, "model", ""), f.model);
  f.n_layers = static_cast<int>(json_integer(json_at(j, "n_layers", ""), "n_layers", 1, kMaxLayers));
  f.keep_ratios = json_vector(json_at(j, "keep_ratios", ""), "keep_ratios");
  if (j.contains("layer_window")) {
    const nlohmann::json& lw = j["layer_window"];
    DEPTHKV_CHECK(lw.is_array(), "'layer_window' must be an array, got " << json_brief(lw));
    for (std::size_t i = 0; i < lw.size(); ++i)
      f.layer_window.push_back(json_int(lw[i], "layer_window[" + std::to_string(i) + "]"));
  }
  if (j.contains("kv_shape")) {
    f.kv_heads = json_int(json_at(j["kv_shape"], "n_kv_heads", "kv_shape"), "kv_shape.n_kv_heads", 1);
    f.head_dim = json_int(json_at(j["kv_shape"], "head_dim", "kv_shape"), "kv_shape.head_dim", 1);
  }
  f.metric = json_string(json_at(j, "metric", ""), "metric");
  calibration_from_json(json_at(j, "calibration", ""), f.calibration);
  scorers_from_json(json_at(j, "scorers", ""), f);
  if (j.contains("layer_metrics")) layer_metrics_from_json(j["layer_metrics"], f.layer_metrics);
  f.validate();
  return f;
}

/// Writes a profile file (pretty-printed JSON) atomically (detail/atomic_file.hpp): `path` holds
/// either its previous contents or the whole new file, also when the program is interrupted.
/// @param f the profile
/// @param path output path
/// A profile that `load_profile` would refuse (e.g. a loss beyond its bound, from a model whose
/// logits blow up) is not written.
/// @throws Error when `f` is inconsistent, when the reader would refuse it ("cannot write profile
///   file '<path>': it would not load: <reason>"), or when the file cannot be written ("cannot
///   write profile file '<path>': <reason>"); an existing file is then untouched
inline void save_profile(const ProfileFile& f, const std::string& path) {
  const nlohmann::json j = profile_to_json(f);
  try {
    (void)profile_from_json(j);
  } catch (const Error& e) {
    DEPTHKV_FAIL("cannot write profile file '" << path << "': it would not load: " << e.message());
  }
  // a path need not be UTF-8: invalid bytes become U+FFFD
  const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  detail::write_file_atomically(path, text, "profile file '" + path + "'", __func__);
}

/// Reads a profile file.
/// @param path the file
/// @return the profile
/// @throws Error naming the file and what is wrong (unreadable, invalid JSON, schema errors)
inline ProfileFile load_profile(const std::string& path) {
  detail::check_not_directory(path, "profile");
  std::ifstream in(path);
  DEPTHKV_CHECK(in.good(), "cannot open profile file '" << path << "'");
  std::stringstream ss;
  ss << in.rdbuf();
  DEPTHKV_CHECK(!in.bad(), "error reading profile file '" << path << "'");
  nlohmann::json j;
  try {
    j = detail::parse_json(ss.str());
  } catch (const Error& e) {
    DEPTHKV_FAIL("profile file '" << path << "' is not valid JSON: " << e.message());
  }
  try {
    return profile_from_json(j);
  } catch (const Error& e) {
    DEPTHKV_FAIL("profile file '" << path << "': " << e.message());
  }
  return {};
}

/// Checks that a profile was measured on the model with identity `id` (size and header hash;
/// the file name may differ).
/// @throws Error saying which model the profile belongs to
inline void check_model(const ProfileFile& f, const ModelIdentity& id) {
  DEPTHKV_CHECK(f.model.size == id.size && f.model.header_hash == id.header_hash && f.model.header_bytes == id.header_bytes,
                "the profile was measured on another model: profile '" << f.model.file_name << "' (" << f.model.size
                                                                       << " bytes, " << f.model.header_hash
                                                                       << "), model '" << id.file_name << "' ("
                                                                       << id.size << " bytes, " << id.header_hash << ")");
}

/// Reads a profile file and checks it belongs to the model file `model_path` (hashing as many
/// header bytes as the profile did).
/// @throws Error as `load_profile`, or when the model differs
inline ProfileFile load_profile(const std::string& path, const std::string& model_path) {
  ProfileFile f = load_profile(path);
  try {
    check_model(f, model_identity(model_path, f.model.header_bytes));
  } catch (const Error& e) {
    DEPTHKV_FAIL("profile file '" << path << "': " << e.message());
  }
  return f;
}

}  // namespace depthkv
