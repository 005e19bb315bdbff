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
// --json F writes the figures as one JSON object (prefill_tok_s and decode_tok_s: the fastest run;
// prefill_runs and decode_runs: every run's tok/s). --kv-type: the cache's keys and values in
// float32 (the default) or F16 (as llama.cpp's default cache and depthkv generate hold them).
//
// Usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize]
//          [--tokens F] [--logits-out F] [--logits-tokens N] [--repeat R] [--json F] [--kv-type f16|f32]

#include <algorithm>
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

struct Settings {
  std::string path, tokens_path, logits_path, json_path, kv_type = "f32";
  int prompt = 128, decode = 16, chunk = 1024, threads = 0, logits_tokens = 64, repeat = 1;
  bool dequantize = false;
};

/// The options that take a value: whole numbers (read with atoi) and file names.
struct IntOption {
  const char* name;
  int Settings::*field;
};
struct TextOption {
  const char* name;
  std::string Settings::*field;
};
const IntOption kIntOptions[] = {
    {"--prompt", &Settings::prompt},   {"--decode", &Settings::decode},
    {"--chunk", &Settings::chunk},     {"--threads", &Settings::threads},
    {"--repeat", &Settings::repeat},   {"--logits-tokens", &Settings::logits_tokens},
};
const TextOption kTextOptions[] = {
    {"--tokens", &Settings::tokens_path}, {"--logits-out", &Settings::logits_path}, {"--json", &Settings::json_path},
    {"--kv-type", &Settings::kv_type},
};

/// The value after option argv[i] (i then points at it); exits with status 2 when there is none.
const char* option_value(int argc, char** argv, int& i) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

/// Sets the option argv[i] of kIntOptions or kTextOptions from its value; false when it is neither.
bool set_valued_option(int argc, char** argv, int& i, Settings& s) {
  for (const IntOption& o : kIntOptions)
    if (!std::strcmp(argv[i], o.name)) {
      s.*o.field = std::atoi(option_value(argc, argv, i));
      return true;
    }
  for (const TextOption& o : kTextOptions)
    if (!std::strcmp(argv[i], o.name)) {
      s.*o.field = option_value(argc, argv, i);
      return true;
    }
  return false;
}

/// Parses and checks the options; prints the usage line and returns false when they are wrong.
bool parse_settings(int argc, char** argv, Settings& s) {
  for (int i = 1; i < argc; ++i) {
    if (set_valued_option(argc, argv, i, s)) continue;
    if (!std::strcmp(argv[i], "--dequantize")) s.dequantize = true;
    else if (argv[i][0] != '-' && s.path.empty()) s.path = argv[i];
    else {
      std::fprintf(stderr, "usage: gguf_engine_bench FILE [--prompt N] [--decode N] [--chunk N] [--threads N] [--dequantize] "
                           "[--tokens F] [--logits-out F] [--logits-tokens N] [--repeat R] [--json F] [--kv-type f16|f32]\n");
      return false;
    }
  }
  if (s.path.empty() || s.prompt < 1 || s.decode < 0 || s.chunk < 1 || s.threads < 0 || s.logits_tokens < 1 || s.repeat < 1 ||
      (s.kv_type != "f16" && s.kv_type != "f32")) {
    std::fprintf(stderr, "usage: gguf_engine_bench FILE [--prompt N >= 1] [--decode N >= 0] [--chunk N >= 1] [--threads N >= 0] [--dequantize] [--kv-type f16|f32]\n");
    return false;
  }
  return true;
}

/// What the report and the --json object hold.
struct Figures {
  double file_mb = 0, rss_load_mb = 0, vmhwm_mb = 0;
  double quant_bytes = 0, float_bytes = 0;           ///< weight matrices in place and as float32
  double best_prefill = 1e300, best_decode = 1e300;  ///< seconds, the fastest of the --repeat runs
  std::string prefill_runs, decode_runs;             ///< tokens/s of each run, comma-separated
};

/// Bytes of the weight matrices in place and as float32 (a tied classifier counted once).
void weight_bytes(const LlamaModel& model, Figures& f) {
  double& qb = f.quant_bytes;
  double& fb = f.float_bytes;
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
}

