#pragma once
// Loading a model and its tokenizer for the subcommands: the file type is detected by its magic
// ("GGUF" = GGUF, anything else = a llama2.c checkpoint); the tokenizer comes from --tokenizer,
// else from the GGUF file, else tok512.bin beside a llama2.c model.

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "depthkv/error.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/tokenizer.hpp"

namespace depthkv_cli {

/// A loaded model with its tokenizer (null when none could be found and none was required).
struct LoadedModel {
  depthkv::llama::LlamaModel model;
  std::unique_ptr<depthkv::llama::Tokenizer> tokenizer;
  std::string tokenizer_source;  // where the tokenizer came from
};

/// True when the file starts with the GGUF magic.
inline bool is_gguf_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DEPTHKV_CHECK(f.good(), "cannot open model file '" << path << "'");
  char magic[4] = {0, 0, 0, 0};
  f.read(magic, 4);
  return f.gcount() == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' && magic[3] == 'F';
}

/// Folder part of a path ("." when none).
inline std::string dir_of(const std::string& path) {
  const std::size_t s = path.find_last_of('/');
  return s == std::string::npos ? std::string(".") : path.substr(0, s);
}

/// Loads `model_path` and a tokenizer (`tokenizer_path` when non-empty).
/// @param need_tokenizer throw when no tokenizer can be found
inline LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, bool need_tokenizer) {
  LoadedModel out;
  if (is_gguf_file(model_path)) {
    DEPTHKV_FAIL("'" << model_path << "' is a GGUF file; GGUF loading is not available in this build yet");
  }
  out.model = depthkv::llama::load_llama2c(model_path);
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    const std::string beside = dir_of(model_path) + "/tok512.bin";
    if (std::ifstream(beside).good()) tok = beside;
  }
  if (!tok.empty()) {
    out.tokenizer = std::make_unique<depthkv::llama::Tokenizer>(tok, out.model.config.vocab_size);
    out.tokenizer_source = tok;
  }
  DEPTHKV_CHECK(out.tokenizer || !need_tokenizer,
                "no tokenizer for '" << model_path << "': pass --tokenizer FILE (tok512.bin is looked for beside the model)");
  return out;
}

}  // namespace depthkv_cli
