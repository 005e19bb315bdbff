#pragma once
// Loading a model and its tokenizer for the subcommands: the file type is detected by its magic
// ("GGUF" = GGUF, anything else = a llama2.c checkpoint); the tokenizer comes from --tokenizer,
// else from the GGUF file's vocabulary (kind `llama`: SentencePiece; kind `gpt2`: byte-level
// BPE), else tok512.bin beside a llama2.c model.

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/text_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"

namespace depthkv_cli {

/// A loaded model with its tokenizer (null when none could be found and none was required).
struct LoadedModel {
  depthkv::llama::LlamaModel model;
  std::unique_ptr<depthkv::llama::TextTokenizer> tokenizer;
  std::string tokenizer_source;  ///< where the tokenizer came from
  bool gguf = false;             ///< the model file is GGUF
};

/// Folder part of a path ("." when none).
inline std::string dir_of(const std::string& path) {
  const std::size_t s = path.find_last_of('/');
  return s == std::string::npos ? std::string(".") : path.substr(0, s);
}

/// Refuses a `--model` path that cannot be a model file: missing or unreadable, or a directory
/// (before anything else is looked for beside it).
/// @throws depthkv::Error naming --model and the path
inline void check_model_path(const std::string& model_path) {
  std::error_code ec;
  DEPTHKV_CHECK(!std::filesystem::is_directory(model_path, ec),
                "--model: '" << model_path << "' is a directory, not a model file");
  DEPTHKV_CHECK(std::ifstream(model_path, std::ios::binary).good(), "cannot open model file '" << model_path << "'");
}

/// The tokenizer of a GGUF vocabulary: SentencePiece for kind `llama`, byte-level BPE for `gpt2`.
/// @throws depthkv::Error from the tokenizers (e.g. another kind, an unknown pre-tokenizer)
inline std::unique_ptr<depthkv::llama::TextTokenizer> make_tokenizer(const depthkv::llama::Vocabulary& v) {
  if (v.model == "gpt2") return std::make_unique<depthkv::llama::BpeTokenizer>(v);
  return std::make_unique<depthkv::llama::Tokenizer>(v);
}

/// Loads `model_path` and a tokenizer (`tokenizer_path` when non-empty).
/// @param need_tokenizer throw when no tokenizer can be built (e.g. a GGUF vocabulary of another kind)
/// @throws depthkv::Error from the loaders, or when a needed tokenizer is missing
inline LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, bool need_tokenizer) {
  check_model_path(model_path);
  LoadedModel out;
  std::string gguf_vocab_error;
  out.gguf = depthkv::llama::is_gguf_file(model_path);
  if (out.gguf) {
    const depthkv::llama::GgufFile f = depthkv::llama::GgufFile::open(model_path);
    out.model = depthkv::llama::load_gguf(f);
    if (tokenizer_path.empty()) {
      try {
        out.tokenizer = make_tokenizer(depthkv::llama::read_vocabulary(f));
        out.tokenizer_source = model_path;
      } catch (const depthkv::Error& e) {
        gguf_vocab_error = e.what();
      }
    }
  } else {
    out.model = depthkv::llama::load_llama2c(model_path);
  }
  std::string tok = tokenizer_path;
  if (tok.empty() && !out.gguf) {
    const std::string beside = dir_of(model_path) + "/tok512.bin";
    if (std::ifstream(beside).good()) tok = beside;
  }
  if (!tok.empty()) {
    out.tokenizer = std::make_unique<depthkv::llama::Tokenizer>(tok, out.model.config.vocab_size);
    out.tokenizer_source = tok;
  }
  DEPTHKV_CHECK(out.tokenizer || !need_tokenizer,
                "no tokenizer for '" << model_path << "'"
                                     << (gguf_vocab_error.empty() ? std::string(": pass --tokenizer FILE (tok512.bin is looked for beside a .bin model)")
                                                                  : " (" + gguf_vocab_error + ")"));
  return out;
}

}  // namespace depthkv_cli
