// depthkv._core.Engine: depthkv's own engine (depthkv/llama/engine.hpp) over a model file opened by
// `open_model` (GGUF or llama2.c with its tokenizer, depthkv/llama/open_model.hpp), and greedy
// generation on the library's prefill-evict-decode driver (`PrunedGeneration`,
// depthkv/llama/pruned_generation.hpp) with a spec in its JSON form (`prune_spec_from_json`),
// the curves its policy reads from a profile (`policy_curves`) and optionally a preset whose
// per-input rule serves the prompt. The GIL is released while the model is opened and while a
// sequence is generated (the engine is const and serves concurrent calls).

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include "common.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/open_model.hpp"
#include "depthkv/llama/output_projections.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/prune_spec.hpp"
#include "depthkv/scorer_registry.hpp"

namespace depthkv_py {
namespace {

using depthkv::ProfileFile;
using depthkv::PruneSpec;
namespace dl = depthkv::llama;

constexpr const char* kGenerate = "Engine.generate";

/// A JSON value as Python objects (dict, list, str, float, int, bool, None).
nb::object json_to_python(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

/// What one generation returns: the new tokens, the driver's report and the cache at the end.
struct GenerationResult {
  std::vector<int> tokens;
  dl::GenerationReport report;
  bool has_spec = false;
  std::vector<int> cache_lengths;  ///< tokens per layer at the end (largest head)
  std::size_t cache_bytes = 0;     ///< KV bytes the cache holds at the end
};

/// The engine of one model file (the model, its tokenizer, how the engine runs).
class Engine {
 public:
  Engine(const std::string& path, int n_threads, const std::string& kv_type, int chunk, const std::string& tokenizer)
      : path_(path), n_threads_(n_threads), chunk_(chunk), kv_type_(dl::parse_kv_type(kv_type)) {
    dl::check_thread_count(n_threads, "Engine: n_threads");
    DEPTHKV_CHECK_AS("Engine", chunk >= 1, "chunk must be >= 1, got " << chunk);
    dl::OpenModelOptions opt;
    opt.tokenizer_path = tokenizer;
    {
      nb::gil_scoped_release release;
      model_ = std::make_unique<dl::OpenedModel>(dl::open_model(path, opt));
      engine_ = std::make_unique<dl::LlamaEngine>(model_->model);
    }
  }

  const dl::LlamaConfig& config() const { return model_->model.config; }
  const std::string& path() const { return path_; }
  std::string format() const { return dl::to_string(model_->format); }
  std::string kv_type() const { return dl::kv_type_name(kv_type_); }
  int n_threads() const { return n_threads_; }
  int chunk() const { return chunk_; }
  std::optional<std::string> tokenizer_source() const {
    return model_->tokenizer ? std::optional<std::string>(model_->tokenizer_source) : std::nullopt;
  }
  std::optional<int> bos_id() const { return tok_id(&dl::TextTokenizer::bos_id); }
  std::optional<int> eos_id() const { return tok_id(&dl::TextTokenizer::eos_id); }

  /// Every layer's sliding window (0: a global layer).
  std::vector<int> layer_window() const { return config().windows(); }

  std::vector<int> tokenize(const std::string& text, bool bos) const {
    return tokenizer("tokenize").encode(text, bos, /*eos=*/false);
  }

  /// The bytes of `ids` as `depthkv generate` prints them: token i as it follows token i - 1, a
  /// leading BOS printing nothing (the first token otherwise as it follows BOS).
  nb::bytes detokenize(const std::vector<std::int64_t>& ids) const {
    const dl::TextTokenizer& tok = tokenizer("detokenize");
    const std::vector<int> t = checked_ids(ids, "detokenize", "ids");
    std::string out;
    int prev = tok.bos_id();
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (!(i == 0 && t[i] == tok.bos_id())) out += tok.decode(prev, t[i]);
      prev = t[i];
    }
    return nb::bytes(out.data(), out.size());
  }

  /// Engine.generate (see python/depthkv/__init__.py).
  GenerationResult generate(const std::vector<std::int64_t>& prompt_ids, long long max_new_tokens,
                            const std::optional<std::string>& spec_json, const ProfileFile* profile,
                            const std::string& preset, bool stop, const std::vector<std::int64_t>& suffix_ids) {
    const Prompt p = checked_prompt(prompt_ids, suffix_ids, max_new_tokens, kGenerate);
    const Run r = prepare(spec_json, profile, preset, p.prompt, kGenerate);
    GenerationResult out;
    nb::gil_scoped_release release;
    with_cache([&](auto make_cache) { run_on(make_cache(), p, r, stop, out); });
    return out;
  }

  /// Engine.generate_many (see python/depthkv/__init__.py): the runs with a oneshot spec or none
  /// share one prefill (`PrunedGeneration::prefill_shared`), each pruning its copy of the cache in
  /// turn (one copy alive at a time besides the shared cache); scheduled runs prefill on their own.
  std::vector<GenerationResult> generate_many(const std::vector<std::int64_t>& prompt_ids, long long max_new_tokens,
                                              const std::vector<std::optional<std::string>>& specs,
                                              const std::vector<const ProfileFile*>& profiles,  // null: none
                                              const std::vector<std::string>& presets, bool stop,
                                              const std::vector<std::int64_t>& suffix_ids) {
    constexpr const char* func = "Engine.generate_many";
    DEPTHKV_CHECK_AS(func, specs.size() == profiles.size() && specs.size() == presets.size(),
                     "specs, profiles and presets differ in length");
    const Prompt p = checked_prompt(prompt_ids, suffix_ids, max_new_tokens, func);
    std::vector<Run> runs;
    for (std::size_t i = 0; i < specs.size(); ++i) runs.push_back(prepare(specs[i], profiles[i], presets[i], p.prompt, func));
    std::vector<GenerationResult> out(runs.size());
    nb::gil_scoped_release release;
    with_cache([&](auto make_cache) {
      using Cache = decltype(make_cache());
      using Gen = dl::PrunedGeneration<Cache>;
      std::vector<std::unique_ptr<Gen>> gens(runs.size());
      std::vector<Gen*> shared;
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (runs[i].scheduled()) {
          run_on(make_cache(), p, runs[i], stop, out[i]);
          continue;
        }
        gens[i] = std::make_unique<Gen>(*engine_, make_cache(), runs[i].spec, runs[i].curves, runs[i].wo, runs[i].run,
                                        runs[i].preset);
        shared.push_back(gens[i].get());
      }
      if (shared.empty()) return;
      Cache full = make_cache();
      Gen::prefill_shared(shared, p.prompt, full);
      for (std::size_t i = 0; i < runs.size(); ++i) {
        if (!gens[i]) continue;
        decode(*gens[i], gens[i]->adopt(full), p, runs[i], stop, out[i]);
        gens[i].reset();  // its cache freed before the next copy
      }
    });
    return out;
  }

