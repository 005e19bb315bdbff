// gguf_engine_bench: resident memory and speed of the reference engine on a GGUF file whose
// weights stay in their stored blocks (llama::QuantWeight, memory-mapped; see llama/gguf.hpp).
//
// Reports the file size; resident memory (VmRSS, and its file-backed and anonymous parts, from
// /proc/self/status) before loading, after loading, and after the prefill and decode; the bytes
// of weights held in place and as float32; prefill tokens/s (one batched prefill, chunked) and
// decode tokens/s. --dequantize loads the float32 twin instead (every weight converted), for
// comparison. Write a synthetic TinyLlama-1.1B-shaped Q4_K file with benchmarks/synthetic_gguf.py.
//
// For the llama.cpp cross-check (benchmarks/llamacpp_check/run.py): --tokens F takes the prompt
// (its first --prompt ids) and the decoded ids from a file of whitespace-separated token ids
// (decode then teacher-forces the ids after the prompt instead of greedy ones); --repeat R runs
// the timed prefill + decode R times on fresh caches and reports the fastest; --logits-out F
// then runs a separate prefill of the first --logits-tokens ids with every position's logits
// and writes them to F as raw little-endian float32 [n][vocab] (after the peak RSS is taken);
// --json F writes the figures as one JSON object.
//
// Usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize]
//          [--tokens F] [--logits-out F] [--logits-tokens N] [--repeat R] [--json F]

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
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
  std::string path, tokens_path, logits_path, json_path;
  int prompt = 128, decode = 16, chunk = 1024, threads = 0, logits_tokens = 64, repeat = 1;
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
    else if (!std::strcmp(argv[i], "--tokens")) tokens_path = next("--tokens");
    else if (!std::strcmp(argv[i], "--logits-out")) logits_path = next("--logits-out");
    else if (!std::strcmp(argv[i], "--logits-tokens")) logits_tokens = std::atoi(next("--logits-tokens"));
    else if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(next("--repeat"));
    else if (!std::strcmp(argv[i], "--json")) json_path = next("--json");
    else if (argv[i][0] != '-' && path.empty()) path = argv[i];
    else {
      std::fprintf(stderr, "usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize] "
                           "[--tokens F] [--logits-out F] [--logits-tokens N] [--repeat R] [--json F]\n");
      return 2;
    }
  }
  if (path.empty() || prompt < 1 || decode < 0 || chunk < 1 || threads < 0 || logits_tokens < 1 || repeat < 1) {
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

    const double rss_load_mb = status_mb("VmRSS");

    const LlamaEngine engine(model);
    std::vector<int> ids;
    if (!tokens_path.empty()) {
      std::ifstream in(tokens_path);
      DEPTHKV_CHECK(in.good(), "cannot open --tokens file " << tokens_path);
      ids.assign(std::istream_iterator<int>(in), std::istream_iterator<int>());
      DEPTHKV_CHECK(static_cast<int>(ids.size()) >= std::max(prompt + decode, logits_path.empty() ? 0 : logits_tokens),
                    tokens_path << " has " << ids.size() << " token ids, need " << prompt + decode);
    }
    const std::vector<int> tokens = ids.empty() ? std::vector<int>() : std::vector<int>(ids.begin(), ids.begin() + prompt);
    std::vector<int> synth_tokens;
    if (ids.empty()) {
      synth_tokens.resize(static_cast<std::size_t>(prompt));
      for (int i = 0; i < prompt; ++i) synth_tokens[static_cast<std::size_t>(i)] = (i * 7919 + 13) % c.vocab_size;
    }
    const std::vector<int>& prompt_ids = ids.empty() ? synth_tokens : tokens;
    ForwardOptions opt;
    opt.chunk_size = chunk;
    opt.n_threads = threads;
    opt.all_logits = false;
    double best_prefill = 1e300, best_decode = 1e300;
    std::string prefill_runs, decode_runs;
    for (int rep = 0; rep < repeat; ++rep) {
      HostCache cache = engine.make_cache(prompt + decode);  // sized once, as a serving engine sizes a sequence
      EngineStats pst;
      opt.stats = &pst;
      t0 = Clock::now();
      const RowMatrix last = engine.prefill(prompt_ids, 0, cache, opt);
      const double prefill_s = seconds(t0);
      std::printf("  prefill %d tokens: %.2f s = %.1f tokens/s (matmul %.0f%%, attention %.0f%%)\n", prompt, prefill_s,
                  prompt / prefill_s, 100 * pst.matmul_s / pst.total(), 100 * pst.attention_s / pst.total());
      print_rss("after prefill", file_mb);
      Eigen::Index next = 0;
      last.row(0).maxCoeff(&next);
      EngineStats dst;
      t0 = Clock::now();
      for (int i = 0; i < decode; ++i) {
        const int tok = ids.empty() ? static_cast<int>(next) : ids[static_cast<std::size_t>(prompt + i)];
        const Eigen::VectorXf lg = engine.decode(tok, prompt + i, cache, &dst, opt);
        lg.maxCoeff(&next);
      }
      const double decode_s = seconds(t0);
      if (decode > 0)
        std::printf("  decode %d tokens: %.2f s = %.2f tokens/s (matmul %.0f%%)\n", decode, decode_s, decode / decode_s,
                    100 * dst.matmul_s / dst.total());
      print_rss("after decode", file_mb);
      best_prefill = std::min(best_prefill, prefill_s);
      best_decode = std::min(best_decode, decode_s);
      prefill_runs += (rep ? ", " : "") + std::to_string(prompt / prefill_s);
      decode_runs += (rep ? ", " : "") + std::to_string(decode > 0 ? decode / decode_s : 0.0);
    }
    std::printf("  peak RSS (VmHWM) %.1f MiB = %.3fx the file\n", status_mb("VmHWM"), status_mb("VmHWM") / file_mb);
    const double vmhwm_mb = status_mb("VmHWM");  // before the logits run (its [n x vocab] output is the check's, not the engine's)
    if (!logits_path.empty()) {
      const std::vector<int> lt = ids.empty() ? std::vector<int>(prompt_ids.begin(), prompt_ids.begin() + std::min(prompt, logits_tokens))
                                              : std::vector<int>(ids.begin(), ids.begin() + logits_tokens);
      HostCache lc = engine.make_cache();
      opt.stats = nullptr;
      opt.all_logits = true;
      const RowMatrix all = engine.prefill(lt, 0, lc, opt);
      std::ofstream out(logits_path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(sizeof(float) * all.size()));
      DEPTHKV_CHECK(out.good(), "cannot write " << logits_path);
      std::printf("  logits of %d positions x %d written to %s\n", static_cast<int>(all.rows()), c.vocab_size,
                  logits_path.c_str());
    }
    if (!json_path.empty()) {
      // KV cache of prompt + decode tokens, float32 keys and values
      const double kv_mb = 2.0 * 4.0 * c.n_layers * c.n_kv_heads * c.head_dim * (prompt + decode) / 1048576.0;
      std::ofstream js(json_path);
      js << "{\"file_mb\": " << file_mb << ", \"prompt\": " << prompt << ", \"decode\": " << decode
         << ", \"threads\": " << threads << ", \"prefill_tok_s\": " << prompt / best_prefill
         << ", \"decode_tok_s\": " << (decode > 0 ? decode / best_decode : 0.0) << ", \"prefill_runs\": [" << prefill_runs
         << "], \"decode_runs\": [" << decode_runs << "], \"rss_after_load_mb\": " << rss_load_mb
         << ", \"vmhwm_mb\": " << vmhwm_mb << ", \"kv_cache_mb\": " << kv_mb
         << ", \"weights_in_place_mb\": " << qb / 1048576.0 << ", \"weights_float32_mb\": " << fb / 1048576.0 << "}\n";
      DEPTHKV_CHECK(js.good(), "cannot write " << json_path);
    }
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "gguf_engine_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