/// Loads the model and reports its shape, its weights and the RSS after the load.
LlamaModel load_and_report(const Settings& s, Figures& f) {
  const auto t0 = Clock::now();
  LlamaModel model = load_gguf(s.path, GgufLoadOptions{s.dequantize});
  const double load_s = seconds(t0);
  f.file_mb = static_cast<double>(model.file_size) / (1024.0 * 1024.0);
  const LlamaConfig& c = model.config;
  weight_bytes(model, f);
  std::printf("  model: dim %d, hidden %d, %d layers, %d / %d heads, vocab %d; file %.1f MiB, loaded in %.2f s\n", c.dim,
              c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, f.file_mb, load_s);
  std::printf("  weight matrices: %.1f MiB in place (stored blocks), %.1f MiB float32\n", f.quant_bytes / 1048576.0,
              f.float_bytes / 1048576.0);
  print_rss("after load", f.file_mb);
  f.rss_load_mb = status_mb("VmRSS");
  return model;
}

/// The ids of the --tokens file (none without one).
std::vector<int> read_token_ids(const Settings& s) {
  std::vector<int> ids;
  if (s.tokens_path.empty()) return ids;
  std::ifstream in(s.tokens_path);
  DEPTHKV_CHECK_AS("main", in.good(), "cannot open --tokens file " << s.tokens_path);
  ids.assign(std::istream_iterator<int>(in), std::istream_iterator<int>());
  const int need = std::max(s.prompt + s.decode, s.logits_path.empty() ? 0 : s.logits_tokens);
  DEPTHKV_CHECK_AS("main", static_cast<int>(ids.size()) >= need,
                   s.tokens_path << " has " << ids.size() << " token ids, need " << s.prompt + s.decode);
  return ids;
}

/// The prompt: the first --prompt ids of the --tokens file, else synthetic ids.
std::vector<int> prompt_ids(const std::vector<int>& ids, int prompt, int vocab_size) {
  if (!ids.empty()) return std::vector<int>(ids.begin(), ids.begin() + prompt);
  std::vector<int> synth(static_cast<std::size_t>(prompt));
  for (int i = 0; i < prompt; ++i) synth[static_cast<std::size_t>(i)] = (i * 7919 + 13) % vocab_size;
  return synth;
}

ForwardOptions forward_options(const Settings& s, bool all_logits) {
  ForwardOptions opt;
  opt.chunk_size = s.chunk;
  opt.n_threads = s.threads;
  opt.all_logits = all_logits;
  return opt;
}

/// One timed prefill + decode on a fresh cache of `Scalar` keys and values: reports them and keeps the fastest.
template <class Scalar>
void timed_run(const LlamaEngine& engine, const Settings& s, const std::vector<int>& ids,
               const std::vector<int>& prompt, int rep, Figures& f) {
  auto cache = engine.template make_cache<Scalar>(s.prompt + s.decode);  // sized once, as a serving engine sizes a sequence
  ForwardOptions opt = forward_options(s, false);
  EngineStats pst;
  opt.stats = &pst;
  auto t0 = Clock::now();
  const RowMatrix last = engine.prefill(prompt, 0, cache, opt);
  const double prefill_s = seconds(t0);
  std::printf("  prefill %d tokens: %.2f s = %.1f tokens/s (matmul %.0f%%, attention %.0f%%)\n", s.prompt, prefill_s,
              s.prompt / prefill_s, 100 * pst.matmul_s / pst.total(), 100 * pst.attention_s / pst.total());
  print_rss("after prefill", f.file_mb);
  Eigen::Index next = 0;
  last.row(0).maxCoeff(&next);
  EngineStats dst;
  t0 = Clock::now();
  for (int i = 0; i < s.decode; ++i) {  // greedy, or teacher-forced on the --tokens ids
    const int tok = ids.empty() ? static_cast<int>(next) : ids[static_cast<std::size_t>(s.prompt + i)];
    const Eigen::VectorXf lg = engine.decode(tok, s.prompt + i, cache, &dst, opt);
    lg.maxCoeff(&next);
  }
  const double decode_s = seconds(t0);
  if (s.decode > 0)
    std::printf("  decode %d tokens: %.2f s = %.2f tokens/s (matmul %.0f%%)\n", s.decode, decode_s, s.decode / decode_s,
                100 * dst.matmul_s / dst.total());
  print_rss("after decode", f.file_mb);
  f.best_prefill = std::min(f.best_prefill, prefill_s);
  f.best_decode = std::min(f.best_decode, decode_s);
  f.prefill_runs += (rep ? ", " : "") + std::to_string(s.prompt / prefill_s);
  f.decode_runs += (rep ? ", " : "") + std::to_string(s.decode > 0 ? s.decode / decode_s : 0.0);
}