 private:
  /// A request's prompt and suffix as ints, checked against the vocabulary and the context.
  struct Prompt {
    std::vector<int> prompt, suffix;
    int n_new = 0;
  };
  /// One run's spec, the curves and projections it reads, and how the engine runs it.
  struct Run {
    std::optional<PruneSpec> spec;
    depthkv::PolicyCurves curves;
    const dl::OutputProjections* wo = nullptr;
    dl::ForwardOptions run;
    std::string preset;
    bool scheduled() const { return spec && spec->schedule.mode != depthkv::ScheduleMode::kOneshot; }
  };

  Prompt checked_prompt(const std::vector<std::int64_t>& prompt_ids, const std::vector<std::int64_t>& suffix_ids,
                        long long max_new_tokens, const char* func) const {
    const dl::LlamaConfig& c = config();
    Prompt p;
    p.prompt = checked_ids(prompt_ids, func, "prompt_ids");
    p.suffix = checked_ids(suffix_ids, func, "suffix_ids");
    DEPTHKV_CHECK_AS(func, !p.prompt.empty(), "prompt_ids holds no tokens (a prompt needs at least one, e.g. BOS)");
    DEPTHKV_CHECK_AS(func, max_new_tokens >= 0, "max_new_tokens must be >= 0, got " << max_new_tokens);
    const long long fed = static_cast<long long>(p.prompt.size() + p.suffix.size());
    const long long positions = fed + std::max(0LL, max_new_tokens - 1);
    DEPTHKV_CHECK_AS(func, positions <= c.seq_len,
                     "the prompt's " << fed << " tokens (suffix included) and max_new_tokens " << max_new_tokens
                                     << " need " << positions << " positions, beyond the model's context of "
                                     << c.seq_len);
    for (std::size_t i = 0; i < p.suffix.size(); ++i)
      DEPTHKV_CHECK_AS(func, p.suffix[i] >= 0 && p.suffix[i] < c.vocab_size,
                       "suffix_ids: token " << p.suffix[i] << " at position " << i << " is outside the vocabulary of "
                                            << c.vocab_size);
    p.n_new = static_cast<int>(max_new_tokens);
    return p;
  }

