#pragma once
/// @file llama/open_model.hpp
/// @brief Opening a model file of either format with its tokenizer: `open_model(path)`.
///
/// The format is sniffed from the file: the magic "GGUF" is a GGUF file (`load_gguf`); anything
/// else must be a llama2.c v0 checkpoint whose header is valid and implies the file's exact size
/// (`load_llama2c`), or it is refused as an unknown format. The tokenizer is, in this order:
/// the llama2.c tokenizer file `OpenModelOptions::tokenizer_path` when given; else the GGUF
/// file's own vocabulary (kind `llama`: SentencePiece `Tokenizer`; kind `gpt2`: byte-level
/// `BpeTokenizer`); else, for a llama2.c model, `tok512.bin` in the model's folder when it can
/// be opened. A llama2.c tokenizer file is checked against the model's vocabulary size.
///
/// @code
/// depthkv::llama::OpenModelOptions opt;
/// opt.need_tokenizer = true;
/// depthkv::llama::OpenedModel m = depthkv::llama::open_model("stories260K.bin", opt);
/// // m.format == ModelFormat::kLlama2c, m.tokenizer_source == ".../tok512.bin"
/// std::vector<int> ids = m.tokenizer->encode("Once upon a time", true, false);
/// depthkv::llama::LlamaEngine engine(m.model);
/// @endcode

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/detail/mapped_file.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/model.hpp"
#include "depthkv/llama/text_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "depthkv/profile_io.hpp"

