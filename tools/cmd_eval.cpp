// depthkv eval: quality of pruned KV caches against the full cache on evaluation windows disjoint
// from the profile's calibration windows, for every (scorer, keep ratio, policy): mean KL, NLL
// increase, top-1 agreement and KV bytes; as a table, JSON, CSV and a gnuplot SVG.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <system_error>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/preset.hpp"
#include "depthkv/profile_io.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "flag_alias.hpp"
#include "kv_memory.hpp"
#include "model_io.hpp"
#include "policy_request.hpp"

namespace depthkv_cli {
namespace {

struct EvalArgs {
  std::string model, tokenizer, text, tokens, profile, keeps = "0.1,0.2,0.3,0.5",
                                                      policies = "uniform,pyramid,proportional,middle,optimal", scorers;
  std::string csv, plot, windows_out;
  int context = 0, continuation = 0, windows = 64, skip = -1, threads = 0, chunk = 1024, min_tokens = -1;
  /// oneshot: evict once after the context; chunked: after every prefill chunk; decode: chunked,
  /// and every `interval` tokens of the continuation
  std::string schedule = "oneshot";
  int interval = 1;                  ///< chunked: evict once this many tokens were appended
  std::string continuation_source = "text";  ///< text or model (EvalConfig::continuation_source)
  bool oracle = false;                       ///< every row followed by its oracle row (EvalConfig::oracle)
  bool json = false;
  SelectionSettings sel;
  PresetSettings preset;
  DocumentSettings docs;  ///< default: the profile's document split
};

struct Row {
  std::string scorer, policy;
  double keep = 0;
  std::vector<int> budgets;
  double kl = 0, kl_se = 0, dnll = 0, dnll_se = 0, top1 = 0, nll_full = 0;  ///< *_se: standard errors over the windows
  double bytes_kept = 0, bytes_full = 0;
  double peak_kv_bytes = 0, full_kv_bytes = 0;  ///< most KV bytes held at once: pruned run, full run
  /// The output-aware / cross-head settings (SelectionSettings); written to the CSV and JSON
  /// only when `head_settings` (not the defaults), so default runs write what they always did.
  bool head_settings = false, output_aware = false;
  std::string head_alloc = "uniform";
  double head_alpha = 0.2;
  /// --preset: each candidate scorer's predicted loss at this budget (the lowest chose `scorer`)
  std::vector<std::pair<std::string, double>> predicted;
  depthkv::PruneSpec spec;  ///< --preset: the spec evaluated (depthkv::preset's)
  int tiers = 0;            ///< --tiers on an optimal row (0: no limit); written to the JSON only when > 0
  bool oracle = false;      ///< --oracle: the row's spec with oracle scores (scorer written "<name>+oracle")
  int fallback_windows = 0; ///< --preset: windows served by depthkv::preset_fallback_spec (preset_trusts_input false)
};

/// --preset's per-input rule on the evaluator's windows (depthkv::preset_trusts_input): which
/// windows it serves with its spec, and each window's fallback result for one row.
struct PresetFallback {
  std::vector<bool> trusted;
  std::vector<depthkv::llama::WindowResult> results;
};

double mean_of(const std::vector<double>& v) { return depthkv::mean_and_stderr(v).first; }

std::string join(const std::vector<int>& v, const char* sep) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? sep : "") << v[i];
  return os.str();
}

/// "out.csv" -> "out-sensitivity.csv".
std::string sibling(const std::string& path, const std::string& suffix) {
  const std::size_t dot = path.find_last_of('.');
  const std::size_t slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + suffix;
  return path.substr(0, dot) + suffix + path.substr(dot);
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const depthkv::ProfileFile& f,
               const std::vector<std::string>& scorers) {
  write_output_file(path, "CSV", [&](std::ostream& out) {
    const bool extra = !rows.empty() && rows.front().head_settings;
    out << "scorer,policy,keep,kl,kl_stderr,dnll,top1,nll_full,bytes_kept,bytes_full,budgets"
        << (extra ? ",output_aware,head_alloc,head_alpha" : "") << "\n";
    for (const Row& r : rows) {
      out << r.scorer << ',' << r.policy << ',' << r.keep << ',' << r.kl << ',' << r.kl_se << ',' << r.dnll << ','
          << r.top1 << ',' << r.nll_full << ',' << r.bytes_kept << ',' << r.bytes_full << ',' << join(r.budgets, ";");
      if (extra) out << ',' << (r.output_aware ? 1 : 0) << ',' << r.head_alloc << ',' << r.head_alpha;
      out << '\n';
    }
  });
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {  // a device: no side file in /dev
    std::fprintf(stderr, "eval: wrote %s (not a regular file: no sensitivity curves beside it)\n", path.c_str());
    return;
  }
  const std::string spath = sibling(path, "-sensitivity");
  write_output_file(spath, "CSV", [&](std::ostream& s) {
    s << "scorer,layer,keep_ratio," << f.metric << ",stderr\n";
    for (const std::string& name : scorers) {
      const depthkv::SensitivityProfile p = f.profile(name);
      for (int l = 0; l < p.n_layers(); ++l)
        for (int k = 0; k < p.n_ratios(); ++k)
          s << name << ',' << l << ',' << p.keep_ratios[static_cast<std::size_t>(k)] << ',' << p.loss(l, k) << ','
            << (p.loss_stderr.size() ? p.loss_stderr(l, k) : 0.0) << '\n';
    }
  });
  std::fprintf(stderr, "eval: wrote %s and %s\n", path.c_str(), spath.c_str());
}