  /// The spec parsed and checked, the curves its policy reads, the projections of an
  /// output-aware scorer (made once, under the GIL, shared by later calls) and the run options.
  Run prepare(const std::optional<std::string>& spec_json, const ProfileFile* profile, const std::string& preset,
              const std::vector<int>& prompt, const char* func) {
    Run r;
    if (spec_json) r.spec = parse_spec(*spec_json);
    DEPTHKV_CHECK_AS(func, preset.empty() || r.spec,
                     "preset '" << preset << "' runs its per-input rule on its spec: pass spec=depthkv.preset('"
                                << preset << "', profile, keep=...) too");
    if (profile) check_profile(*profile, func);
    if (r.spec && profile) r.curves = depthkv::policy_curves(*profile, depthkv::scorer_name(r.spec->scorer), r.spec->policy);
    // span pooling: the prompt's words and digit runs (the suffix and the new tokens: spans of their own)
    if (r.spec && r.spec->scorer.span_pooling) r.curves.span_start = dl::token_span_starts(tokenizer(func), prompt);
    if (r.spec && r.spec->scorer.output_aware) {
      if (!wo_) wo_ = std::make_unique<dl::OutputProjections>(model_->model);
      r.wo = wo_.get();
    }
    r.run.n_threads = n_threads_;
    // a chunked schedule evicts after each of its chunks: the prefill runs in those
    r.run.chunk_size = r.spec && r.spec->schedule.mode == depthkv::ScheduleMode::kChunked ? r.spec->schedule.chunk : chunk_;
    r.preset = preset;
    return r;
  }

  /// Calls `f(make_cache)` with a maker of empty caches of the engine's KV type.
  template <class F>
  void with_cache(F&& f) const {
    if (kv_type_ == dl::KvType::kF16) f([this] { return engine_->make_cache<Eigen::half>(); });
    else f([this] { return engine_->make_cache(); });
  }

  std::optional<int> tok_id(int (dl::TextTokenizer::*f)() const) const {
    if (!model_->tokenizer) return std::nullopt;
    const int id = (*model_->tokenizer.*f)();
    return id < 0 ? std::nullopt : std::optional<int>(id);
  }

  const dl::TextTokenizer& tokenizer(const char* func) const {
    DEPTHKV_CHECK_AS(func, model_->tokenizer != nullptr,
                     "the model '" << path_ << "' has no tokenizer"
                                   << (model_->tokenizer_error.empty() ? std::string(": open it with tokenizer=FILE")
                                                                       : " (" + model_->tokenizer_error + ")"));
    return *model_->tokenizer;
  }

