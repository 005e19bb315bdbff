// A consumer of depthkv::llama: the byte-level BPE pre-tokenizers (PCRE2 comes with the target).
#include <depthkv/llama/pre_tokenizer.hpp>

#include <cstdio>
#include <vector>

int main() {
  const depthkv::llama::PreTokenizer pre("llama-bpe");
  std::vector<depthkv::llama::PreTokenizer::Span> pieces;
  pre.split("Hello world 12345", pieces);
  std::printf("consumer_llama: %zu pieces\n", pieces.size());
  return pieces.size() == 5 ? 0 : 1;
}