// A gnuplot datablock name part: letters, digits and '_' ("head-optimal" -> "head_optimal").
std::string block_name(std::string s) {
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

/// Refuses a --plot path before any work: it must be a regular file or a new file in an existing
/// folder, since the SVG is written there and its gnuplot script beside it (`<svg>.gp`); a
/// device (/dev/full), a folder or a FIFO would make gnuplot fail late or leave side files
/// next to a device path.
/// @throws depthkv::Error naming --plot and the path
void check_plot_path(const std::string& svg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(svg, ec);
  if (fs::exists(st)) {
    DEPTHKV_CHECK(fs::is_regular_file(st), "--plot '" << svg << "': not a regular file (the SVG is written there, "
                                                      "its gnuplot script beside it)");
    return;
  }
  const fs::path parent = fs::path(svg).parent_path();
  DEPTHKV_CHECK(parent.empty() || fs::is_directory(parent, ec),
                "--plot '" << svg << "': the folder '" << parent.string() << "' does not exist");
}

/// Layers of a profile drawn as one line each in the sensitivity panel; more are drawn against
/// the layer index, one line per keep ratio, so that the panel keeps few series.
constexpr int kMaxLayerSeries = 8;

/// The sensitivity panel of a profile of many layers: x = layer, one line per probed keep ratio.
void write_sensitivity_by_layer(std::ostream& g, const depthkv::SensitivityProfile& p, const std::string& sc,
                                const std::string& metric) {
  const std::string tag = sc.substr(0, sc.find('-'));
  for (int k = 0; k < p.n_ratios(); ++k) {
    g << "$l_" << tag << "_" << k << " << EOD\n";
    for (int l = 0; l < p.n_layers(); ++l) g << l << ' ' << std::max(p.loss(l, k), 1e-6) << '\n';
    g << "EOD\n";
  }
  g << "set title 'per-layer sensitivity (only that layer pruned, " << sc << ")'\n"
    << "set ylabel 'mean " << metric << " (calibration windows)'\nset xlabel 'layer'\nset xtics "
    << (p.n_layers() + 9) / 10 << "\nplot ";
  for (int k = 0; k < p.n_ratios(); ++k)
    g << (k ? ", " : "") << "$l_" << tag << "_" << k << " using 1:2 with linespoints lw 2 title 'keep "
      << p.keep_ratios[static_cast<std::size_t>(k)] << "'";
  g << "\nset xtics 0.1\n";
}

void write_plot(const std::string& svg, const std::vector<Row>& rows, const depthkv::ProfileFile& f,
                const std::vector<std::string>& scorers, const std::vector<std::string>& policies,
                const std::string& title) {
  check_plot_path(svg);  // before the script is written beside it
  const std::string gp = sibling(svg, "") + ".gp";
  const int n = static_cast<int>(scorers.size());
  write_output_file(gp, "gnuplot script", [&](std::ostream& g) {
    // Plain text (noenhanced: an '_' in a file name is not a subscript), legends below the panels,
    // clear of the lines.
    g << "set terminal svg size 1100," << 380 * n << " dynamic noenhanced font 'Helvetica,12' background rgb 'white'\n";
    g << "set output '" << svg << "'\n";
    g << "set multiplot layout " << n << ",2 title '" << title << "'\n";
    g << "set grid\nset key below horizontal height 1\nset xtics 0.1\nset logscale y\nset format y '%g'\n";
    for (const std::string& sc : scorers) {
      for (const std::string& pol : policies) {
        g << "$q_" << sc.substr(0, sc.find('-')) << "_" << block_name(pol) << " << EOD\n";
        for (const Row& r : rows)
          if (r.scorer == sc && r.policy == pol) g << r.keep << ' ' << std::max(r.kl, 1e-6) << '\n';
        g << "EOD\n";
      }
      g << "set title 'quality vs budget (" << sc << " scorer)'\nset xlabel 'global keep ratio'\n"
        << "set ylabel 'mean KL(full || pruned)'\n";
      g << "plot ";
      for (std::size_t i = 0; i < policies.size(); ++i)
        g << (i ? ", " : "") << "$q_" << sc.substr(0, sc.find('-')) << "_" << block_name(policies[i])
          << " using 1:2 with linespoints lw 2 title '" << policies[i] << "'";
      g << "\n";
      const depthkv::SensitivityProfile p = f.profile(sc);
      if (p.n_layers() > kMaxLayerSeries) {  // many layers: x = layer, one line per keep ratio
        write_sensitivity_by_layer(g, p, sc, f.metric);
        continue;
      }
      for (int l = 0; l < p.n_layers(); ++l) {
        g << "$s_" << sc.substr(0, sc.find('-')) << "_" << l << " << EOD\n";
        for (int k = 0; k < p.n_ratios(); ++k)
          g << p.keep_ratios[static_cast<std::size_t>(k)] << ' ' << std::max(p.loss(l, k), 1e-6) << '\n';
        g << "EOD\n";
      }
      g << "set title 'per-layer sensitivity (only that layer pruned, " << sc << ")'\n"
        << "set ylabel 'mean " << f.metric << " (calibration windows)'\nset xlabel 'keep ratio of that layer'\nplot ";
      for (int l = 0; l < p.n_layers(); ++l)
        g << (l ? ", " : "") << "$s_" << sc.substr(0, sc.find('-')) << "_" << l
          << " using 1:2 with linespoints lw 2 title 'layer " << l << "'";
      g << "\n";
    }
    g << "unset multiplot\n";
  });
  std::error_code ec;
  std::filesystem::remove(svg, ec);  // an old SVG must not pass for the new one
  const std::string cmd = "gnuplot '" + gp + "'";
  DEPTHKV_CHECK(std::system(cmd.c_str()) == 0, "gnuplot failed on '" << gp << "' (is gnuplot installed?)");
  // gnuplot may exit 0 without having written the SVG (an unwritable path): check what it left
  const std::filesystem::file_status st = std::filesystem::status(svg, ec);
  DEPTHKV_CHECK(std::filesystem::is_regular_file(st) && std::filesystem::file_size(svg, ec) > 0 && !ec,
                "cannot write '" << svg << "' (--plot SVG): gnuplot left no SVG there (disk full or not writable)");
  std::fprintf(stderr, "eval: wrote %s (gnuplot script %s)\n", svg.c_str(), gp.c_str());
}

/// What to evaluate: the keep ratios, policies and scorers of the arguments, checked against the
/// profile.
struct EvalPlan {
  std::vector<double> keeps;
  std::vector<depthkv::AllocationPolicy> policies;
  std::vector<std::string> policy_names;
  std::vector<std::string> scorers;  ///< --scorers, or every scorer of the profile
  std::vector<depthkv::ScorerConfig> scorer_configs;  ///< one per scorer
  /// --preset: `scorers` are the preset's candidates the profile holds head curves of, and each
  /// keep ratio is evaluated with the one of the lowest predicted loss (lowest_predicted_scorer)
  bool choose_scorer = false;
};

/// The plan's keep ratios (`--keeps`, each in (0, 1]) and policies (`--policies`, not empty).
void plan_keeps_and_policies(const EvalArgs& a, EvalPlan& p) {
  p.keeps = parse_doubles(a.keeps, "--keeps");
  for (double k : p.keeps) check_keep(k, "--keeps");
  for (const std::string& name : split_list(a.policies)) {
    p.policies.push_back(depthkv::parse_allocation_policy(name));
    p.policy_names.push_back(depthkv::to_string(p.policies.back()));
  }
  DEPTHKV_CHECK_AS("plan_eval", !p.policies.empty(), "--policies is empty");  // plan_eval speaks for it
  const bool optimal = std::find(p.policies.begin(), p.policies.end(), depthkv::AllocationPolicy::kOptimal) !=
                       p.policies.end();
  DEPTHKV_CHECK_AS("plan_eval", a.sel.tiers == 0 || optimal,
                   "--tiers " << a.sel.tiers << " applies to the optimal policy only, and --policies ("
                              << a.policies << ") has no optimal");
}

EvalPlan plan_eval(const EvalArgs& a, const depthkv::ProfileFile& f) {
  using namespace depthkv;
  EvalPlan p;
  plan_keeps_and_policies(a, p);
  for (depthkv::AllocationPolicy policy : p.policies) {  // once, for the first policy that prunes by the curves
    const std::string note = selection_note(policy, f, a.sel);
    if (!note.empty()) {
      std::fputs(note.c_str(), stderr);
      break;
    }
  }
  p.scorers = split_list(a.scorers);
  if (a.preset.active()) {
    p.choose_scorer = true;
    std::vector<std::string> held;
    for (const std::string& s : p.scorers)
      if (f.has_scorer(s) && f.has_head_curves(s)) held.push_back(s);
    DEPTHKV_CHECK(!held.empty(), "--preset " << a.preset.name << " chooses among the scorers " << a.scorers
                                             << ", and the profile has complete curves and head curves of none: "
                                                "profile it with depthkv profile --preset "
                                             << a.preset.name);
    p.scorers = held;
  }
  if (p.scorers.empty())
    for (const auto& kv : f.scorers) p.scorers.push_back(kv.first);
  for (const std::string& s : p.scorers)
    DEPTHKV_CHECK(f.has_scorer(s), "the profile has no measurements for scorer '"
                                       << s << "': profile it first (depthkv profile --scorers " << s << ")");
  DEPTHKV_CHECK(!p.scorers.empty(), "the profile holds no scorer");
  for (const std::string& s : p.scorers) p.scorer_configs.push_back(a.sel.scorer(s));
  for (depthkv::AllocationPolicy policy : p.policies)
    if (depthkv::is_head_policy(policy))
      for (const std::string& s : p.scorers) f.head_profile(s);  // refuses missing head curves up front
  return p;
}

/// Where the evaluation windows are: `windows` windows of context + continuation tokens of
/// `source`, from window `skip` on.
struct WindowPlan {
  int context = 0, continuation = 0, skip = 0, windows = 0;
  std::string source;                    ///< --text or --tokens
  depthkv::llama::DocumentSplit split;   ///< how --text is cut into documents
};

/// The evaluation windows of the arguments (context and continuation default to the profile's;
/// skip defaults to the first window after the calibration windows when the text is the same;
/// the document split defaults to the profile's).
/// @throws depthkv::Error when they overlap the profile's calibration windows, or when the
///   calibration text is split into documents otherwise than the profile's (its token positions
///   would not be comparable)
WindowPlan plan_windows(const EvalArgs& a, const depthkv::ProfileFile& f) {
  WindowPlan w;
  const depthkv::llama::DocumentSplit profile_split = document_split(f.calibration.documents);
  w.split = a.docs.given ? a.docs.split : profile_split;
  w.context = a.context > 0 ? a.context : f.calibration.context;
  w.continuation = a.continuation > 0 ? a.continuation : f.calibration.continuation;
  w.windows = a.windows;
  w.source = a.text.empty() ? a.tokens : a.text;
  const long long lc = static_cast<long long>(f.calibration.context) + f.calibration.continuation;
  const long long le = static_cast<long long>(w.context) + w.continuation;
  const bool same_text = base_name(w.source) == base_name(f.calibration.text_file);
  const long long cal_begin = f.calibration.window_begin * lc, cal_end = f.calibration.window_end * lc;
  DEPTHKV_CHECK(!same_text || !a.tokens.empty() || w.split == profile_split,
                "--text is the profile's calibration text, split into documents by "
                    << profile_split.describe() << " there; here by " << w.split.describe()
                    << ": the windows' positions would not match (drop --doc-separator/--doc-opening, or use "
                       "another text)");
  w.skip = a.skip;
  if (w.skip < 0) w.skip = same_text ? static_cast<int>((cal_end + le - 1) / le) : 0;
  const long long ev_begin = w.skip * le, ev_end = (w.skip + static_cast<long long>(w.windows)) * le;
  DEPTHKV_CHECK(!same_text || ev_end <= cal_begin || ev_begin >= cal_end,
                "evaluation windows (tokens " << ev_begin << ".." << ev_end << " of " << base_name(w.source)
                                              << ") overlap the profile's calibration windows (tokens " << cal_begin
                                              << ".." << cal_end << "): use --skip >= "
                                              << (cal_end + le - 1) / le);
  return w;
}

// The evaluation windows' token ids, for other engines to evaluate the same inputs
// (benchmarks/kvpress_peer): {"model", "source", "context", "continuation", "skip",
// "windows": [{"index", "context": [ids], "continuation": [ids]}]}.
void write_windows(const std::string& path, const std::string& model, const WindowPlan& w,
                   const std::vector<depthkv::llama::EvalWindow>& windows) {
  nlohmann::json j = {{"model", base_name(model)},  {"source", base_name(w.source)},
                      {"context", w.context},       {"continuation", w.continuation},
                      {"skip", w.skip},             {"windows", nlohmann::json::array()}};
  for (std::size_t i = 0; i < windows.size(); ++i)
    j["windows"].push_back({{"index", w.skip + static_cast<int>(i)},
                            {"context", windows[i].context},
                            {"continuation", windows[i].continuation}});
  write_output_file(path, "windows", [&](std::ostream& out) { out << json_text(j, -1) << '\n'; });
}

/// --schedule as a mode.
/// @throws depthkv::Error naming --schedule on another value
depthkv::ScheduleMode schedule_mode(const EvalArgs& a) {
  try {
    return depthkv::parse_schedule_mode(a.schedule);
  } catch (const depthkv::Error&) {
    DEPTHKV_FAIL("--schedule must be oneshot, chunked or decode, got '" << a.schedule << "'");
  }
}

/// The spec of one row: the selection flags, `scorer`, `keep`, `policy`, the schedule and the
/// safeguard of the arguments; `--tiers` on the optimal rows only.
depthkv::PruneSpec row_spec(const EvalArgs& a, const std::string& scorer, double keep, depthkv::AllocationPolicy policy) {
  depthkv::PruneSpec spec = request_spec(a.sel, scorer, keep, policy, a.min_tokens);
  spec.schedule = {schedule_mode(a), a.chunk, a.interval};
  if (policy != depthkv::AllocationPolicy::kOptimal) spec.tiers = 0;
  return spec;
}

/// One row: `spec` evaluated on every window (the library's `PruningEvaluator::evaluate`) and
/// the means over the windows.
Row evaluate_row(const depthkv::llama::PruningEvaluator& ev, const depthkv::ProfileFile& f,
                 const depthkv::PruneSpec& spec, int scorer_index, double nll_full,
                 const PresetFallback* fallback = nullptr) {
  using namespace depthkv;
  const std::string scorer = scorer_name(spec.scorer);
  const PolicyCurves curves = policy_curves(f, scorer, spec.policy);
  Row r;
  r.scorer = scorer;
  r.policy = to_string(spec.policy);
  r.keep = spec.budget.ratio();
  r.head_settings = spec.has_head_settings();
  r.output_aware = spec.scorer.output_aware;
  r.head_alloc = to_string(spec.head_split.mode);
  r.head_alpha = spec.head_split.alpha;
  r.tiers = spec.tiers;
  std::vector<llama::WindowResult> results = ev.evaluate(spec, curves.data(), scorer_index);
  r.budgets = results.front().budgets;  // the same in every window (same lengths, same spec)
  for (std::size_t w = 0; fallback && w < results.size(); ++w)
    if (!fallback->trusted[w]) {
      results[w] = fallback->results[w];
      ++r.fallback_windows;
    }
  std::vector<double> kl, dnll, top1, kept, full, peak, full_peak;
  for (const llama::WindowResult& wr : results) {
    kl.push_back(wr.metrics.loss.kl);
    dnll.push_back(wr.metrics.loss.dnll);
    top1.push_back(1.0 - wr.metrics.loss.top1_disagree);
    kept.push_back(static_cast<double>(wr.bytes_kept));
    full.push_back(static_cast<double>(wr.bytes_full));
    peak.push_back(static_cast<double>(wr.bytes_peak));
    full_peak.push_back(static_cast<double>(wr.bytes_full_peak));
  }
  std::tie(r.kl, r.kl_se) = mean_and_stderr(kl);
  std::tie(r.dnll, r.dnll_se) = mean_and_stderr(dnll);
  r.top1 = mean_of(top1);
  r.nll_full = nll_full;
  r.bytes_kept = mean_of(kept);
  r.bytes_full = mean_of(full);
  r.peak_kv_bytes = *std::max_element(peak.begin(), peak.end());
  r.full_kv_bytes = *std::max_element(full_peak.begin(), full_peak.end());
  return r;
}

// With a preset, every row names it and carries the settings it resolved to.
void print_json(const std::vector<Row>& rows, const EvalArgs& a) {
  nlohmann::json arr = nlohmann::json::array();
  for (const Row& r : rows) {
    arr.push_back({{"scorer", r.scorer},
                   {"policy", r.policy},
                   {"keep", r.keep},
                   {"budgets", r.budgets},
                   {"kl", r.kl},
                   {"kl_se", r.kl_se},
                   {"dnll", r.dnll},
                   {"dnll_se", r.dnll_se},
                   {"top1", r.top1},
                   {"nll_full", r.nll_full},
                   {"bytes_kept", r.bytes_kept},
                   {"bytes_full", r.bytes_full},
                   {"peak_kv_bytes", r.peak_kv_bytes},
                   {"full_kv_bytes", r.full_kv_bytes}});
    if (a.sel.lookahead > 0) arr.back()["lookahead"] = a.sel.lookahead;
    if (a.sel.lookahead > 0 && a.sel.context_weight > 0) arr.back()["context_weight"] = a.sel.context_weight;
    if (r.tiers > 0) arr.back()["tiers"] = r.tiers;
    if (a.continuation_source != "text") arr.back()["continuation_source"] = a.continuation_source;
    if (r.oracle) arr.back()["oracle"] = true;
    if (a.preset.active() && !r.oracle) arr.back()["fallback_windows"] = r.fallback_windows;
    if (r.head_settings) {
      arr.back()["output_aware"] = r.output_aware;
      arr.back()["head_alloc"] = r.head_alloc;
      arr.back()["head_alpha"] = r.head_alpha;
    }
    if (a.preset.active()) {
      nlohmann::json& j = arr.back();
      j["preset"] = a.preset.name;
      j["output_aware"] = r.output_aware;
      j["head_alloc"] = r.head_alloc;
      j["head_alpha"] = r.head_alpha;
      j["pooling"] = a.sel.pooling;
      j["sinks"] = a.sel.sinks;
      j["recent"] = a.sel.recent;
      j["obs_window"] = a.sel.obs_window;
      j["kernel"] = a.sel.kernel;
      j["lookahead"] = a.sel.lookahead;
      if (a.sel.context_weight > 0) j["context_weight"] = a.sel.context_weight;
      j["min_tokens"] = a.min_tokens;
      nlohmann::json pred = nlohmann::json::object();
      for (const auto& sp : r.predicted) pred[sp.first] = sp.second;
      j["predicted_loss"] = pred;
      j["spec"] = depthkv::prune_spec_to_json(r.spec);
    }
  }
  std::printf("%s\n", json_text(arr).c_str());
}

/// The lines --continuation-source model and --oracle add under the table's header (none by default).
void print_protocol_notes(const EvalArgs& a) {
  if (a.continuation_source != "text")
    std::printf("continuation: the model's own greedy continuation (--continuation-source %s)\n",
                a.continuation_source.c_str());
  if (a.oracle)
    std::printf("oracle: each row's '+oracle' twin scores the context by the continuation's own attention "
                "(a measurement, not a method)\n");
}

/// --preset: the scorer each budget chose and every candidate's predicted loss.
void print_preset_choice(const EvalArgs& a, const depthkv::ProfileFile& f, const std::vector<Row>& rows) {
  std::printf("\n--preset %s: each budget's scorer has the lowest predicted loss (%s, head curves):\n",
              a.preset.name.c_str(), f.metric.c_str());
  for (const Row& r : rows)
    if (!r.oracle)
      std::printf("  keep %.2f: %s (%s)%s\n", r.keep, r.scorer.c_str(), describe_predicted(r.predicted).c_str(),
                  r.fallback_windows > 0 ? ("; plain snapkv uniform on " + std::to_string(r.fallback_windows) +
                                            " windows the model predicts poorly")
                                               .c_str()
                                         : "");
}

/// The schedule line for --schedule chunked or decode (nothing for oneshot).
void print_schedule(const EvalArgs& a) {
  const depthkv::ScheduleMode mode = schedule_mode(a);
  if (mode == depthkv::ScheduleMode::kChunked)
    std::printf("schedule: chunked, eviction after every %d-token chunk (interval %d); budgets: after the context\n",
                a.chunk, a.interval);
  if (mode == depthkv::ScheduleMode::kDecode)
    std::printf("schedule: decode, eviction after every %d-token prefill chunk and every %d continuation tokens; "
                "budgets: after the context\n",
                a.chunk, a.interval);
}

/// With sliding-window layers, what "KV kept" is of: the full-length cache, against one with the
/// local layers at their window (nothing without such layers or rows).
void print_window_note(const depthkv::ProfileFile& f, const WindowPlan& w, const std::vector<Row>& rows) {
  if (!f.layer_window.empty() && !rows.empty()) {
    const KvMemory m = kv_memory(rows.front().budgets, w.context, f.layer_window, 1.0, f.kv_heads, f.head_dim);
    int local = 0;
    for (int win : f.layer_window) local += win > 0;
    std::printf("sliding-window layers: %d of %d local (budgets capped at window - 1); \"KV kept\" is of the "
                "full-length cache (%s); a cache with the local layers at their window holds %s (%.1f%%)\n",
                local, f.n_layers, mib_or_tokens(m.full_naive, m.bytes_per_token).c_str(),
                mib_or_tokens(m.full_windowed, m.bytes_per_token).c_str(),
                100.0 * static_cast<double>(m.full_windowed) / static_cast<double>(m.full_naive));
  }
}

/// Each non-uniform policy's KL relative to uniform's at the same scorer and budget.
void print_relative_kl(const EvalPlan& plan, const std::vector<Row>& rows) {
  const bool any_uniform = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.policy == "uniform"; });
  if (any_uniform) std::printf("\nKL relative to uniform at the same budget (negative = better than uniform):\n");
  for (const std::string& sc : plan.scorers)
    for (double keep : plan.keeps) {
      double uni = -1;
      for (const Row& r : rows)
        if (r.scorer == sc && r.keep == keep && r.policy == "uniform") uni = r.kl;
      if (uni <= 0) continue;
      std::printf("  %-7s keep %.2f:", sc.c_str(), keep);
      for (const Row& r : rows)
        if (r.scorer == sc && r.keep == keep && r.policy != "uniform")
          std::printf("  %s %+.0f%%", r.policy.c_str(), 100.0 * (r.kl / uni - 1.0));
      std::printf("\n");
    }
}