  /// `ids` as ints; an id that fits no int is refused here (the others by the driver and the tokenizer).
  static std::vector<int> checked_ids(const std::vector<std::int64_t>& ids, const char* func, const char* what) {
    std::vector<int> out;
    out.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      DEPTHKV_CHECK_AS(func, ids[i] >= std::numeric_limits<int>::min() && ids[i] <= std::numeric_limits<int>::max(),
                       what << ": token " << ids[i] << " at position " << i << " is not a token id");
      out.push_back(static_cast<int>(ids[i]));
    }
    return out;
  }

  static PruneSpec parse_spec(const std::string& text) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      DEPTHKV_FAIL("spec is not valid JSON: " << e.what());
    }
    return depthkv::prune_spec_from_json(j, "spec");
  }

  /// Refuses a profile of another model (`check_profile_matches`, as `depthkv generate --profile`).
  void check_profile(const ProfileFile& f, const char* func) const {
    try {
      dl::check_profile_matches(f, config(), path_);
    } catch (const depthkv::Error& e) {
      DEPTHKV_CHECK_AS(func, false, e.message());
    }
  }

  /// The prefill, the pruning, the suffix (teacher-forced on the pruned cache) and the greedy
  /// tokens on a cache of type `Cache` (no GIL).
  template <class Cache>
  void run_on(Cache cache, const Prompt& p, const Run& r, bool stop, GenerationResult& out) const {
    dl::PrunedGeneration<Cache> g(*engine_, std::move(cache), r.spec, r.curves, r.wo, r.run, r.preset);
    decode(g, g.prefill(p.prompt), p, r, stop, out);
  }

  /// After the prompt (its last `logits`): the suffix, then up to `p.n_new` greedy tokens.
  template <class Cache>
  void decode(dl::PrunedGeneration<Cache>& g, dl::RowMatrix logits, const Prompt& p, const Run& r, bool stop,
              GenerationResult& out) const {
    out.has_spec = r.spec.has_value();
    if (!p.suffix.empty()) logits = g.teacher_force(p.suffix).bottomRows(1);
    const dl::TextTokenizer* tok = model_->tokenizer.get();
    for (int i = 0; i < p.n_new; ++i) {
      const int next = dl::last_argmax(logits);
      // as `depthkv generate`: BOS delimits sequences; byte-level BPE also ends at EOS/EOT
      if (stop && tok && (next == tok->bos_id() || tok->ends_generation(next))) break;
      out.tokens.push_back(next);
      if (i + 1 < p.n_new) logits = g.step(next);
    }
    out.report = g.report();
    out.cache_lengths = g.cache().lengths();
    out.cache_bytes = g.cache().bytes();
  }

  std::string path_;
  int n_threads_ = 0, chunk_ = 1024;
  dl::KvType kv_type_ = dl::kDefaultKvType;
  std::unique_ptr<dl::OpenedModel> model_;  ///< on the heap: the engine and the projections point into it
  std::unique_ptr<dl::LlamaEngine> engine_;
  std::unique_ptr<dl::OutputProjections> wo_;
};

/// Engine.generate's result as a dict: "tokens" and "report" (GenerationReport's fields, the
/// cache at the end, the spec that chose the kept tokens).
nb::dict to_python(const GenerationResult& r) {
  const dl::GenerationReport& g = r.report;
  nb::dict rep;
  rep["spec"] = r.has_spec ? json_to_python(depthkv::prune_spec_to_json(g.spec)) : nb::none();
  rep["pruned"] = g.pruned;
  rep["budgets"] = g.prune.budgets;
  rep["head_budgets"] = g.prune.head_budgets.empty() ? nb::none() : nb::cast(g.prune.head_budgets);
  rep["lengths"] = g.prune.lengths;
  rep["bytes_before"] = g.prune.bytes_before;
  rep["bytes_after"] = g.prune.bytes_after;
  rep["raised_to_protection"] = g.raised_to_protection;
  rep["rule_ran"] = g.rule_ran;
  rep["trusted"] = g.trusted;
  rep["context_nll"] = g.context_nll;
  rep["nll_tokens"] = g.nll_tokens;
  rep["lookahead"] = g.lookahead;
  rep["prefill_ms"] = g.prefill_ms;
  rep["lookahead_ms"] = g.lookahead_ms;
  rep["peak_bytes"] = g.peak_bytes;
  rep["evictions"] = g.evictions;
  rep["schedule_ms"] = g.schedule_ms;
  rep["tokens_seen"] = g.tokens_seen;
  rep["cache_lengths"] = r.cache_lengths;
  rep["cache_bytes"] = r.cache_bytes;
  nb::dict out;
  out["tokens"] = r.tokens;
  out["report"] = rep;
  return out;
}

}  // namespace

