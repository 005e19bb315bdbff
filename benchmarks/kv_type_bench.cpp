// kv_type_bench: what storing the KV cache in F16 instead of float32 changes in the output, and
// what it saves.
//
// For stories260K (windows 24..87 of 384 + 128 tokens of tinystories_valid.txt, the main job's
// evaluation windows) and aidreams260K (windows 48..175 of 96 + 32 tokens), each window's context
// is prefilled and its continuation teacher-forced, full cache, once on a float32 cache
// (`make_cache()`) and once on an F16 cache (`make_cache<Eigen::half>()`). Reports over the
// continuation positions, as the quality protocol measures pruning: mean KL(F32 KV || F16 KV) of
// the next-token distributions (and its largest window mean), the NLL increase of the true
// tokens, top-1 agreement, and the cache bytes of each type.
//
// Usage: kv_type_bench [--data DIR] [--threads T]

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/metrics.hpp"
#include "bench_args.hpp"

using namespace depthkv::llama;

namespace {

struct ModelRun {
  const char* name;
  const char* bin;
  const char* tok;
  int context, continuation, skip, windows;
};

/// Context prefill, then the continuation teacher-forced, on `cache`; the continuation's logits.
template <class Cache>
RowMatrix continuation_logits(const LlamaEngine& engine, const EvalWindow& w, Cache& cache, int threads) {
  ForwardOptions opt;
  opt.n_threads = threads;
  opt.all_logits = false;
  engine.prefill(w.context, 0, cache, opt);
  opt.all_logits = true;
  return engine.teacher_force(w.continuation, static_cast<std::int32_t>(w.context.size()), cache, opt);
}

void run_model(const ModelRun& r, const std::string& data, int threads) {
  const LlamaModel model = load_llama2c(data + "/models/" + r.name + "/" + r.bin);
  const LlamaEngine engine(model);
  const Tokenizer tok(data + "/models/" + r.name + "/" + r.tok, model.config.vocab_size);
  const auto ids = encode_stories(tok, split_stories(read_text_file(data + "/text/tinystories_valid.txt")));
  const auto windows =
      split_windows(token_windows(ids, r.context + r.continuation, r.skip, r.windows), r.context);
  double kl = 0, kl_max = 0, dnll = 0, agree = 0, nll = 0;
  std::size_t bytes32 = 0, bytes16 = 0;
  for (const EvalWindow& w : windows) {
    HostCache c32 = engine.make_cache();
    HostCacheF16 c16 = engine.make_cache<Eigen::half>();
    const RowMatrix l32 = continuation_logits(engine, w, c32, threads);
    const RowMatrix l16 = continuation_logits(engine, w, c16, threads);
    const depthkv::ContinuationMetrics m =
        depthkv::compare_logits(l32, l16, depthkv::continuation_targets(w.continuation));
    kl += m.loss.kl;
    kl_max = std::max(kl_max, m.loss.kl);
    dnll += m.loss.dnll;
    nll += m.nll_full;
    agree += 1.0 - m.loss.top1_disagree;
    bytes32 = c32.bytes();
    bytes16 = c16.bytes();
  }
  const double n = static_cast<double>(windows.size());
  std::printf("%-13s %3zu windows (%d..%d) of %d + %d: KL(F32 KV || F16 KV) %.3e (largest window %.3e), "
              "dNLL %+.3e of %.4f nats, top1 %.4f; KV bytes per window %zu (F32) vs %zu (F16)\n",
              r.name, windows.size(), r.skip, r.skip + r.windows - 1, r.context, r.continuation, kl / n, kl_max,
              dnll / n, nll / n, agree / n, bytes32, bytes16);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = depthkv_bench::default_data_dir();
  int threads = 1;
  depthkv_bench::Args args("kv_type_bench");
  args.option("--data", data).option("--threads", threads);
  if (!args.parse(argc, argv)) return 2;
  try {
    run_model({"stories260K", "stories260K.bin", "tok512.bin", 384, 128, 24, 64}, data, threads);
    run_model({"aidreams260K", "aidreams260K.bin", "tok512.bin", 96, 32, 48, 128}, data, threads);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "kv_type_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