/// The table, each policy's KL against uniform's at the same budget, and the timing line.
void print_table(const EvalArgs& a, const depthkv::ProfileFile& f, const EvalPlan& plan, const WindowPlan& w,
                 const std::vector<Row>& rows, double nll_full, double full_s, double eval_s) {
  const std::string docs =
      w.split.is_default() || !a.tokens.empty() ? std::string() : " (documents: " + w.split.describe() + ")";
  std::printf("evaluation: %s, %d windows (%d..%d) of %s%s, context %d + continuation %d; full-cache NLL %.4f nats\n",
              base_name(a.model).c_str(), w.windows, w.skip, w.skip + w.windows - 1, base_name(w.source).c_str(),
              docs.c_str(), w.context, w.continuation, nll_full);
  std::printf("profile: %s (%d calibration windows %lld..%lld of %s%s), %s\n", base_name(a.profile).c_str(),
              f.calibration.samples, f.calibration.window_begin, f.calibration.window_end - 1,
              base_name(f.calibration.text_file).c_str(),
              f.calibration.eviction_chunk > 0
                  ? ("; measured with eviction after every " + std::to_string(f.calibration.eviction_chunk) + "-token chunk").c_str()
                  : "",
              a.sel.describe().c_str());
  print_protocol_notes(a);
  print_schedule(a);
  std::printf("%-7s %-12s %5s  %-24s %9s %8s %8s %7s %10s\n", "scorer", "policy", "keep", "budgets/layer", "KL",
              "+-se", "dNLL", "top1", "KV kept");
  for (const Row& r : rows)
    std::printf("%-7s %-12s %5.2f  %-24s %9.5f %8.5f %8.5f %7.4f %9.1f%%\n", r.scorer.c_str(), r.policy.c_str(), r.keep,
                join(r.budgets, ",").c_str(), r.kl, r.kl_se, r.dnll, r.top1, 100.0 * r.bytes_kept / r.bytes_full);
  print_window_note(f, w, rows);
  if (plan.choose_scorer) print_preset_choice(a, f, rows);
  print_relative_kl(plan, rows);
  std::printf("time: full passes %.2f s, %zu evaluations %.2f s\n", full_s, rows.size(), eval_s);
}

