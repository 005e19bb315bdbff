// depthkv analyze: the DepthKV paper's analysis on our models. Per stage, the
// Spearman rank correlation across layers between each representation metric (InfoNCE,
// effective rank, spectral entropy; depthkv/llama/representation_probe.hpp) and the measured
// per-layer sensitivity (the profile's loss when only that layer keeps the ratio --layer-keep,
// default 0.2, for each scorer in the profile), with its two-sided p-value (exact permutation test for
// up to 9 layers).
//
// Metrics: read from the profile's layer_metrics when all of them are present (written by
// `depthkv profile --metrics infonce` or by `--write` here), else computed with --samples stories
// of --text. Probe texts: documents of --text (split as the profile records; by default the
// TinyStories rule) after skipping --skip of them; by default (--skip -1) the first one that
// starts after the profile's last calibration window, so the probe texts are disjoint from the
// calibration text (when --text is the calibration text).
//
// Reading the sign: the paper marks a layer with LOWER InfoNCE as MORE critical, so InfoNCE is a
// good predictor when its rho with the sensitivity is NEGATIVE. With 4-6 layers the test has
// almost no power: for n = 5 the smallest two-sided p is 2/120 = 0.017 (|rho| = 1), for n = 4
// it is 2/24 = 0.083, i.e. never significant at 0.05. Both are printed: all layers, and
// layers 1..L-1 (what mga/mlma* actually split: layer 0 is never pruned).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/error.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/representation_probe.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/representation_metrics.hpp"
#include "depthkv/sensitivity_profile.hpp"
#include "flag_alias.hpp"
#include "model_io.hpp"

