// decode_loop: generation on a bounded KV cache with the library's driver (PrunedGeneration,
// llama/pruned_generation.hpp). Prefill a prompt in chunks, keep the KV cache within a fixed token
// budget after every chunk and every few decoded tokens, and decode greedily on the bounded cache.
// The real stories260K model runs on the reference engine.
//
// Usage: decode_loop [--max-kv-tokens T] [--chunk N] [--interval M] [--steps N] [--policy P]
//                    [--profile F] [--scorer S] [--data DIR]
// (DIR holds models/stories260K and text/; default: the DEPTHKV_DATA_DIR environment variable,
// else the folder configured at build time. --profile: a `depthkv profile` file, needed by the
// curve-based policies such as optimal.)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "depthkv/llama.hpp"
#include "depthkv/llama/pruned_generation.hpp"
#include "depthkv/preset.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif

using namespace depthkv;
using namespace depthkv::llama;

struct Options {
  int max_kv_tokens = 640, chunk = 64, interval = 16, steps = 128;
  std::string policy = "uniform", profile_file, scorer = "h2o", data;  // data: DEPTHKV_DATA_DIR, else the build's
};

/// Reads `--name value` pairs into `o`; prints what is wrong and returns false.
bool parse_options(int argc, char** argv, Options& o) {
  o.data = std::getenv("DEPTHKV_DATA_DIR") ? std::getenv("DEPTHKV_DATA_DIR") : DEPTHKV_DEFAULT_DATA_DIR;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--max-kv-tokens")) o.max_kv_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chunk")) o.chunk = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--interval")) o.interval = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) o.steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--policy")) o.policy = argv[i + 1];
    else if (!std::strcmp(argv[i], "--profile")) o.profile_file = argv[i + 1];
    else if (!std::strcmp(argv[i], "--scorer")) o.scorer = argv[i + 1];
    else if (!std::strcmp(argv[i], "--data")) o.data = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: decode_loop [--max-kv-tokens T] [--chunk N] [--interval M] [--steps N] "
                           "[--policy P] [--profile F] [--scorer S] [--data DIR]\n");
      return false;
    }
  }
  if (o.chunk >= 1 && o.steps >= 0) return true;
  std::fprintf(stderr, "decode_loop: --chunk must be >= 1 and --steps >= 0\n");
  return false;
}

// What to keep: at most `max_kv_tokens` KV tokens over all layers, evicted after every prefill
// chunk and every `interval` decoded tokens (a chunked schedule), 4 sink tokens and the 16 most
// recent tokens always kept, split across layers by `policy`.
PruneSpec what_to_keep(const Options& o) {
  PruneSpec spec;
  spec.scorer = scorer_config(o.scorer);
  spec.policy = parse_allocation_policy(o.policy);
  spec.budget = Budget::tokens(o.max_kv_tokens);
  spec.protection = Protection{4, 16};
  spec.schedule = {ScheduleMode::kChunked, o.chunk, o.interval};
  return spec;
}

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) return 2;
  try {
    const std::string model_file = o.data + "/models/stories260K/stories260K.bin";
    const LlamaModel model = load_llama2c(model_file);
    const LlamaConfig& c = model.config;  // 5 layers, 8 heads / 4 KV heads of 8, vocab 512, context 512
    const Tokenizer tok(o.data + "/models/stories260K/tok512.bin", c.vocab_size);
    const LlamaEngine engine(model);

    // The prompt: 384 tokens of stories (room for `steps` more in the model's 512-token context).
    const auto ids = encode_stories(tok, split_stories(read_text_file(o.data + "/text/tinystories_valid.txt")));
    const int n_prompt = std::min(384, c.seq_len - o.steps);
    const std::vector<int> prompt(ids.begin(), ids.begin() + n_prompt);

    const PruneSpec spec = what_to_keep(o);
    PolicyCurves curves;                      // what the policy reads from a profile (optimal: its curves)
    if (!o.profile_file.empty()) curves = policy_curves(load_profile(o.profile_file, model_file), o.scorer, spec.policy);
    ForwardOptions run;                       // how the engine runs: chunk size, threads
    run.chunk_size = o.chunk;

    // The driver: one per sequence. It owns the cache (per layer: K and V [n_kv_heads][slots][head_dim]
    // floats), the scorers and the schedule.
    PrunedGeneration<HostCache> gen(engine, engine.make_cache(), spec, curves, nullptr, run);

    // 1. Prefill in chunks; after each, the schedule evicts the layers down to their budgets.
    RowMatrix logits = gen.prefill(prompt);
    std::printf("prompt %d tokens in chunks of %d: %d evictions; layers hold", n_prompt, o.chunk, gen.report().evictions);
    for (int n : gen.cache().lengths()) std::printf(" %d", n);
    std::printf(" tokens (budget %d over %d layers)\n", o.max_kv_tokens, c.n_layers);

    // 2. Decode greedily; the cache never holds more than the budget plus one interval per layer.
    int prev = prompt.back();
    std::string text;
    for (int i = 0; i < o.steps; ++i) {
      const int token = last_argmax(logits);
      text += Tokenizer::safe_piece(tok.decode(prev, token));
      logits = gen.step(token);               // appends one token to every layer, evicts every `interval`
      prev = token;
    }
    const std::size_t full = sizeof(float) * 2 * c.n_layers * c.n_kv_heads * c.head_dim * (n_prompt + o.steps);
    std::printf("generated %d tokens: ...%s\n", o.steps, text.c_str());
    std::printf("KV memory: peak %zu bytes, now %zu, against %zu for the full cache (%d evictions in all)\n",
                gen.report().peak_bytes, gen.cache().bytes(), full, gen.report().evictions);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "decode_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