/// Every (scorer, keep, policy) row; with --preset, per (keep, policy) the spec of
/// depthkv::preset (its scorer: the lowest predicted loss on the profile's head curves).
std::vector<Row> evaluate_rows(const depthkv::llama::PruningEvaluator& ev, const EvalArgs& a,
                               const depthkv::ProfileFile& f, const EvalPlan& plan, const std::vector<int>& lengths,
                               double nll_full, const std::vector<bool>& trusted) {
  std::vector<Row> rows;
  Progress bar("eval");
  const long long total = static_cast<long long>((plan.choose_scorer ? 1 : plan.scorers.size()) * plan.keeps.size() *
                                                 plan.policies.size() * (a.oracle ? 2 : 1));
  const auto index_of = [&](const std::string& scorer) {
    return static_cast<int>(std::find(plan.scorers.begin(), plan.scorers.end(), scorer) - plan.scorers.begin());
  };
  // --oracle: the row's spec again, with the oracle twin of its scorer (index + scorer count)
  const auto add_oracle = [&] {
    if (!a.oracle) return;
    const Row& last = rows.back();
    Row o = evaluate_row(ev, f, last.spec, index_of(last.scorer) + static_cast<int>(plan.scorers.size()), nll_full);
    o.scorer += "+oracle";
    o.oracle = true;
    o.predicted = last.predicted;
    o.spec = last.spec;
    rows.push_back(o);
  };
  if (plan.choose_scorer) {
    for (double keep : plan.keeps)
      for (depthkv::AllocationPolicy policy : plan.policies) {
        const depthkv::PresetChoice c =
            depthkv::preset(a.preset.name, f, row_spec(a, plan.scorers.front(), keep, policy), lengths, a.sel.lookahead,
                            a.sel.context_weight);
        const std::string scorer = depthkv::scorer_name(c.spec.scorer);
        PresetFallback fb{trusted, {}};
        const depthkv::PruneSpec fs = depthkv::preset_fallback_spec(a.preset.name, row_spec(a, scorer, keep, policy));
        fb.results = ev.evaluate(fs, depthkv::PolicyData{}, ev.n_scorers() - 1);  // the fallback scorer: last
        rows.push_back(evaluate_row(ev, f, c.spec, index_of(scorer), nll_full, &fb));
        rows.back().predicted = c.predicted;
        rows.back().spec = c.spec;
        add_oracle();
        bar.update(static_cast<long long>(rows.size()), total);
      }
    return rows;
  }
  for (const std::string& scorer : plan.scorers)
    for (double keep : plan.keeps)
      for (depthkv::AllocationPolicy policy : plan.policies) {
        rows.push_back(evaluate_row(ev, f, row_spec(a, scorer, keep, policy), index_of(scorer), nll_full));
        rows.back().spec = row_spec(a, scorer, keep, policy);
        add_oracle();
        bar.update(static_cast<long long>(rows.size()), total);
      }
  return rows;
}

