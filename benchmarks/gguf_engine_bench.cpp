// gguf_engine_bench: resident memory and speed of the reference engine on a GGUF file whose
// weights stay in their stored blocks (llama::QuantWeight, memory-mapped; see llama/gguf.hpp).
//
// Reports the file size; resident memory (VmRSS, and its file-backed and anonymous parts, from
// /proc/self/status) before loading, after loading, and after the prefill and decode; the bytes
// of weights held in place and as float32; prefill tokens/s (one batched prefill, chunked) and
// decode tokens/s. --dequantize loads the float32 twin instead (every weight converted), for
// comparison. Write a synthetic TinyLlama-1.1B-shaped Q4_K file with benchmarks/synthetic_gguf.py.
//
// Usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize]

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/gguf.hpp"

using namespace depthkv::llama;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// A `kB` field of /proc/self/status in MiB (0 when absent, e.g. off Linux).
double status_mb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') return std::atof(line.c_str() + n + 1) / 1024.0;
  }
  return 0;
}

void print_rss(const char* when, double file_mb) {
  const double rss = status_mb("VmRSS");
  std::printf("  RSS %-14s %8.1f MiB (file-backed %7.1f, anonymous %7.1f) = %.3fx the file\n", when, rss,
              status_mb("RssFile"), status_mb("RssAnon"), rss / file_mb);
}

void add_weight(const RowMatrix& w, const QuantWeight& q, double& quant_bytes, double& float_bytes) {
  quant_bytes += static_cast<double>(q.n_bytes());
  float_bytes += 4.0 * static_cast<double>(w.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int prompt = 128, decode = 16, chunk = 1024, threads = 0;
  bool dequantize = false;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* opt) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", opt);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--prompt")) prompt = std::atoi(next("--prompt"));
    else if (!std::strcmp(argv[i], "--decode")) decode = std::atoi(next("--decode"));
    else if (!std::strcmp(argv[i], "--chunk")) chunk = std::atoi(next("--chunk"));
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(next("--threads"));
    else if (!std::strcmp(argv[i], "--dequantize")) dequantize = true;
    else if (argv[i][0] != '-' && path.empty()) path = argv[i];
    else {
      std::fprintf(stderr, "usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize]\n");
      return 2;
    }
  }
  if (path.empty() || prompt < 1 || decode < 0 || chunk < 1 || threads < 0) {
    std::fprintf(stderr, "usage: gguf_engine_bench FILE [--prompt N >= 1] [--decode N >= 0] [--chunk N >= 1] [--threads N >= 0] [--dequantize]\n");
    return 2;
  }
  try {
    std::printf("gguf_engine_bench %s (%s weights), %d threads (0 = OpenMP default)\n", path.c_str(),
                dequantize ? "float32 twin" : "stored blocks in place", threads);
    print_rss("before load", 1.0);  // ratio meaningless here
    auto t0 = Clock::now();
    const LlamaModel model = load_gguf(path, GgufLoadOptions{dequantize});
    const double load_s = seconds(t0);
    const double file_mb = static_cast<double>(model.file_size) / (1024.0 * 1024.0);
    const LlamaConfig& c = model.config;
    double qb = 0, fb = 0;
    add_weight(model.token_embedding, model.token_embedding_quant, qb, fb);
    if (model.classifier_quant.data != model.token_embedding_quant.data || model.classifier_quant.empty())
      add_weight(model.classifier, model.classifier_quant, qb, fb);
    for (const LlamaLayerWeights& w : model.layers) {
      add_weight(w.wq, w.wq_quant, qb, fb);
      add_weight(w.wk, w.wk_quant, qb, fb);
      add_weight(w.wv, w.wv_quant, qb, fb);
      add_weight(w.wo, w.wo_quant, qb, fb);
      add_weight(w.w1, w.w1_quant, qb, fb);
      add_weight(w.w2, w.w2_quant, qb, fb);
      add_weight(w.w3, w.w3_quant, qb, fb);
    }
    std::printf("  model: dim %d, hidden %d, %d layers, %d / %d heads, vocab %d; file %.1f MiB, loaded in %.2f s\n", c.dim,
                c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, file_mb, load_s);
    std::printf("  weight matrices: %.1f MiB in place (stored blocks), %.1f MiB float32\n", qb / 1048576.0, fb / 1048576.0);
    print_rss("after load", file_mb);

    const LlamaEngine engine(model);
    std::vector<int> tokens(static_cast<std::size_t>(prompt));
    for (int i = 0; i < prompt; ++i) tokens[static_cast<std::size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
    HostCache cache = engine.make_cache();
    ForwardOptions opt;
    opt.chunk_size = chunk;
    opt.all_logits = false;
    opt.n_threads = threads;
    EngineStats pst;
    opt.stats = &pst;
    t0 = Clock::now();
    const RowMatrix last = engine.prefill(tokens, 0, cache, opt);
    const double prefill_s = seconds(t0);
    std::printf("  prefill %d tokens: %.2f s = %.1f tokens/s (matmul %.0f%%, attention %.0f%%)\n", prompt, prefill_s,
                prompt / prefill_s, 100 * pst.matmul_s / pst.total(), 100 * pst.attention_s / pst.total());
    print_rss("after prefill", file_mb);
    Eigen::Index next = 0;
    last.row(0).maxCoeff(&next);
    EngineStats dst;
    detail::ScopedThreads scoped(threads);
    t0 = Clock::now();
    for (int i = 0; i < decode; ++i) {
      const Eigen::VectorXf lg = engine.decode(static_cast<int>(next), prompt + i, cache, &dst);
      lg.maxCoeff(&next);
    }
    const double decode_s = seconds(t0);
    if (decode > 0)
      std::printf("  decode %d tokens: %.2f s = %.2f tokens/s (matmul %.0f%%)\n", decode, decode_s, decode / decode_s,
                  100 * dst.matmul_s / dst.total());
    print_rss("after decode", file_mb);
    std::printf("  peak RSS (VmHWM) %.1f MiB = %.3fx the file\n", status_mb("VmHWM"), status_mb("VmHWM") / file_mb);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "gguf_engine_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
