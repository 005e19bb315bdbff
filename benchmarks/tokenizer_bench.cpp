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

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string data =
#ifdef DEPTHKV_DEFAULT_DATA_DIR
      DEPTHKV_DEFAULT_DATA_DIR;
#else
      "../shared";
#endif
  if (const char* env = std::getenv("DEPTHKV_DATA_DIR")) data = env;
  std::string text_path;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--text" && i + 1 < argc) {
      text_path = argv[++i];
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--data" && i + 1 < argc) {
      data = argv[++i];
    } else {
      std::fprintf(stderr, "usage: tokenizer_bench [--text FILE] [--reps N] [--data DIR]\n");
      return 2;
    }
  }
  if (text_path.empty()) text_path = data + "/text/tinystories_valid.txt";
  try {
    using namespace depthkv::llama;
    const std::string text = read_text_file(text_path);
    const double mb = static_cast<double>(text.size()) / 1e6;
    std::printf("text: %s (%.3f MB)\n", text_path.c_str(), mb);
    for (const char* name : {"llama-bpe", "qwen2", "gpt-2"}) {
      const std::string path = data + "/vocab/ggml-vocab-" + name + ".gguf";
      const auto t_load = std::chrono::steady_clock::now();
      const BpeTokenizer tok(load_gguf_vocabulary(path));
      const double load_s = seconds_since(t_load);
      double best = 1e30;
      std::size_t n_tokens = 0;
      for (int r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<int> ids = tok.encode(text, false, false);
        best = std::min(best, seconds_since(t0));
        n_tokens = ids.size();
      }
      std::printf("bpe %-10s: %8zu tokens, %.3f s, %6.2f MB/s (%.0f tokens/s); vocabulary loaded in %.2f s\n", name,
                  n_tokens, best, mb / best, static_cast<double>(n_tokens) / best, load_s);
    }
    const Tokenizer spm(data + "/models/stories260K/tok512.bin");
    const std::vector<std::string> stories = split_stories(text);
    double best = 1e30;
    std::size_t n_tokens = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      n_tokens = encode_stories(spm, stories).size();
      best = std::min(best, seconds_since(t0));
    }
    std::printf("sentencepiece tok512 (per story): %8zu tokens, %.3f s, %6.2f MB/s\n", n_tokens, best, mb / best);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