/// --preset: the per-input rule's signal measured in the full runs, and its fallback scorer
/// observed there too (the last scorer).
void add_preset_fallback(const EvalArgs& a, const EvalPlan& plan, depthkv::llama::EvalConfig& ecfg) {
  ecfg.context_nll_tokens = depthkv::kPresetTrustTokens;
  const depthkv::PruneSpec base = row_spec(a, plan.scorers.front(), 1.0, depthkv::AllocationPolicy::kUniform);
  ecfg.scorers.push_back(depthkv::preset_fallback_spec(a.preset.name, base).scorer);
  if (!ecfg.oracle.empty()) ecfg.oracle.push_back(false);
}

/// --preset: per window, whether the preset serves it with its own spec
/// (depthkv::preset_trusts_input); the signals go to stderr. Empty without --preset.
std::vector<bool> preset_trust(const depthkv::llama::PruningEvaluator& ev, const EvalArgs& a, const EvalPlan& plan,
                               int vocab_size) {
  std::vector<bool> trusted;
  if (!plan.choose_scorer) return trusted;
  std::string signals;
  for (int w = 0; w < ev.n_windows(); ++w) {
    trusted.push_back(depthkv::preset_trusts_input(a.preset.name, ev.context_nll(w), vocab_size));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.3f", w ? " " : "", depthkv::normalized_nll(ev.context_nll(w), vocab_size));
    signals += buf;
  }
  std::fprintf(stderr, "eval: --preset %s: normalized context NLL per window (trusted up to %.2f): %s\n",
               a.preset.name.c_str(), depthkv::kPresetMaxNormalizedNll, signals.c_str());
  return trusted;
}

