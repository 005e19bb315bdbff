// tokenizer_bench: encode throughput of the text tokenizers (depthkv/llama/bpe_tokenizer.hpp,
// depthkv/llama/tokenizer.hpp) on a long English text, in MB/s of input text (best of --reps).
//
// Byte-level BPE with the llama-bpe, qwen2 and gpt-2 test vocabularies of llama.cpp
// (vocab/ggml-vocab-*.gguf), one encode call over the whole file; the SentencePiece path
// (stories260K's tok512.bin) for comparison, one encode call per story as the text windows
// encode (its run.c-style merge loop is meant for story-sized texts).
//
// Usage: tokenizer_bench [--text FILE] [--reps N] [--data DIR]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif
#include "bench_args.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Settings {
  std::string data = depthkv_bench::default_data_dir();  // $DEPTHKV_DATA_DIR, else the build's folder
  std::string text_path;                                  // default: DATA/text/tinystories_valid.txt
  int reps = 3;
};

/// Parses the options; prints the usage line and returns false on anything else.
bool parse_settings(int argc, char** argv, Settings& s) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--text" && has_value) {
      s.text_path = argv[++i];
    } else if (a == "--reps" && has_value) {
      s.reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--data" && has_value) {
      s.data = argv[++i];
    } else {
      std::fprintf(stderr, "usage: tokenizer_bench [--text FILE] [--reps N] [--data DIR]\n");
      return false;
    }
  }
  if (s.text_path.empty()) s.text_path = s.data + "/text/tinystories_valid.txt";
  return true;
}

/// Best seconds of `reps` calls of `encode`, which returns the number of tokens (left in `n_tokens`).
template <class Encode>
double best_encode_s(int reps, Encode&& encode, std::size_t& n_tokens) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    n_tokens = encode();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

/// Byte-level BPE with the test vocabulary `name`: one encode call over the whole text.
void bench_bpe(const char* name, const Settings& s, const std::string& text) {
  using depthkv::llama::BpeTokenizer;
  const std::string path = s.data + "/vocab/ggml-vocab-" + name + ".gguf";
  const auto t_load = std::chrono::steady_clock::now();
  const BpeTokenizer tok(depthkv::llama::load_gguf_vocabulary(path));
  const double load_s = seconds_since(t_load);
  std::size_t n_tokens = 0;
  const double best = best_encode_s(s.reps, [&] { return tok.encode(text, false, false).size(); }, n_tokens);
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("bpe %-10s: %8zu tokens, %.3f s, %6.2f MB/s (%.0f tokens/s); vocabulary loaded in %.2f s\n", name,
              n_tokens, best, mb / best, static_cast<double>(n_tokens) / best, load_s);
}

/// SentencePiece (stories260K's tok512.bin): one encode call per story.
void bench_sentencepiece(const Settings& s, const std::string& text) {
  using namespace depthkv::llama;
  const Tokenizer spm(s.data + "/models/stories260K/tok512.bin");
  const std::vector<std::string> stories = split_stories(text);
  std::size_t n_tokens = 0;
  const double best = best_encode_s(s.reps, [&] { return encode_stories(spm, stories).size(); }, n_tokens);
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf("sentencepiece tok512 (per story): %8zu tokens, %.3f s, %6.2f MB/s\n", n_tokens, best, mb / best);
}

}  // namespace

int main(int argc, char** argv) {
  Settings s;
  if (!parse_settings(argc, argv, s)) return 2;
  try {
    const std::string text = depthkv::llama::read_text_file(s.text_path);
    std::printf("text: %s (%.3f MB)\n", s.text_path.c_str(), static_cast<double>(text.size()) / 1e6);
    for (const char* name : {"llama-bpe", "qwen2", "gpt-2"}) bench_bpe(name, s, text);
    bench_sentencepiece(s, text);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