namespace depthkv {
namespace llama {

/// The file formats `open_model` reads.
enum class ModelFormat {
  kGguf,     ///< GGUF v2/v3 (gguf.hpp)
  kLlama2c,  ///< llama2.c v0 checkpoint (llama2c_loader.hpp)
};

/// @param f a model format
/// @return its name: "gguf" or "llama2.c"
inline const char* to_string(ModelFormat f) { return f == ModelFormat::kGguf ? "gguf" : "llama2.c"; }

/// Options of `open_model`.
struct OpenModelOptions {
  /// A llama2.c tokenizer file (e.g. tok512.bin); empty: the GGUF file's own vocabulary, or
  /// `tok512.bin` beside a llama2.c model.
  std::string tokenizer_path;
  /// true: throw when no tokenizer can be built; false: `OpenedModel::tokenizer` may be null.
  bool need_tokenizer = false;
  /// Options of `load_gguf` (ignored for llama2.c checkpoints).
  GgufLoadOptions gguf;
};

/// A model opened by `open_model`, with its tokenizer.
struct OpenedModel {
  LlamaModel model;                          ///< the weights and hyper-parameters
  std::unique_ptr<TextTokenizer> tokenizer;  ///< null when none was found and none was needed
  std::string tokenizer_source;              ///< file the tokenizer came from (empty when none)
  /// Why the GGUF file's vocabulary gave no tokenizer (e.g. a vocabulary of another kind); empty
  /// when a tokenizer was built or the vocabulary was not looked at.
  std::string tokenizer_error;
  ModelFormat format = ModelFormat::kGguf;   ///< the file's format
};

/// Checks that `path` can be a model file: it exists, can be opened, and is not a directory.
/// @param path a model file
/// @throws Error "'path' is a directory, not a model file" or "cannot open model file 'path'"
inline void check_model_file(const std::string& path) {
  std::error_code ec;
  DEPTHKV_CHECK(!std::filesystem::is_directory(path, ec), "'" << path << "' is a directory, not a model file");
  DEPTHKV_CHECK(std::ifstream(path, std::ios::binary).good(), "cannot open model file '" << path << "'");
}

/// Sniffs the format of a model file (see the file comment).
/// @param path a model file
/// @return its format
/// @throws Error as `check_model_file`, or naming the path when the file is neither GGUF nor a
///   valid llama2.c checkpoint (with what the llama2.c header check found)
inline ModelFormat detect_model_format(const std::string& path) {
  check_model_file(path);
  if (is_gguf_file(path)) return ModelFormat::kGguf;
  std::string why;
  try {
    const detail::MappedFile file(path);
    read_llama2c_header(file.data(), file.size(), path);
    return ModelFormat::kLlama2c;
  } catch (const Error& e) {
    why = e.message();
  }
  DEPTHKV_FAIL("'" << path << "' is not a model file of a known format: it has no GGUF magic and is not a "
                   << "llama2.c v0 checkpoint (" << why << ")");
}

/// @param model_path a model file
/// @return `tok512.bin` in its folder ("./tok512.bin" when the path has no folder)
inline std::string tokenizer_beside(const std::string& model_path) {
  const std::size_t s = model_path.find_last_of('/');
  return (s == std::string::npos ? std::string(".") : model_path.substr(0, s)) + "/tok512.bin";
}

/// The tokenizer of a GGUF vocabulary: byte-level BPE for kind `gpt2`, SentencePiece otherwise.
/// @param v a vocabulary (`read_vocabulary`)
/// @return the tokenizer
/// @throws Error from the tokenizers (e.g. another kind, an unknown pre-tokenizer)
inline std::unique_ptr<TextTokenizer> make_tokenizer(const Vocabulary& v) {
  if (v.model == "gpt2") return std::make_unique<BpeTokenizer>(v);
  return std::make_unique<Tokenizer>(v);
}

namespace detail {

// Loads a GGUF model and, when no tokenizer file is given, the tokenizer of its vocabulary
// (an unusable vocabulary is recorded in `tokenizer_error`, not thrown).
inline void open_gguf_model(const std::string& path, const OpenModelOptions& opt, OpenedModel& out) {
  const GgufFile f = GgufFile::open(path);
  out.model = load_gguf(f, opt.gguf);
  if (!opt.tokenizer_path.empty()) return;
  try {
    out.tokenizer = make_tokenizer(read_vocabulary(f));
    out.tokenizer_source = path;
  } catch (const Error& e) {
    out.tokenizer_error = e.what();
  }
}

}  // namespace detail

/// Opens a model file of either format with its tokenizer (see the file comment).
/// @param path a GGUF file or a llama2.c checkpoint
/// @param opt tokenizer file, whether a tokenizer is needed, GGUF load options
/// @return the model, its tokenizer (or null), and the format
/// @throws Error naming the path when it is missing, a directory or of an unknown format; from
///   the loaders and the tokenizers; and when `opt.need_tokenizer` is set and no tokenizer can be
///   built
inline OpenedModel open_model(const std::string& path, const OpenModelOptions& opt = {}) {
  OpenedModel out;
  out.format = detect_model_format(path);
  if (out.format == ModelFormat::kGguf) {
    detail::open_gguf_model(path, opt, out);
  } else {
    out.model = load_llama2c(path);
  }
  std::string tok = opt.tokenizer_path;
  if (tok.empty() && out.format == ModelFormat::kLlama2c && std::ifstream(tokenizer_beside(path)).good()) {
    tok = tokenizer_beside(path);
  }
  if (!tok.empty()) {
    out.tokenizer = std::make_unique<Tokenizer>(tok, out.model.config.vocab_size);
    out.tokenizer_source = tok;
  }
  DEPTHKV_CHECK(out.tokenizer || !opt.need_tokenizer,
                "no tokenizer for '" << path << "'"
                                     << (out.tokenizer_error.empty()
                                             ? std::string(": give a tokenizer file (tok512.bin is looked for beside a "
                                                           "llama2.c model)")
                                             : " (" + out.tokenizer_error + ")"));
  return out;
}

/// Refuses a profile of another model than `c`, opened from `model_path`: the profile's layers,
/// its head curves' KV heads and its sliding windows (when it records them) must be the model's,
/// and a profile of a model file (`depthkv profile`: header hash "fnv1a64:...") must record this
/// file's size and header hash (`check_model`). A profile measured elsewhere (Hugging Face,
/// `depthkv.hf.profile`) is checked on the structure alone.
/// @throws Error naming what differs
inline void check_profile_matches(const ProfileFile& f, const LlamaConfig& c, const std::string& model_path) {
  const std::string of = " (profile of " + f.model.file_name + ")";
  DEPTHKV_CHECK(f.n_layers == c.n_layers,
                "the profile is of another model: it has " << f.n_layers << " layers, the model " << c.n_layers << of);
  for (const auto& kv : f.head_curves)
    DEPTHKV_CHECK(kv.second.n_kv_heads == c.n_kv_heads, "the profile is of another model: its "
                                                            << kv.first << " head curves are for " << kv.second.n_kv_heads
                                                            << " KV heads, the model has " << c.n_kv_heads << of);
  if (!f.layer_window.empty()) {
    DEPTHKV_CHECK(f.layer_window == c.windows(), "the profile is of another model: its layers' sliding windows differ from the "
                                       "model's" << of);
  }
  if (f.model.header_hash.rfind("fnv1a64:", 0) == 0) check_model(f, model_identity(model_path, f.model.header_bytes));
}

}  // namespace llama
}  // namespace depthkv