/// The evaluator's settings: the plan's scorers under `a`'s selection, chunking and threads; with
/// --oracle each scorer again as its oracle twin, with --preset the fallback scorer last.
depthkv::llama::EvalConfig evaluator_config(const EvalArgs& a, const EvalPlan& plan) {
  depthkv::llama::EvalConfig ecfg;
  ecfg.scorers = plan.scorer_configs;
  ecfg.spec.protection = a.sel.protection();
  ecfg.spec.head_split = {a.sel.head_allocation(), a.sel.head_alpha};
  ecfg.spec.schedule.chunk = a.chunk;
  ecfg.n_threads = a.threads;
  ecfg.continuation_source = depthkv::llama::parse_continuation_source(a.continuation_source);
  if (a.oracle) {  // every scorer twice: observed (0..n-1), oracle (n..2n-1)
    ecfg.oracle.assign(ecfg.scorers.size(), false);
    ecfg.oracle.resize(2 * ecfg.scorers.size(), true);
    ecfg.scorers.insert(ecfg.scorers.end(), plan.scorer_configs.begin(), plan.scorer_configs.end());
  }
  if (plan.choose_scorer) add_preset_fallback(a, plan, ecfg);
  return ecfg;
}

/// Reports `rows`: the tiers note and the table (or JSON) on stdout, then the CSV and plot files
/// where asked for.
void report_rows(const EvalArgs& a, const depthkv::ProfileFile& f, const EvalPlan& plan, const WindowPlan& w,
                 const std::vector<Row>& rows, double nll_full_mean, double full_s, double eval_s) {
  if (!a.json && a.sel.tiers > 0)
    std::printf("tiers: the optimal rows' budgets in at most %d tiers (--tiers)\n", a.sel.tiers);
  if (a.json)
    print_json(rows, a);
  else
    print_table(a, f, plan, w, rows, nll_full_mean, full_s, eval_s);
  if (!a.csv.empty()) write_csv(a.csv, rows, f, plan.scorers);
  if (!a.plot.empty()) {
    std::ostringstream title;
    title << base_name(a.model) << ": " << w.windows << " eval windows of " << base_name(w.source) << " ("
          << w.context << "+" << w.continuation << " tokens)";
    write_plot(a.plot, rows, f, plan.scorers, plan.policy_names, title.str());
  }
}