void bind_engine(nb::module_& m) {
  nb::class_<Engine>(m, "Engine", "depthkv's engine over one model file: use depthkv.Engine")
      .def(nb::init<const std::string&, int, const std::string&, int, const std::string&>(), nb::arg("path"),
           nb::arg("n_threads"), nb::arg("kv_type"), nb::arg("chunk"), nb::arg("tokenizer"))
      .def_prop_ro("path", &Engine::path)
      .def_prop_ro("format", &Engine::format)
      .def_prop_ro("kv_type", &Engine::kv_type)
      .def_prop_ro("n_threads", &Engine::n_threads)
      .def_prop_ro("chunk", &Engine::chunk)
      .def_prop_ro("n_layers", [](const Engine& e) { return e.config().n_layers; })
      .def_prop_ro("n_heads", [](const Engine& e) { return e.config().n_heads; })
      .def_prop_ro("n_kv_heads", [](const Engine& e) { return e.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const Engine& e) { return e.config().head_dim; })
      .def_prop_ro("dim", [](const Engine& e) { return e.config().dim; })
      .def_prop_ro("vocab_size", [](const Engine& e) { return e.config().vocab_size; })
      .def_prop_ro("seq_len", [](const Engine& e) { return e.config().seq_len; })
      .def_prop_ro("architecture", [](const Engine& e) { return e.config().architecture; })
      .def_prop_ro("layer_window", &Engine::layer_window)
      .def_prop_ro("tokenizer_source", &Engine::tokenizer_source)
      .def_prop_ro("bos_id", &Engine::bos_id)
      .def_prop_ro("eos_id", &Engine::eos_id)
      .def("tokenize", &Engine::tokenize, nb::arg("text"), nb::arg("bos"))
      .def("detokenize", &Engine::detokenize, nb::arg("ids"))
      .def(
          "generate",
          [](Engine& e, const std::vector<std::int64_t>& ids, long long n, const std::optional<std::string>& spec,
             const ProfileFile* profile, const std::string& preset, bool stop,
             const std::vector<std::int64_t>& suffix) { return to_python(e.generate(ids, n, spec, profile, preset, stop, suffix)); },
          nb::arg("prompt_ids"), nb::arg("max_new_tokens"), nb::arg("spec").none(), nb::arg("profile").none(),
          nb::arg("preset"), nb::arg("stop"), nb::arg("suffix_ids"))
      .def(
          "generate_many",
          [](Engine& e, const std::vector<std::int64_t>& ids, long long n,
             const std::vector<std::optional<std::string>>& specs, const std::vector<nb::object>& profile_objs,
             const std::vector<std::string>& presets, bool stop, const std::vector<std::int64_t>& suffix) {
            std::vector<const ProfileFile*> profiles;  // None or a Profile each (checked by the wrapper)
            for (const nb::object& o : profile_objs) profiles.push_back(o.is_none() ? nullptr : nb::cast<const ProfileFile*>(o));
            nb::list out;
            for (const GenerationResult& r : e.generate_many(ids, n, specs, profiles, presets, stop, suffix))
              out.append(to_python(r));
            return out;
          },
          nb::arg("prompt_ids"), nb::arg("max_new_tokens"), nb::arg("specs"), nb::arg("profiles"),
          nb::arg("presets"), nb::arg("stop"), nb::arg("suffix_ids"));
}

}  // namespace depthkv_py
