#pragma once
/// @file scorer_registry.hpp
/// @brief The scorers a `TokenScorer` can run: the built-in ones (`ScorerKind`, rules in
/// scorers/*.hpp) and the ones registered at run time (`register_scorer`), by name
/// (`scorer_name`, `scorer_config`), and `make_scoring_rule`, which makes the `ScoringRule` of a
/// `ScorerConfig`.
///
/// ## Registering a scorer
/// A registered scorer is a `ScoringRule` (scoring_rule.hpp) plus a factory that makes one per
/// layer from `(config, n_heads, n_kv_heads)`. `register_scorer` adds it under a name (once per
/// process; the registry is process-wide and thread-safe); `scorer_config(name)` then gives the
/// `ScorerConfig` that selects it (`ScorerConfig::name`), which every part that takes a
/// `ScorerConfig` (`EvictionSchedule`, `make_scorers`, the evaluation) accepts.
///
/// @code
/// struct RecentRule : depthkv::ScoringRule { ... };   // scoring_rule.hpp
/// const depthkv::ScorerRegistration kRecent("recent", [](const depthkv::ScorerConfig&, int, int) {
///   return std::unique_ptr<depthkv::ScoringRule>(new RecentRule);
/// });
/// depthkv::PruneSpec spec;
/// spec.scorer = depthkv::scorer_config("recent");   // depthkv::scorer_name(spec.scorer) == "recent"
/// @endcode

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/scorers/h2o.hpp"
#include "depthkv/scorers/key_diff.hpp"
#include "depthkv/scorers/key_norm.hpp"
#include "depthkv/scorers/snapkv.hpp"
#include "depthkv/scorers/snapkv_keydiff.hpp"
#include "depthkv/scorers/tova.hpp"
#include "depthkv/scoring_rule.hpp"

namespace depthkv {

/// Makes the rule of one layer from the scorer configuration and the layer's head counts
/// (`n_heads` a positive multiple of `n_kv_heads`, checked before the call). It may throw
/// `Error` on a configuration it cannot run; it must not return null.
using ScoringRuleFactory =
    std::function<std::unique_ptr<ScoringRule>(const ScorerConfig& cfg, int n_heads, int n_kv_heads)>;

namespace detail {

/// The registered factories by name, behind a mutex.
struct ScorerRegistry {
  std::mutex mutex;
  std::map<std::string, ScoringRuleFactory> factories;
};

inline ScorerRegistry& scorer_registry() {
  static ScorerRegistry registry;
  return registry;
}

/// The built-in kinds, in `ScorerKind` order.
inline const std::vector<ScorerKind>& builtin_scorer_kinds() {
  static const std::vector<ScorerKind> kinds = {ScorerKind::kH2O,    ScorerKind::kH2OValueL1, ScorerKind::kH2OValueL2,
                                                ScorerKind::kSnapKV, ScorerKind::kTOVA,       ScorerKind::kKeyNorm,
                                                ScorerKind::kKeyDiff, ScorerKind::kSnapKVKeyDiff};
  return kinds;
}

/// The built-in kind named `name`, or false.
inline bool find_builtin_scorer(const std::string& name, ScorerKind& kind) {
  for (ScorerKind k : builtin_scorer_kinds())
    if (to_string(k) == name) {
      kind = k;
      return true;
    }
  return false;
}

/// The rule of a built-in kind (the one place that maps a `ScorerKind` to its rule type).
inline std::unique_ptr<ScoringRule> make_builtin_rule(const ScorerConfig& cfg, int n_kv_heads) {
  switch (cfg.kind) {
    case ScorerKind::kH2O:
      return std::make_unique<H2ORule>(H2ORule::ValueNorm::kNone, n_kv_heads);
    case ScorerKind::kH2OValueL1:
      return std::make_unique<H2ORule>(H2ORule::ValueNorm::kL1, n_kv_heads);
    case ScorerKind::kH2OValueL2:
      return std::make_unique<H2ORule>(H2ORule::ValueNorm::kL2, n_kv_heads);
    case ScorerKind::kSnapKV:
      return std::make_unique<SnapKVRule>(cfg, n_kv_heads);
    case ScorerKind::kTOVA:
      return std::make_unique<TOVARule>(n_kv_heads);
    case ScorerKind::kKeyNorm:
      return std::make_unique<KeyNormRule>();
    case ScorerKind::kKeyDiff:
      return std::make_unique<KeyDiffRule>();
    case ScorerKind::kSnapKVKeyDiff:
      return std::make_unique<SnapKVKeyDiffRule>(cfg, n_kv_heads);
  }
  DEPTHKV_FAIL("unknown scorer kind " << static_cast<int>(cfg.kind));
}

/// "a, b or c" (a single name alone).
inline std::string join_or(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) s += i + 1 == names.size() ? " or " : ", ";
    s += names[i];
  }
  return s;
}