void run_eval(const EvalArgs& a) {
  using namespace depthkv;
  using namespace depthkv::llama;
  a.sel.check();
  DEPTHKV_CHECK(a.text.empty() != a.tokens.empty(), "give exactly one of --text FILE and --tokens FILE");
  schedule_mode(a);  // refuses an unknown --schedule first
  parse_continuation_source(a.continuation_source);
  DEPTHKV_CHECK(!a.oracle || schedule_mode(a) == ScheduleMode::kOneshot,
                "--oracle measures one-shot eviction only, not --schedule " << a.schedule);
  if (!a.plot.empty()) check_plot_path(a.plot);
  const ProfileFile f = load_profile(a.profile, a.model);  // refuses a profile of another model
  const EvalPlan plan = plan_eval(a, f);
  const WindowPlan w = plan_windows(a, f);

  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/a.tokens.empty());
  const LlamaEngine engine(lm.model);
  const int L = lm.model.config.n_layers;
  check_profile_matches(f, lm.model.config, a.model);
  const long long window_len = static_cast<long long>(w.context) + w.continuation;
  DEPTHKV_CHECK(window_len <= lm.model.config.seq_len,
                "context + continuation = " << window_len << " exceeds the model's trained context "
                                            << lm.model.config.seq_len);
  check_lookahead(a.sel.lookahead, w.context, lm.model.config.seq_len, "context");
  std::vector<EvalWindow> windows = load_windows(w.source, lm.tokenizer.get(), w.context, w.continuation, w.skip,
                                                 w.windows, !a.tokens.empty(), lm.model.config.vocab_size, w.split);
  std::fprintf(stderr, "eval: %s, %d windows of %d+%d tokens from %s (windows %d..%d), scorers %s\n",
               base_name(a.model).c_str(), w.windows, w.context, w.continuation, base_name(w.source).c_str(), w.skip,
               w.skip + w.windows - 1, a.scorers.empty() ? "(all in the profile)" : a.scorers.c_str());
  if (!a.windows_out.empty()) {
    write_windows(a.windows_out, a.model, w, windows);
    std::fprintf(stderr, "eval: wrote the windows' token ids to %s (nothing evaluated)\n", a.windows_out.c_str());
    return;
  }

  // The full-cache passes (once), then every (scorer, keep, policy) against them.
  const EvalConfig ecfg = evaluator_config(a, plan);
  const auto t0 = std::chrono::steady_clock::now();
  const PruningEvaluator ev(engine, std::move(windows), ecfg);
  const double full_s = seconds_since(t0);
  std::vector<double> nll_full;
  for (int i = 0; i < ev.n_windows(); ++i) nll_full.push_back(ev.nll_full(i));
  const double nll_full_mean = mean_of(nll_full);

  const auto t1 = std::chrono::steady_clock::now();
  const std::vector<bool> trusted = preset_trust(ev, a, plan, lm.model.config.vocab_size);
  const std::vector<Row> rows = evaluate_rows(ev, a, f, plan, std::vector<int>(static_cast<std::size_t>(L), w.context),
                                              nll_full_mean, trusted);
  const double eval_s = seconds_since(t1);

  report_rows(a, f, plan, w, rows, nll_full_mean, full_s, eval_s);
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand("eval", "evaluate allocation policies against the full cache on held-out windows");
  c->add_option("--model", a->model, "model file (llama2.c .bin or GGUF)")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file where the model file holds none (default: from the GGUF, or tok512.bin beside a .bin)");
  c->add_option("--text", a->text, "evaluation text (cut into documents by --doc-opening or --doc-separator)");
  c->add_option("--tokens", a->tokens, "pre-tokenized evaluation input: a file of token ids (instead of --text)");
  a->docs.add_options(c, "the profile's document split ('Once upon a time', TinyStories, unless it records another)");
  c->add_option("--profile", a->profile, "profile file of this model (from depthkv profile)")->required();
  CLI::Option* keeps = c->add_option("--keeps", a->keeps, "global keep ratios, each in (0, 1]")->capture_default_str();
  add_deprecated_alias(c, keeps, "--keep", a->keeps);  // renamed: a list flag is plural
  c->add_option("--policies", a->policies,
                "allocation policies, any of " + depthkv::allocation_policy_names() + ", " + kHeadOptimal +
                    " (per KV head, from the profile's head curves; with --head-alloc adaptive each layer's "
                    "total is re-split by the scores with floors --head-alpha x each head's budget)")
      ->capture_default_str();
  c->add_option("--scorers", a->scorers, "scorers (default: all in the profile)");
  c->add_option("--context", a->context, "context tokens (default: the profile's)")->check(at_least(1));
  c->add_option("--continuation", a->continuation, "continuation tokens (default: the profile's)")->check(at_least(2));
  c->add_option("--windows", a->windows, "evaluation windows")->capture_default_str()->check(at_least(1));
  c->add_option("--skip", a->skip, "windows skipped (default: first window after the calibration windows)")
      ->check(at_least(0));
  c->add_option("--min-tokens", a->min_tokens,
                "safeguard floor per layer of proportional, optimal, mga and mlma* (-1: sinks + recent + 8, the 8 halved "
                "until every layer's floor fits the budget; 0: off; N: N tokens, uniform budgets when they do not fit)")
      ->capture_default_str()
      ->check(min_tokens_value());
  a->sel.add_options(c, /*old_window=*/"--recent N --obs-window N (--window N set both)");
  a->sel.add_tiers_option(c, "the optimal rows of --policies; the other policies as always");
  c->add_option("--chunk", a->chunk, "prefill chunk size (chunked: eviction after every chunk)")
      ->capture_default_str()
      ->check(at_least(1));
  c->add_option("--schedule", a->schedule,
                "oneshot: evict once after the context; chunked: after every prefill chunk (EvictionSchedule); "
                "decode: chunked, and during the teacher-forced continuation every --interval tokens")
      ->capture_default_str();
  c->add_option("--interval", a->interval, "chunked, decode: evict once this many tokens were appended since the last eviction")
      ->capture_default_str()
      ->check(at_least(1));
  c->add_option("--threads", a->threads, "threads (0: OpenMP default)")->capture_default_str()->check(thread_count());
  c->add_option("--continuation-source", a->continuation_source,
                "text: teacher-force the window's own continuation; model: the model's greedy continuation of the "
                "context (generated on the full cache), teacher-forced on the full and the pruned cache")
      ->capture_default_str();
  c->add_flag("--oracle", a->oracle,
              "follow every row by its oracle twin ('<scorer>+oracle'): the same budgets, scores from the attention "
              "of the continuation itself (a measurement of the limit, not a method; one-shot only)");
  c->add_flag("--json", a->json, "print the rows as one JSON array");
  c->add_option("--windows-out", a->windows_out,
                "write the evaluation windows' token ids (JSON) to this file and stop, evaluating nothing");
  c->add_option("--csv", a->csv, "write the rows (and the profile's sensitivity curves to *-sensitivity.csv)");
  c->add_option("--plot", a->plot, "write quality-vs-budget and per-layer sensitivity curves (SVG, gnuplot)");
  a->preset.add_option(c, {"--policies", "--scorers", "--pooling", "--output-aware", "--head-alloc", "--head-alpha"});
  c->callback([a] {
    a->preset.apply(a->sel, &a->scorers, &a->policies);
    run_eval(*a);
  });
}

}  // namespace depthkv_cli
