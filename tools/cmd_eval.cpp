// depthkv eval: quality of pruned KV caches against the full cache on evaluation windows disjoint
// from the profile's calibration windows, for every (scorer, keep ratio, policy): mean KL, NLL
// increase, top-1 agreement and KV bytes; as a table, JSON, CSV and a gnuplot SVG.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/eval.hpp"
#include "depthkv/profile_io.hpp"
#include "model_io.hpp"
#include "policy_request.hpp"

namespace depthkv_cli {
namespace {

struct EvalArgs {
  std::string model, tokenizer, text, tokens, profile, keeps = "0.1,0.2,0.3,0.5",
                                                      policies = "uniform,pyramid,proportional,middle,optimal", scorers;
  std::string csv, plot;
  int context = 0, continuation = 0, windows = 64, skip = -1, threads = 0, chunk = 1024, min_tokens = -1;
  bool json = false;
  SelectionSettings sel;
};

struct Row {
  std::string scorer, policy;
  double keep = 0;
  std::vector<int> budgets;
  double kl = 0, kl_se = 0, dnll = 0, top1 = 0, nll_full = 0;
  double bytes_kept = 0, bytes_full = 0;
};

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}
double stderr_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0.0;
  const double m = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1) / static_cast<double>(v.size()));
}

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
  std::ofstream out(path);
  DEPTHKV_CHECK(out.good(), "cannot write '" << path << "'");
  out << "scorer,policy,keep,kl,kl_stderr,dnll,top1,nll_full,bytes_kept,bytes_full,budgets\n";
  for (const Row& r : rows)
    out << r.scorer << ',' << r.policy << ',' << r.keep << ',' << r.kl << ',' << r.kl_se << ',' << r.dnll << ','
        << r.top1 << ',' << r.nll_full << ',' << r.bytes_kept << ',' << r.bytes_full << ',' << join(r.budgets, ";")
        << '\n';
  const std::string spath = sibling(path, "-sensitivity");
  std::ofstream s(spath);
  DEPTHKV_CHECK(s.good(), "cannot write '" << spath << "'");
  s << "scorer,layer,keep_ratio," << f.metric << ",stderr\n";
  for (const std::string& name : scorers) {
    const depthkv::SensitivityProfile p = f.profile(name);
    for (int l = 0; l < p.n_layers(); ++l)
      for (int k = 0; k < p.n_ratios(); ++k)
        s << name << ',' << l << ',' << p.keep_ratios[static_cast<std::size_t>(k)] << ',' << p.loss(l, k) << ','
          << (p.stderr_.size() ? p.stderr_(l, k) : 0.0) << '\n';
  }
  std::fprintf(stderr, "eval: wrote %s and %s\n", path.c_str(), spath.c_str());
}

