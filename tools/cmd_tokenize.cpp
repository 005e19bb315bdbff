// depthkv tokenize: the token ids of a text as the model's vocabulary encodes it, to check a
// tokenization (and to script the checks against llama.cpp's test vocabularies). Only the
// vocabulary is read, so a vocabulary-only GGUF file (no tensors) works too. Several
// --text-file options give one line of ids per file, in order (the vocabulary is loaded once).

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/text_windows.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "model_io.hpp"

namespace depthkv_cli {
namespace {

struct TokenizeArgs {
  std::string model, tokenizer, prompt;
  std::vector<std::string> text_files;
  bool has_prompt = false, special = false, no_bos = false, json = false;
};

/// The vocabulary size of a model file: a llama2.c checkpoint's header (checked against the file
/// size, as `load_llama2c` does, without reading the weights), or a GGUF model's configuration.
/// @throws depthkv::Error on a file that is neither
int model_vocab_size(const std::string& model) {
  using namespace depthkv::llama;
  if (is_gguf_file(model)) return load_gguf(GgufFile::open(model)).config.vocab_size;
  std::ifstream in(model, std::ios::binary | std::ios::ate);
  DEPTHKV_CHECK(in.good(), "cannot open '" << model << "'");
  const auto size = static_cast<std::uint64_t>(in.tellg());
  std::int32_t f[7] = {};
  in.seekg(0);
  in.read(reinterpret_cast<char*>(f), static_cast<std::streamsize>(sizeof f));
  DEPTHKV_CHECK(in.gcount() == static_cast<std::streamsize>(sizeof f),
                model << ": llama2.c checkpoint truncated: " << size << " bytes, shorter than its header");
  Llama2cHeader h;
  h.dim = f[0];
  h.hidden_dim = f[1];
  h.n_layers = f[2];
  h.n_heads = f[3];
  h.n_kv_heads = f[4];
  h.vocab_size = f[5];
  h.seq_len = f[6];
  DEPTHKV_CHECK(depthkv::llama::detail::llama2c_expected_size(h, model) == size,
                model << ": llama2.c checkpoint size mismatch: the header implies "
                      << depthkv::llama::detail::llama2c_expected_size(h, model) << " bytes, the file has " << size);
  return h.vocab_size < 0 ? -h.vocab_size : h.vocab_size;
}

void run_tokenize(const TokenizeArgs& a) {
  using namespace depthkv::llama;
  DEPTHKV_CHECK(a.text_files.empty() != !a.has_prompt,
                "tokenize: give --prompt TEXT or --text-file FILE (one or more), not both and not neither");
  check_model_path(a.model);
  std::vector<std::string> texts;
  if (a.has_prompt) texts.push_back(a.prompt);
  for (const std::string& f : a.text_files) texts.push_back(read_text_file(f));
  // encode(text) with the vocabulary's own BOS/EOS rule (none with --no-bos)
  std::function<std::vector<int>(const std::string&)> encode;
  std::unique_ptr<BpeTokenizer> bpe;
  std::unique_ptr<Tokenizer> spm;
  if (is_gguf_file(a.model) && a.tokenizer.empty()) {
    const Vocabulary v = read_vocabulary(GgufFile::open(a.model));
    if (v.model == "gpt2") {
      bpe = std::make_unique<BpeTokenizer>(v);
      const BpeTokenizer& t = *bpe;
      encode = [&t, &a](const std::string& s) {
        return t.encode(s, !a.no_bos && t.add_bos(), !a.no_bos && t.add_eos(), a.special);
      };
    } else {
      DEPTHKV_CHECK(!a.special, "tokenize: --special needs a byte-level BPE vocabulary (kind 'gpt2'); this one is of kind '"
                                    << v.model << "'");
      spm = std::make_unique<Tokenizer>(v);
      const bool bos = !a.no_bos && v.add_bos;
      const Tokenizer& t = *spm;
      encode = [&t, bos](const std::string& s) { return t.encode(s, bos, false); };
    }
  } else {
    DEPTHKV_CHECK(!a.special, "tokenize: --special needs a byte-level BPE vocabulary in a GGUF file");
    std::string path = a.tokenizer;
    if (path.empty()) {
      path = dir_of(a.model) + "/tok512.bin";
      DEPTHKV_CHECK(std::ifstream(path).good(), "no tokenizer for '" << a.model
                                                    << "': pass --tokenizer FILE (tok512.bin is looked for beside a "
                                                       ".bin model, and '"
                                                    << path << "' cannot be opened)");
    }
    // checked against the model's vocabulary size, as generate does: a truncated tokenizer file
    // is refused instead of encoding with part of the vocabulary
    spm = std::make_unique<Tokenizer>(path, model_vocab_size(a.model));
    const bool bos = !a.no_bos;
    const Tokenizer& t = *spm;
    encode = [&t, bos](const std::string& s) { return t.encode(s, bos, false); };
  }
  for (const std::string& text : texts) {
    const std::vector<int> ids = encode(text);
    std::string out = a.json ? "[" : "";
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += a.json ? ", " : " ";
      out += std::to_string(ids[i]);
    }
    out += a.json ? "]\n" : "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* c = app.add_subcommand(
      "tokenize", "print the token ids of a text (exactly its bytes) as the model's vocabulary encodes it");
  c->add_option("-m,--model", args->model,
                "GGUF file with a vocabulary (a vocabulary-only file works), or a llama2.c model (.bin)")
      ->required();
  c->add_option("-z,--tokenizer", args->tokenizer, "llama2.c tokenizer file (default: tok512.bin beside a .bin model)");
  c->add_option("--text-file", args->text_files,
                "file whose bytes are tokenized (nothing stripped or added); repeat it for one line per file");
  c->add_option_function<std::string>(
      "-p,--prompt",
      [args](const std::string& s) {
        args->prompt = s;
        args->has_prompt = true;
      },
      "text to tokenize");
  c->add_flag("--special", args->special,
              "match control tokens written in the text (e.g. <|begin_of_text|>) as single tokens");
  c->add_flag("--no-bos", args->no_bos, "add no BOS/EOS, whatever the vocabulary asks for");
  c->add_flag("--json", args->json, "print a JSON array instead of space-separated ids");
  c->callback([args]() { run_tokenize(*args); });
}

}  // namespace depthkv_cli