namespace depthkv_cli {
namespace {

struct AnalyzeArgs {
  std::string model, tokenizer, profile, text, write;
  int samples = 64;
  int skip = -1;
  double layer_keep = 0.2;
  double tau = 0.1;
  int batch = 16;
  unsigned long long seed = 0;
  int max_tokens = 0;
  int threads = 0;
  bool recompute = false;
  bool json = false;
};

const char* kMetrics[] = {"infonce", "erank", "sentropy"};

/// @return whether the profile holds every representation metric of every stage
bool has_all_metrics(const depthkv::ProfileFile& f) {
  for (auto st : depthkv::llama::representation_stages())
    for (const char* m : kMetrics)
      if (!f.layer_metrics.count(std::string(m) + "/" + depthkv::to_string(st))) return false;
  return true;
}

std::string fmt(double v, const char* f = "%.4f") {
  if (!std::isfinite(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// Computes the representation metrics of --samples probe stories of --text into `prof` (and
/// into --write), and records the probe in out["probe"].
/// @return where the metrics come from, for the report
std::string compute_metrics(const AnalyzeArgs& a, depthkv::ProfileFile& prof, nlohmann::json& out) {
  using namespace depthkv;
  using namespace depthkv::llama;
  DEPTHKV_CHECK(!a.text.empty(), "the profile has no representation metrics: give --text FILE to compute them");
  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/true);
  const LlamaEngine engine(lm.model);
  const std::vector<std::string> stories =  // split as the profile's calibration text was
      split_text(read_text_file(a.text), a.text, document_split(prof.calibration.documents));
  int skip = a.skip;
  if (skip < 0) {
    const long long end = prof.calibration.window_end *
                          static_cast<long long>(prof.calibration.context + prof.calibration.continuation);
    skip = first_story_after(*lm.tokenizer, stories, end);
  }
  DEPTHKV_CHECK(a.samples >= 2, "--samples must be >= 2, got " << a.samples);
  DEPTHKV_CHECK(static_cast<long long>(stories.size()) >= static_cast<long long>(skip) + a.samples,
                "'" << a.text << "' has " << stories.size() << " stories; asked for " << a.samples << " after skipping "
                    << skip);
  const std::vector<std::string> texts(stories.begin() + skip, stories.begin() + skip + a.samples);
  ProbeOptions opt;
  opt.seed = a.seed;
  opt.infonce.temperature = a.tau;
  opt.infonce.batch_size = a.batch;
  opt.max_tokens = a.max_tokens;
  opt.n_threads = a.threads;
  Progress progress("probe");
  opt.progress = [&](int done, int total) { progress.update(done, total); };
  const ProbeResult r = probe_representations(engine, *lm.tokenizer, texts, opt);
  write_layer_metrics(prof, r);
  long long tok = 0;
  for (int i = 0; i < r.n_samples; ++i) tok += r.tokens[static_cast<std::size_t>(i)] + r.tokens_perturbed[static_cast<std::size_t>(i)];
  std::fprintf(stderr,
               "probe: %d stories %d..%d of %s (%d cut to %d tokens), %lld forward passes, %lld tokens, "
               "%.2fs (forward %.2fs, metrics %.2fs)\n",
               a.samples, skip, skip + a.samples - 1, base_name(a.text).c_str(), r.truncated,
               opt.max_tokens > 0 ? opt.max_tokens : lm.model.config.seq_len, r.forward_passes, tok, r.seconds_total,
               r.seconds_forward, r.seconds_metrics);
  out["probe"] = {{"text", a.text},       {"skip", skip},          {"samples", a.samples},
                  {"tau", a.tau},         {"batch", a.batch},      {"seed", a.seed},
                  {"truncated", r.truncated}, {"forward_passes", r.forward_passes}, {"tokens", tok},
                  {"seconds", r.seconds_total}};
  if (!a.write.empty()) {
    save_profile(prof, a.write);
    std::fprintf(stderr, "analyze: wrote the metrics into '%s'\n", a.write.c_str());
  }
  return std::to_string(a.samples) + " stories from " + std::to_string(skip) + " of '" + base_name(a.text) + "'";
}

/// Per scorer of the profile: each layer's KL when only that layer keeps `keep`.
std::map<std::string, std::vector<double>> sensitivities(const depthkv::ProfileFile& prof, double keep) {
  std::map<std::string, std::vector<double>> sens;
  for (const auto& kv : prof.scorers) {
    const depthkv::SensitivityProfile p = prof.profile(kv.first, depthkv::LossMetric::kKL);
    std::vector<double> v;
    for (int l = 0; l < prof.n_layers; ++l) v.push_back(p.loss_at(l, keep));
    sens[kv.first] = v;
  }
  return sens;
}

/// Why a correlation is undefined: "constant <metric>" and/or "constant sensitivity (<scorer>)".
std::string undefined_reason(const depthkv::Correlation& c, const std::string& metric, const std::string& scorer) {
  std::string why = "constant series: ";
  if (c.x_constant) why += metric + " is the same in every layer";
  if (c.x_constant && c.y_constant) why += "; ";
  if (c.y_constant) why += "the " + scorer + " sensitivity is the same in every layer";
  return why;
}

/// Spearman rho and p of every (stage, metric, scorer) across all layers and across layers 1..L-1.
/// A correlation with a constant series is undefined: its row holds "undefined" (or
/// "undefined_no_layer0") with the reason instead of "rho" and "p" (the text report prints
/// "undefined" and lists the reasons below the table).
nlohmann::json correlations(const depthkv::ProfileFile& prof, const std::map<std::string, std::vector<double>>& sens) {
  using namespace depthkv;
  using namespace depthkv::llama;
  const int L = prof.n_layers;
  nlohmann::json corr = nlohmann::json::array();
  for (auto st : representation_stages()) {
    for (const char* m : kMetrics) {
      const std::string key = std::string(m) + "/" + to_string(st);
      const std::vector<double>& x = prof.layer_metrics.at(key).mean;
      for (const auto& kv : sens) {
        const Correlation all = spearman(x, kv.second);
        nlohmann::json row = {{"stage", to_string(st)}, {"metric", m}, {"scorer", kv.first}, {"exact", all.exact}};
        // an undefined correlation (a constant series) has no "rho" / "p" but "undefined": the reason
        const auto put = [&](const Correlation& c, const std::string& rho, const std::string& p, const std::string& why) {
          if (c.defined()) {
            row[rho] = c.rho;
            row[p] = c.p_value;
          } else {
            row[why] = undefined_reason(c, key, kv.first);
          }
        };
        put(all, "rho", "p", "undefined");
        if (L - 1 >= 3) {
          const Correlation rest = spearman(std::vector<double>(x.begin() + 1, x.end()),
                                            std::vector<double>(kv.second.begin() + 1, kv.second.end()));
          put(rest, "rho_no_layer0", "p_no_layer0", "undefined_no_layer0");
        }
        corr.push_back(row);
      }
    }
  }
  return corr;
}

/// Prints the per-layer table: each scorer's sensitivity, then each stage's InfoNCE (with its CI when held).
void print_sensitivity_table(const depthkv::ProfileFile& prof,
                             const std::map<std::string, std::vector<double>>& sens) {
  using namespace depthkv;
  using namespace depthkv::llama;
  const int L = prof.n_layers;
  std::printf("\nper layer:\n%-6s", "layer");
  for (const auto& kv : sens) std::printf(" %12s", ("KL " + kv.first).c_str());
  for (auto st : representation_stages()) std::printf(" %26s", ("infonce/" + to_string(st)).c_str());
  std::printf("\n");
  for (int l = 0; l < L; ++l) {
    std::printf("%-6d", l);
    for (const auto& kv : sens) std::printf(" %12s", fmt(kv.second[static_cast<std::size_t>(l)], "%.5f").c_str());
    for (auto st : representation_stages()) {
      const LayerMetric& m = prof.layer_metrics.at("infonce/" + to_string(st));
      std::string cell = fmt(m.mean[static_cast<std::size_t>(l)], "%.3f");
      if (!m.ci_low.empty()) cell += " [" + fmt(m.ci_low[static_cast<std::size_t>(l)], "%.3f") + "," +
                                     fmt(m.ci_high[static_cast<std::size_t>(l)], "%.3f") + "]";
      std::printf(" %26s", cell.c_str());
    }
    std::printf("\n");
  }
}

/// Prints the per-layer table of each stage's effective rank and spectral entropy.
void print_geometry_table(const depthkv::ProfileFile& prof) {
  using namespace depthkv;
  using namespace depthkv::llama;
  const int L = prof.n_layers;
  std::printf("\n%-6s", "layer");
  for (auto st : representation_stages()) std::printf(" %22s %22s", ("erank/" + to_string(st)).c_str(), ("sentropy/" + to_string(st)).c_str());
  std::printf("\n");
  for (int l = 0; l < L; ++l) {
    std::printf("%-6d", l);
    for (auto st : representation_stages()) {
      std::printf(" %22s %22s", fmt(prof.layer_metrics.at("erank/" + to_string(st)).mean[static_cast<std::size_t>(l)], "%.3f").c_str(),
                  fmt(prof.layer_metrics.at("sentropy/" + to_string(st)).mean[static_cast<std::size_t>(l)], "%.4f").c_str());
    }
    std::printf("\n");
  }
}

/// Prints the correlation table of `corr` over `L` layers, the reasons of its undefined cells and,
/// for an exact permutation test, the smallest p it can give.
void print_correlations(const nlohmann::json& corr, int L) {
  std::printf("\nSpearman rho (two-sided p%s) across layers, metric vs sensitivity; InfoNCE predicts as the paper "
              "assumes when rho < 0\n",
              L <= 9 ? ", exact permutation test" : ", t approximation");
  std::printf("%-16s %-9s %-8s %9s %9s %14s %12s\n", "stage", "metric", "scorer", "rho", "p", "rho(l>=1)", "p(l>=1)");
  std::vector<std::string> reasons;
  const auto cell = [&reasons](const nlohmann::json& row, const char* key, const char* why) {
    if (row.contains(key)) return fmt(row[key].get<double>(), "%.3f");
    if (row.contains(why)) {
      const std::string r = row[why].get<std::string>();
      if (std::find(reasons.begin(), reasons.end(), r) == reasons.end()) reasons.push_back(r);
      return std::string("undefined");
    }
    return std::string("-");
  };
  for (const auto& row : corr) {
    std::printf("%-16s %-9s %-8s %9s %9s %14s %12s\n", row["stage"].get<std::string>().c_str(),
                row["metric"].get<std::string>().c_str(), row["scorer"].get<std::string>().c_str(),
                cell(row, "rho", "undefined").c_str(), cell(row, "p", "undefined").c_str(),
                cell(row, "rho_no_layer0", "undefined_no_layer0").c_str(),
                cell(row, "p_no_layer0", "undefined_no_layer0").c_str());
  }
  for (const std::string& r : reasons) std::printf("undefined: the rank correlation of a %s\n", r.c_str());
  const double n = static_cast<double>(L);
  double fact = 1;
  for (int i = 2; i <= L; ++i) fact *= i;
  if (L <= 9)
    std::printf("\nnote: with %d layers the smallest possible two-sided p is 2/%d! = %.3f (|rho| = 1)%s\n", L, L,
                2.0 / fact, n <= 4 ? ": nothing can be significant at 0.05" : "");
}

/// The text report: per-layer sensitivities and metrics, then the correlations.
void print_report(const AnalyzeArgs& a, const depthkv::ProfileFile& prof,
                  const std::map<std::string, std::vector<double>>& sens, const nlohmann::json& corr, bool probed,
                  const std::string& source) {
  const int L = prof.n_layers;
  std::printf("model %s, %d layers; sensitivity = KL when only that layer keeps %.2f%s; metrics: %s\n",
              base_name(a.model).c_str(), L, a.layer_keep, probed ? "" : " (interpolated: not a probed ratio)", source.c_str());
  print_sensitivity_table(prof, sens);
  print_geometry_table(prof);
  print_correlations(corr, L);
}

void run_analyze(const AnalyzeArgs& a) {
  using namespace depthkv;
  DEPTHKV_CHECK(a.layer_keep > 0.0 && a.layer_keep < 1.0, "--layer-keep must be in (0, 1), got " << a.layer_keep);
  ProfileFile prof = load_profile(a.profile, a.model);
  DEPTHKV_CHECK(!prof.scorers.empty(), "profile '" << a.profile << "' holds no measured scorer (nothing to correlate with)");
  const int L = prof.n_layers;
  DEPTHKV_CHECK(L >= 3, "Spearman needs at least 3 layers, the model has " << L);

  // representation metrics: from the profile, or computed
  nlohmann::json out;
  std::string source = "profile '" + base_name(a.profile) + "'";
  if (!has_all_metrics(prof) || a.recompute) source = compute_metrics(a, prof, out);

  const std::map<std::string, std::vector<double>> sens = sensitivities(prof, a.layer_keep);
  bool probed = false;
  for (double r : prof.keep_ratios) probed = probed || std::abs(r - a.layer_keep) < 1e-9;
  out["model"] = base_name(a.model);
  out["n_layers"] = L;
  out["keep"] = a.layer_keep;
  out["keep_probed"] = probed;
  out["metrics_source"] = source;
  out["sensitivity"] = sens;
  nlohmann::json lmj = nlohmann::json::object();
  for (const auto& kv : prof.layer_metrics) lmj[kv.first] = {{"mean", kv.second.mean}, {"ci_low", kv.second.ci_low}, {"ci_high", kv.second.ci_high}};
  out["layer_metrics"] = lmj;
  const nlohmann::json corr = correlations(prof, sens);
  out["correlations"] = corr;

  if (a.json)
    std::cout << json_text(out) << "\n";
  else
    print_report(a, prof, sens, corr, probed, source);
}

}  // namespace

void register_analyze(CLI::App& app) {
  auto a = std::make_shared<AnalyzeArgs>();
  CLI::App* c = app.add_subcommand(
      "analyze", "Spearman correlation across layers of representation metrics (InfoNCE, effective rank, spectral "
                 "entropy) with the profile's measured per-layer sensitivity");
  c->add_option("--model", a->model, "model file (llama2.c .bin or GGUF)")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file where the model file holds none (default: from the GGUF, or tok512.bin beside a .bin)");
  c->add_option("--profile", a->profile, "profile file with measured loss curves (depthkv profile)")->required();
  c->add_option("--text", a->text, "text for the probe (stories separated by blank lines); needed unless the profile holds the metrics");
  c->add_option("--samples", a->samples, "probe stories")->capture_default_str()->check(at_least(2));
  c->add_option("--skip", a->skip, "stories skipped before the probe stories (-1: the first story after the profile's calibration windows)")
      ->capture_default_str()
      ->check(at_least(-1));
  CLI::Option* layer_keep =
      c->add_option("--layer-keep", a->layer_keep,
                    "sensitivity = KL when only that layer keeps this ratio, in (0, 1) (interpolated when not probed)")
          ->capture_default_str()
          ->check(finite_number());
  add_deprecated_alias(c, layer_keep, "--keep", a->layer_keep, {finite_number()});  // renamed: --keep is the global ratio
  c->add_option("--tau", a->tau, "InfoNCE temperature (> 0)")->capture_default_str()->check(greater_than(0));
  c->add_option("--batch", a->batch, "InfoNCE batch size (in-batch negatives)")->capture_default_str()->check(at_least(2));
  c->add_option("--seed", a->seed, "perturbation and bootstrap seed")->capture_default_str()->check(in_range(0, 18446744073709551615.0L));
  c->add_option("--max-tokens", a->max_tokens, "tokens per probe text incl. BOS (0: the model's seq_len)")->capture_default_str()->check(at_least(0));
  c->add_option("--threads", a->threads, "threads (0: OpenMP default)")->capture_default_str()->check(thread_count());
  c->add_flag("--recompute", a->recompute, "compute the metrics even when the profile holds them");
  c->add_option("--write", a->write, "also save the profile with the computed metrics to this file");
  c->add_flag("--json", a->json, "print the result as JSON");
  c->callback([a]() { run_analyze(*a); });
}

}  // namespace depthkv_cli