/// --logits-out: every position's logits of a separate prefill of the first --logits-tokens ids.
void write_logits(const LlamaEngine& engine, const Settings& s, const std::vector<int>& ids,
                  const std::vector<int>& prompt) {
  const std::vector<int> lt = ids.empty()
                                  ? std::vector<int>(prompt.begin(), prompt.begin() + std::min(s.prompt, s.logits_tokens))
                                  : std::vector<int>(ids.begin(), ids.begin() + s.logits_tokens);
  HostCache lc = engine.make_cache();
  const RowMatrix all = engine.prefill(lt, 0, lc, forward_options(s, true));
  std::ofstream out(s.logits_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(all.data()), static_cast<std::streamsize>(sizeof(float) * all.size()));
  DEPTHKV_CHECK_AS("main", out.good(), "cannot write " << s.logits_path);
  std::printf("  logits of %d positions x %d written to %s\n", static_cast<int>(all.rows()), engine.config().vocab_size,
              s.logits_path.c_str());
}

void write_json(const Settings& s, const LlamaConfig& c, const Figures& f) {
  // KV cache of prompt + decode tokens, keys and values of --kv-type
  const double kv_mb = 2.0 * (s.kv_type == "f16" ? 2.0 : 4.0) * c.n_layers * c.n_kv_heads * c.head_dim * (s.prompt + s.decode) / 1048576.0;
  std::ofstream js(s.json_path);
  js << "{\"file_mb\": " << f.file_mb << ", \"prompt\": " << s.prompt << ", \"decode\": " << s.decode
     << ", \"threads\": " << s.threads << ", \"kv_type\": \"" << s.kv_type << "\"" << ", \"prefill_tok_s\": " << s.prompt / f.best_prefill
     << ", \"decode_tok_s\": " << (s.decode > 0 ? s.decode / f.best_decode : 0.0)
     << ", \"prefill_runs\": [" << f.prefill_runs << "], \"decode_runs\": [" << f.decode_runs
     << "], \"rss_after_load_mb\": " << f.rss_load_mb << ", \"vmhwm_mb\": " << f.vmhwm_mb << ", \"kv_cache_mb\": " << kv_mb
     << ", \"weights_in_place_mb\": " << f.quant_bytes / 1048576.0
     << ", \"weights_float32_mb\": " << f.float_bytes / 1048576.0 << "}\n";
  DEPTHKV_CHECK_AS("main", js.good(), "cannot write " << s.json_path);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!parse_settings(argc, argv, s)) return 2;
  try {
    std::printf("gguf_engine_bench %s (%s weights), %d threads (0 = OpenMP default)\n", s.path.c_str(),
                s.dequantize ? "float32 twin" : "stored blocks in place", s.threads);
    print_rss("before load", 1.0);  // ratio meaningless here
    Figures f;
    const LlamaModel model = load_and_report(s, f);
    const LlamaEngine engine(model);
    const std::vector<int> ids = read_token_ids(s);
    const std::vector<int> prompt = prompt_ids(ids, s.prompt, model.config.vocab_size);
    for (int rep = 0; rep < s.repeat; ++rep)
      (s.kv_type == "f16" ? timed_run<Eigen::half> : timed_run<float>)(engine, s, ids, prompt, rep, f);
    std::printf("  peak RSS (VmHWM) %.1f MiB = %.3fx the file\n", status_mb("VmHWM"), status_mb("VmHWM") / f.file_mb);
    f.vmhwm_mb = status_mb("VmHWM");  // before the logits run (its [n x vocab] output is the check's, not the engine's)
    if (!s.logits_path.empty()) write_logits(engine, s, ids, prompt);
    if (!s.json_path.empty()) write_json(s, model.config, f);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "gguf_engine_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
