#pragma once
// Binding of the model flags (--model, --tokenizer) to `depthkv::llama::open_model`
// (llama/open_model.hpp: format sniffing, tokenizer choice); only the messages that name a flag
// live here.

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "depthkv/error.hpp"
#include "depthkv/llama/open_model.hpp"

namespace depthkv_cli {

/// A loaded model with its tokenizer (null when none could be found and none was required).
using LoadedModel = depthkv::llama::OpenedModel;

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
  depthkv::llama::check_model_file(model_path);
}

/// The tokenizer of a GGUF vocabulary (`depthkv::llama::make_tokenizer`).
inline std::unique_ptr<depthkv::llama::TextTokenizer> make_tokenizer(const depthkv::llama::Vocabulary& v) {
  return depthkv::llama::make_tokenizer(v);
}

/// Loads `model_path` and a tokenizer (`tokenizer_path` when non-empty) with `open_model`.
/// @param need_tokenizer throw when no tokenizer can be built (e.g. a GGUF vocabulary of another kind)
/// @throws depthkv::Error from `open_model`, or when a needed tokenizer is missing (naming --tokenizer)
inline LoadedModel load_model(const std::string& model_path, const std::string& tokenizer_path, bool need_tokenizer) {
  check_model_path(model_path);
  depthkv::llama::OpenModelOptions opt;
  opt.tokenizer_path = tokenizer_path;
  LoadedModel out = depthkv::llama::open_model(model_path, opt);
  DEPTHKV_CHECK(out.tokenizer || !need_tokenizer,
                "no tokenizer for '" << model_path << "'"
                                     << (out.tokenizer_error.empty()
                                             ? std::string(": pass --tokenizer FILE (tok512.bin is looked for beside a .bin model)")
                                             : " (" + out.tokenizer_error + ")"));
  return out;
}

}  // namespace depthkv_cli