void write_plot(const std::string& svg, const std::vector<Row>& rows, const depthkv::ProfileFile& f,
                const std::vector<std::string>& scorers, const std::vector<std::string>& policies,
                const std::string& title) {
  const std::string gp = sibling(svg, "") + ".gp";
  std::ofstream g(gp);
  DEPTHKV_CHECK(g.good(), "cannot write '" << gp << "'");
  const int n = static_cast<int>(scorers.size());
  g << "set terminal svg size 1100," << 380 * n << " dynamic enhanced font 'Helvetica,12' background rgb 'white'\n";
  g << "set output '" << svg << "'\n";
  g << "set multiplot layout " << n << ",2 title '" << title << "'\n";
  g << "set grid\nset key top right\nset logscale y\nset format y '%g'\n";
  for (const std::string& sc : scorers) {
    for (const std::string& pol : policies) {
      g << "$q_" << sc.substr(0, sc.find('-')) << "_" << pol << " << EOD\n";
      for (const Row& r : rows)
        if (r.scorer == sc && r.policy == pol) g << r.keep << ' ' << std::max(r.kl, 1e-6) << '\n';
      g << "EOD\n";
    }
    g << "set title 'quality vs budget (" << sc << " scorer)'\nset xlabel 'global keep ratio'\n"
      << "set ylabel 'mean KL(full || pruned)'\n";
    g << "plot ";
    for (std::size_t i = 0; i < policies.size(); ++i)
      g << (i ? ", " : "") << "$q_" << sc.substr(0, sc.find('-')) << "_" << policies[i]
        << " using 1:2 with linespoints lw 2 title '" << policies[i] << "'";
    g << "\n";
    const depthkv::SensitivityProfile p = f.profile(sc);
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
  g.close();
  const std::string cmd = "gnuplot '" + gp + "'";
  DEPTHKV_CHECK(std::system(cmd.c_str()) == 0, "gnuplot failed on '" << gp << "' (is gnuplot installed?)");
  std::fprintf(stderr, "eval: wrote %s (gnuplot script %s)\n", svg.c_str(), gp.c_str());
}

void run_eval(const EvalArgs& a) {
  using namespace depthkv;
  using namespace depthkv::llama;
  a.sel.check();
  DEPTHKV_CHECK(a.text.empty() != a.tokens.empty(), "give exactly one of --text FILE and --tokens FILE");
  const ProfileFile f = load_profile(a.profile, a.model);  // refuses a profile of another model
  const std::vector<double> keeps = parse_doubles(a.keeps, "--keep");
  for (double k : keeps) DEPTHKV_CHECK(k > 0.0 && k <= 1.0, "--keep: " << k << " outside (0, 1]");
  std::vector<AllocationPolicy> policies;
  std::vector<std::string> policy_names;
  for (const std::string& p : split_list(a.policies)) {
    policies.push_back(parse_allocation_policy(p));
    policy_names.push_back(to_string(policies.back()));
  }
  DEPTHKV_CHECK(!policies.empty(), "--policies is empty");
  for (AllocationPolicy p : policies) {  // once, for the first policy that prunes by the curves
    const std::string note =
        selection_note(p, f, a.sel.sinks, a.sel.window, a.sel.window, /*generate_flags=*/false);
    if (!note.empty()) {
      std::fputs(note.c_str(), stderr);
      break;
    }
  }
  std::vector<std::string> scorers = split_list(a.scorers);
  if (scorers.empty())
    for (const auto& kv : f.scorers) scorers.push_back(kv.first);
  for (const std::string& s : scorers)
    DEPTHKV_CHECK(f.has_scorer(s), "the profile has no measurements for scorer '"
                                       << s << "': profile it first (depthkv profile --scorers " << s << ")");
  DEPTHKV_CHECK(!scorers.empty(), "the profile holds no scorer");
  std::vector<ScorerConfig> scfg;
  for (const std::string& s : scorers) scfg.push_back(a.sel.scorer(s));

  // Windows, disjoint from the calibration windows.
  const int context = a.context > 0 ? a.context : f.calibration.context;
  const int continuation = a.continuation > 0 ? a.continuation : f.calibration.continuation;
  const std::string src = a.text.empty() ? a.tokens : a.text;
  const long long lc = static_cast<long long>(f.calibration.context) + f.calibration.continuation;
  const long long le = static_cast<long long>(context) + continuation;
  const bool same_text = base_name(src) == base_name(f.calibration.text_file);
  const long long cal_begin = f.calibration.window_begin * lc, cal_end = f.calibration.window_end * lc;
  int skip = a.skip;
  if (skip < 0) skip = same_text ? static_cast<int>((cal_end + le - 1) / le) : 0;
  const long long ev_begin = skip * le, ev_end = (skip + static_cast<long long>(a.windows)) * le;
  DEPTHKV_CHECK(!same_text || ev_end <= cal_begin || ev_begin >= cal_end,
                "evaluation windows (tokens " << ev_begin << ".." << ev_end << " of " << base_name(src)
                                              << ") overlap the profile's calibration windows (tokens " << cal_begin
                                              << ".." << cal_end << "): use --skip >= "
                                              << (cal_end + le - 1) / le);
  LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/a.tokens.empty());
  const LlamaEngine engine(lm.model);
  const int L = lm.model.config.n_layers;
  DEPTHKV_CHECK(L == f.n_layers, "the profile has " << f.n_layers << " layers, the model " << L);
  DEPTHKV_CHECK(context + continuation <= lm.model.config.seq_len,
                "context + continuation = " << context + continuation << " exceeds the model's trained context "
                                            << lm.model.config.seq_len);
  std::vector<EvalWindow> windows = load_windows(src, lm.tokenizer.get(), context, continuation, skip, a.windows,
                                                 !a.tokens.empty(), lm.model.config.vocab_size);
  std::fprintf(stderr, "eval: %s, %d windows of %d+%d tokens from %s (windows %d..%d), scorers %s\n",
               base_name(a.model).c_str(), a.windows, context, continuation, base_name(src).c_str(), skip,
               skip + a.windows - 1, a.scorers.empty() ? "(all in the profile)" : a.scorers.c_str());

  EvalConfig ecfg;
  ecfg.scorers = scfg;
  ecfg.protection = a.sel.protection();
  ecfg.chunk_size = a.chunk;
  ecfg.n_threads = a.threads;
  const auto t0 = std::chrono::steady_clock::now();
  const PruningEvaluator ev(engine, std::move(windows), ecfg);
  const double full_s = seconds_since(t0);
  std::vector<double> nll_full;
  for (int w = 0; w < ev.n_windows(); ++w) nll_full.push_back(ev.nll_full(w));

  const std::vector<int> lengths(static_cast<std::size_t>(L), context);
  std::vector<Row> rows;
  Progress bar("eval");
  const long long total = static_cast<long long>(scorers.size() * keeps.size() * policies.size());
  const auto t1 = std::chrono::steady_clock::now();
  for (std::size_t s = 0; s < scorers.size(); ++s)
    for (double keep : keeps)
      for (AllocationPolicy policy : policies) {
        const PolicyInputs in = policy_inputs(policy, keep, lengths, &f, scorers[s], a.sel, a.min_tokens);
        Row r;
        r.scorer = scorers[s];
        r.policy = to_string(policy);
        r.keep = keep;
        r.budgets = BudgetAllocator().allocate(policy, in.req, in.has_profile ? &in.profile : nullptr);
        std::vector<double> kl, dnll, top1, kept, full;
        for (const WindowResult& wr : ev.evaluate_budgets(r.budgets, static_cast<int>(s))) {
          kl.push_back(wr.metrics.loss.kl);
          dnll.push_back(wr.metrics.loss.dnll);
          top1.push_back(1.0 - wr.metrics.loss.top1_disagree);
          kept.push_back(static_cast<double>(wr.bytes_kept));
          full.push_back(static_cast<double>(wr.bytes_full));
        }
        r.kl = mean_of(kl);
        r.kl_se = stderr_of(kl);
        r.dnll = mean_of(dnll);
        r.top1 = mean_of(top1);
        r.nll_full = mean_of(nll_full);
        r.bytes_kept = mean_of(kept);
        r.bytes_full = mean_of(full);
        rows.push_back(r);
        bar.update(static_cast<long long>(rows.size()), total);
      }
  const double eval_s = seconds_since(t1);

  if (a.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const Row& r : rows)
      arr.push_back({{"scorer", r.scorer},
                     {"policy", r.policy},
                     {"keep", r.keep},
                     {"budgets", r.budgets},
                     {"kl", r.kl},
                     {"dnll", r.dnll},
                     {"top1", r.top1},
                     {"nll_full", r.nll_full},
                     {"bytes_kept", r.bytes_kept},
                     {"bytes_full", r.bytes_full}});
    std::printf("%s\n", arr.dump(2).c_str());
  } else {
    std::printf("evaluation: %s, %d windows (%d..%d) of %s, context %d + continuation %d; full-cache NLL %.4f nats\n",
                base_name(a.model).c_str(), a.windows, skip, skip + a.windows - 1, base_name(src).c_str(), context,
                continuation, mean_of(nll_full));
    std::printf("profile: %s (%d calibration windows %lld..%lld of %s), %s\n", base_name(a.profile).c_str(),
                f.calibration.samples, f.calibration.window_begin, f.calibration.window_end - 1,
                base_name(f.calibration.text_file).c_str(), a.sel.describe().c_str());
    std::printf("%-7s %-12s %5s  %-24s %9s %8s %8s %7s %10s\n", "scorer", "policy", "keep", "budgets/layer", "KL",
                "+-se", "dNLL", "top1", "KV kept");
    for (const Row& r : rows)
      std::printf("%-7s %-12s %5.2f  %-24s %9.5f %8.5f %8.5f %7.4f %9.1f%%\n", r.scorer.c_str(), r.policy.c_str(), r.keep,
                  join(r.budgets, ",").c_str(), r.kl, r.kl_se, r.dnll, r.top1, 100.0 * r.bytes_kept / r.bytes_full);
    // Each policy's KL against uniform's at the same budget.
    std::printf("\nKL relative to uniform at the same budget (negative = better than uniform):\n");
    for (const std::string& sc : scorers)
      for (double keep : keeps) {
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
    std::printf("time: full passes %.2f s, %zu evaluations %.2f s\n", full_s, rows.size(), eval_s);
  }
  if (!a.csv.empty()) write_csv(a.csv, rows, f, scorers);
  if (!a.plot.empty()) {
    std::ostringstream title;
    title << base_name(a.model) << ": " << a.windows << " eval windows of " << base_name(src) << " (" << context << "+"
          << continuation << " tokens)";
    write_plot(a.plot, rows, f, scorers, policy_names, title.str());
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* c = app.add_subcommand("eval", "evaluate allocation policies against the full cache on held-out windows");
  c->add_option("--model", a->model, "model file (llama2.c .bin or GGUF)")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file where the model file holds none");
  c->add_option("--text", a->text, "evaluation text (stories separated by blank lines)");
  c->add_option("--tokens", a->tokens, "pre-tokenized evaluation input: a file of token ids (instead of --text)");
  c->add_option("--profile", a->profile, "profile file of this model (from depthkv profile)")->required();
  c->add_option("--keep", a->keeps, "global keep ratios")->capture_default_str();
  c->add_option("--policies", a->policies,
                "any of uniform, pyramid, proportional, middle, optimal, mga, mlma2, mlma4, mlma6, mlp")
      ->capture_default_str();
  c->add_option("--scorers", a->scorers, "scorers (default: all in the profile)");
  c->add_option("--context", a->context, "context tokens (default: the profile's)");
  c->add_option("--continuation", a->continuation, "continuation tokens (default: the profile's)");
  c->add_option("--windows", a->windows, "evaluation windows")->capture_default_str();
  c->add_option("--skip", a->skip, "windows skipped (default: first window after the calibration windows)");
  c->add_option("--min-tokens", a->min_tokens,
                "safeguard floor per layer for optimal/proportional/mga/mlma (-1: sinks + window + 8; 0: off)")
      ->capture_default_str();
  a->sel.add_options(c, /*with_kernel=*/true);
  c->add_option("--chunk", a->chunk, "prefill chunk size")->capture_default_str();
  c->add_option("--threads", a->threads, "threads (0: OpenMP default)")->capture_default_str();
  c->add_flag("--json", a->json, "print the rows as one JSON array");
  c->add_option("--csv", a->csv, "write the rows (and the profile's sensitivity curves to *-sensitivity.csv)");
  c->add_option("--plot", a->plot, "write quality-vs-budget and per-layer sensitivity curves (SVG, gnuplot)");
  c->callback([a] { run_eval(*a); });
}

}  // namespace depthkv_cli