/// Whether `name` may name a registered scorer: non-empty, letters, digits and "_.+-" only.
inline bool valid_scorer_name(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && c != '_' && c != '.' && c != '+' && c != '-') return false;
  }
  return true;
}

/// The factory registered under `name`, or null.
inline ScoringRuleFactory find_scorer_factory(const std::string& name) {
  ScorerRegistry& r = scorer_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.factories.find(name);
  return it == r.factories.end() ? ScoringRuleFactory() : it->second;
}

}  // namespace detail

/// The names of the registered scorers, sorted.
inline std::vector<std::string> registered_scorers() {
  detail::ScorerRegistry& r = detail::scorer_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& f : r.factories) names.push_back(f.first);
  return names;
}

/// Every scorer name: the built-in ones in `ScorerKind` order ("h2o", "h2o-v1", "h2o-v2",
/// "snapkv", "tova", "knorm", "keydiff", "snapkv-keydiff"), then the registered ones, sorted.
inline std::vector<std::string> known_scorers() {
  std::vector<std::string> names;
  for (ScorerKind k : detail::builtin_scorer_kinds()) names.push_back(to_string(k));
  for (std::string& n : registered_scorers()) names.push_back(std::move(n));
  return names;
}

/// Registers a scorer under `name` (process-wide, thread-safe; e.g. once at start-up, or at
/// namespace scope through `ScorerRegistration`).
/// @param name letters, digits and "_.+-", not a built-in name nor a registered one
/// @param factory makes the rule of one layer (non-null)
/// @throws Error on an invalid or taken name or a null factory; nothing is registered then
inline void register_scorer(const std::string& name, ScoringRuleFactory factory) {
  DEPTHKV_CHECK(detail::valid_scorer_name(name),
                "invalid scorer name '" << name << "' (non-empty; letters, digits and _ . + - only)");
  DEPTHKV_CHECK(factory != nullptr, "scorer '" << name << "': null factory");
  ScorerKind k = ScorerKind::kH2O;
  DEPTHKV_CHECK(!detail::find_builtin_scorer(name, k), "scorer '" << name << "' is built in; choose another name");
  detail::ScorerRegistry& r = detail::scorer_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  DEPTHKV_CHECK(r.factories.count(name) == 0, "scorer '" << name << "' is already registered");
  r.factories.emplace(name, std::move(factory));
}

/// Registers a scorer when constructed: one line at namespace scope,
/// `const depthkv::ScorerRegistration kMine("mine", make_mine);`.
struct ScorerRegistration {
  /// @throws Error as `register_scorer`
  ScorerRegistration(const std::string& name, ScoringRuleFactory factory) { register_scorer(name, std::move(factory)); }
};

/// The scorer's name: `cfg.name` when set, else `to_string(cfg.kind)` ("h2o", "snapkv", ...).
inline std::string scorer_name(const ScorerConfig& cfg) { return cfg.name.empty() ? to_string(cfg.kind) : cfg.name; }

/// `base` with its scorer set to `name`: a built-in name sets `kind` and clears `name`; a
/// registered name sets `name` (and leaves `kind`, which is then ignored). The other fields of
/// `base` are kept.
/// @throws Error on an unknown name, listing every known one (built-in, then registered)
inline ScorerConfig scorer_config(const std::string& name, ScorerConfig base = {}) {
  ScorerKind k = ScorerKind::kH2O;
  if (detail::find_builtin_scorer(name, k)) {
    base.kind = k;
    base.name.clear();
    return base;
  }
  DEPTHKV_CHECK(detail::find_scorer_factory(name) != nullptr,
                "unknown scorer kind '" << name << "' (expected " << detail::join_or(known_scorers()) << ")");
  base.name = name;
  return base;
}

/// The rule of one layer for `cfg`: the built-in kind's (`cfg.name` empty), or the factory's
/// registered under `cfg.name`.
/// @throws Error when `cfg.name` is a built-in name (select those by `kind`) or unknown, from the
///   factory, or when the factory returns null
inline std::unique_ptr<ScoringRule> make_scoring_rule(const ScorerConfig& cfg, int n_heads, int n_kv_heads) {
  if (cfg.name.empty()) return detail::make_builtin_rule(cfg, n_kv_heads);
  ScorerKind k = ScorerKind::kH2O;
  DEPTHKV_CHECK(!detail::find_builtin_scorer(cfg.name, k),
                "ScorerConfig::name '" << cfg.name << "' is a built-in scorer: select it by kind (scorer_config does)");
  const ScoringRuleFactory factory = detail::find_scorer_factory(cfg.name);
  DEPTHKV_CHECK(factory != nullptr,
                "unknown scorer kind '" << cfg.name << "' (expected " << detail::join_or(known_scorers()) << ")");
  std::unique_ptr<ScoringRule> rule = factory(cfg, n_heads, n_kv_heads);
  DEPTHKV_CHECK(rule != nullptr, "scorer '" << cfg.name << "': the factory returned no rule");
  return rule;
}

}  // namespace depthkv
