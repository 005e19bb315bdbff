// depthkv perplexity: mean NLL and perplexity of the full cache over consecutive windows of a
// text (or of pre-tokenized ids), as llama.cpp's llama-perplexity computes it
// (depthkv/llama/perplexity.hpp), to check a model before profiling it.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "commands.hpp"
#include "depthkv/detail/timer.hpp"
#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/perplexity.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "model_io.hpp"

namespace depthkv_cli {
namespace {

struct PerplexityArgs {
  std::string model, tokenizer, text, tokens;
  int context = 512, windows = 0, chunk = 1024, threads = 0;
  bool json = false;
};

void run_perplexity(const PerplexityArgs& a) {
  using namespace depthkv::llama;
  DEPTHKV_CHECK(a.text.empty() != a.tokens.empty(), "give exactly one of --text FILE and --tokens FILE");
  const LoadedModel lm = load_model(a.model, a.tokenizer, /*need_tokenizer=*/!a.text.empty());
  const LlamaEngine engine(lm.model);
  std::vector<int> ids;
  int bos = -1;
  if (!a.text.empty()) {
    // the whole file as one stream, BOS first when the vocabulary adds it (as llama-perplexity)
    const auto* bpe = dynamic_cast<const BpeTokenizer*>(lm.tokenizer.get());
    const bool add_bos = bpe == nullptr || bpe->add_bos();
    ids = lm.tokenizer->encode(read_text_file(a.text), add_bos, false);
    if (add_bos) bos = lm.tokenizer->bos_id();
  } else {
    ids = read_token_file(a.tokens, lm.model.config.vocab_size);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const PerplexityResult r = perplexity(engine, ids, a.context, a.windows, bos, a.chunk, a.threads);
  const double secs = depthkv::detail::seconds_since(t0);
  if (a.json) {
    nlohmann::json j = {{"model", base_name(a.model)},
                        {"input", base_name(a.text.empty() ? a.tokens : a.text)},
                        {"context", r.context},
                        {"windows", r.n_windows},
                        {"tokens_scored", r.n_scored},
                        {"nll", r.nll},
                        {"nll_stderr", r.nll_stderr},
                        {"ppl", r.ppl},
                        {"window_nll", r.window_nll}};
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf("perplexity: %s, %d windows of %d tokens from %s (%zu tokens), the last %d of each window scored\n",
              base_name(a.model).c_str(), r.n_windows, r.context, base_name(a.text.empty() ? a.tokens : a.text).c_str(),
              ids.size(), r.context - 1 - r.context / 2);
  double sum = 0;
  for (int w = 0; w < r.n_windows; ++w) {  // running perplexity, as llama-perplexity prints it
    sum += r.window_nll[static_cast<std::size_t>(w)];
    std::printf("[%d]%.4f%s", w + 1, std::exp(sum / (w + 1)), w + 1 < r.n_windows ? "," : "\n");
  }
  std::printf("mean NLL %.6f +/- %.6f nats over %lld tokens; PPL = %.4f +/- %.4f\n", r.nll, r.nll_stderr, r.n_scored,
              r.ppl, r.ppl * r.nll_stderr);
  std::printf("time: %.2f s (%.1f tokens/s)\n", secs, static_cast<double>(r.n_windows) * r.context / secs);
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* c = app.add_subcommand(
      "perplexity", "mean NLL and perplexity of the full cache over consecutive windows (as llama-perplexity)");
  c->add_option("--model", a->model, "model file (llama2.c .bin or GGUF)")->required();
  c->add_option("--tokenizer", a->tokenizer, "tokenizer file where the model file holds none (default: from the GGUF, or tok512.bin beside a .bin)");
  c->add_option("--text", a->text, "text file, tokenized whole (BOS first when the vocabulary adds it)");
  c->add_option("--tokens", a->tokens, "pre-tokenized input: a file of token ids (instead of --text)");
  c->add_option("--context", a->context, "tokens per window; the second half of each is scored")
      ->capture_default_str()
      ->check(at_least(4));
  c->add_option("--windows", a->windows, "windows to run (0: every whole window)")->capture_default_str()->check(at_least(0));
  c->add_option("--chunk", a->chunk, "prefill chunk size")->capture_default_str()->check(at_least(1));
  c->add_option("--threads", a->threads, "windows in parallel (0: OpenMP default)")
      ->capture_default_str()
      ->check(thread_count());
  c->add_flag("--json", a->json, "print the result as one JSON object");
  c->callback([a] { run_perplexity(*a); });
}

}  // namespace depthkv_cli
