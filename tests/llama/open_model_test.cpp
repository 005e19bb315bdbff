#include "depthkv/llama/open_model.hpp"

#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/llama2c_loader.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "llama/file_util.hpp"
#include "llama/gguf_writer.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv::llama::ModelFormat;
using depthkv::llama::open_model;
using depthkv::llama::OpenedModel;
using depthkv::llama::OpenModelOptions;

namespace {

std::string om_stories(const std::string& file) { return depthkv_test::data_path("models/stories260K/" + file); }

template <class F>
std::string om_error_of(F&& f) {
  try {
    f();
  } catch (const depthkv::Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A GGUF copy of `f` without its `tokenizer.*` metadata (a model with no vocabulary).
depthkv_test::Bytes om_without_vocabulary(const depthkv::llama::GgufFile& f) {
  depthkv_test::GgufWriter w;
  w.version = f.version();
  w.alignment = f.alignment();
  for (const auto& kv : f.metadata()) {
    if (kv.first.rfind("tokenizer.", 0) == 0) continue;
    depthkv_test::Bytes v;
    depthkv_test::put_value(v, kv.second);
    w.raw_kv(kv.first, static_cast<std::uint32_t>(kv.second.type), v);
  }
  for (const auto& t : f.tensors()) {
    const std::uint8_t* p = f.tensor_data(t);
    w.tensor(t.name, t.dims, t.type, depthkv_test::Bytes(p, p + t.n_bytes));
  }
  return w.build();
}

void om_same_weights(const depthkv::llama::LlamaModel& a, const depthkv::llama::LlamaModel& b) {
  CHECK(a.config.dim == b.config.dim);
  CHECK(a.config.n_layers == b.config.n_layers);
  CHECK(a.config.vocab_size == b.config.vocab_size);
  CHECK(a.config.architecture == b.config.architecture);
  CHECK(a.token_embedding == b.token_embedding);
  CHECK(a.classifier == b.classifier);
  CHECK(a.final_norm == b.final_norm);
  REQUIRE(a.layers.size() == b.layers.size());
  for (std::size_t l = 0; l < a.layers.size(); ++l) {
    CHECK(a.layers[l].wq == b.layers[l].wq);
    CHECK(a.layers[l].w2 == b.layers[l].w2);
  }
  CHECK(a.file_size == b.file_size);
  CHECK(a.header_hash == b.header_hash);
}

}  // namespace

TEST_CASE("open_model: a llama2.c checkpoint with tok512.bin beside it", "[llama][open_model][real]") {
  const std::string bin = om_stories("stories260K.bin");
  CHECK(depthkv::llama::detect_model_format(bin) == ModelFormat::kLlama2c);
  OpenModelOptions opt;
  opt.need_tokenizer = true;
  const OpenedModel m = open_model(bin, opt);
  CHECK(m.format == ModelFormat::kLlama2c);
  CHECK(std::string(depthkv::llama::to_string(m.format)) == "llama2.c");
  om_same_weights(m.model, depthkv::llama::load_llama2c(bin));
  REQUIRE(m.tokenizer != nullptr);
  CHECK(m.tokenizer_source == depthkv::llama::tokenizer_beside(bin));
  CHECK(m.tokenizer_source.size() > 10);
  CHECK(m.tokenizer_source.substr(m.tokenizer_source.size() - 11) == "/tok512.bin");
  CHECK(m.tokenizer_error.empty());
  CHECK(m.tokenizer->encode("Once upon a time", false, false) == std::vector<int>{403, 407, 261, 378});

  // The same checkpoint alone in a folder: no tokenizer, an error only when one is needed.
  const depthkv_test::TempDir dir;
  const std::string alone = dir.write("model.bin", depthkv_test::read_bytes(bin));
  const OpenedModel bare = open_model(alone);
  CHECK(bare.tokenizer == nullptr);
  CHECK(bare.tokenizer_source.empty());
  const std::string e = om_error_of([&] { open_model(alone, opt); });
  CHECK_THAT(e, Catch::Contains("no tokenizer for '" + alone + "'"));
  CHECK_THAT(e, Catch::Contains("tok512.bin"));
  // An explicit tokenizer file.
  opt.tokenizer_path = om_stories("tok512.bin");
  const OpenedModel given = open_model(alone, opt);
  REQUIRE(given.tokenizer != nullptr);
  CHECK(given.tokenizer_source == opt.tokenizer_path);
}

TEST_CASE("open_model: a GGUF file with its own vocabulary, without one, and with a tokenizer file",
          "[llama][open_model][gguf][real]") {
  const std::string gguf = om_stories("stories260K.gguf");
  const depthkv::llama::GgufFile f = depthkv::llama::GgufFile::open(gguf);
  const depthkv_test::TempDir dir;
  // A copy written by the test's GGUF writer: the model's own vocabulary is its tokenizer.
  const std::string with_vocab = dir.write("with_vocab.gguf", depthkv_test::copy_of(f).build());
  CHECK(depthkv::llama::detect_model_format(with_vocab) == ModelFormat::kGguf);
  OpenModelOptions need;
  need.need_tokenizer = true;
  const OpenedModel m = open_model(with_vocab, need);
  CHECK(m.format == ModelFormat::kGguf);
  CHECK(std::string(depthkv::llama::to_string(m.format)) == "gguf");
  REQUIRE(m.tokenizer != nullptr);
  CHECK(m.tokenizer_source == with_vocab);
  CHECK(m.tokenizer->encode("Once upon a time", false, false) == std::vector<int>{403, 407, 261, 378});
  om_same_weights(m.model, depthkv::llama::load_gguf(with_vocab));
  // tok512.bin beside a GGUF model is not used: the GGUF's vocabulary is.
  dir.write("tok512.bin", depthkv_test::read_bytes(om_stories("tok512.bin")));
  CHECK(open_model(with_vocab).tokenizer_source == with_vocab);

  // Without a vocabulary: no tokenizer, the reason kept; an error naming the path when needed.
  const std::string no_vocab = dir.write("no_vocab.gguf", om_without_vocabulary(f));
  const OpenedModel bare = open_model(no_vocab);
  CHECK(bare.tokenizer == nullptr);
  CHECK_THAT(bare.tokenizer_error, Catch::Contains("no tokenizer"));
  const std::string e = om_error_of([&] { open_model(no_vocab, need); });
  CHECK_THAT(e, Catch::Contains("no tokenizer for '" + no_vocab + "'"));
  CHECK_THAT(e, Catch::Contains("tokenizer.ggml.model is missing"));
  // A llama2.c tokenizer file given explicitly.
  need.tokenizer_path = om_stories("tok512.bin");
  const OpenedModel given = open_model(no_vocab, need);
  REQUIRE(given.tokenizer != nullptr);
  CHECK(given.tokenizer_source == need.tokenizer_path);
  CHECK(given.tokenizer_error.empty());
  // GGUF load options travel: dequantize gives float32 weights.
  OpenModelOptions deq;
  deq.gguf.dequantize = true;
  CHECK(open_model(with_vocab, deq).model.layers[0].wq_quant.empty());
}

TEST_CASE("open_model: missing files, directories and unknown formats are errors naming the path",
          "[llama][open_model][corrupt]") {
  const depthkv_test::TempDir dir;
  const std::string missing = dir.file("missing.bin");
  CHECK_THAT(om_error_of([&] { open_model(missing); }), Catch::Contains("cannot open model file '" + missing + "'"));
  const std::string folder = dir.path();
  CHECK_THAT(om_error_of([&] { open_model(folder); }),
             Catch::Contains("'" + folder + "' is a directory, not a model file"));

  const std::string text = "this is not a model, just some text long enough for a header";
  const std::string garbage = dir.write("garbage.bin", depthkv_test::Bytes(text.begin(), text.end()));
  std::string e = om_error_of([&] { open_model(garbage); });
  CHECK_THAT(e, Catch::Contains("'" + garbage + "' is not a model file of a known format"));
  CHECK_THAT(e, Catch::Contains("llama2.c header field"));
  CHECK_THROWS_AS(depthkv::llama::detect_model_format(garbage), depthkv::Error);

  const std::string empty = dir.write("empty.bin", {});
  CHECK_THAT(om_error_of([&] { open_model(empty); }), Catch::Contains("'" + empty + "' is not a model file of a known format"));

  // A llama2.c checkpoint cut short: unknown format, with the size the header implies.
  depthkv_test::Bytes cut = depthkv_test::read_bytes(om_stories("stories260K.bin"));
  cut.resize(1000);
  const std::string truncated = dir.write("truncated.bin", cut);
  e = om_error_of([&] { open_model(truncated); });
  CHECK_THAT(e, Catch::Contains("'" + truncated + "' is not a model file of a known format"));
  CHECK_THAT(e, Catch::Contains("size mismatch"));

  // A GGUF magic with a broken header is a GGUF file: the GGUF reader's error.
  const depthkv_test::Bytes bad_gguf = {'G', 'G', 'U', 'F', 9, 0, 0, 0};
  const std::string bad = dir.write("bad.gguf", bad_gguf);
  CHECK(depthkv::llama::detect_model_format(bad) == ModelFormat::kGguf);
  CHECK_THAT(om_error_of([&] { open_model(bad); }), Catch::Contains("unsupported GGUF version 9"));
}

TEST_CASE("check_profile_matches: layers, head curves' KV heads, sliding windows and the file's identity",
          "[llama][open_model][profile][real]") {
  const std::string bin = om_stories("stories260K.bin");
  const OpenedModel m = open_model(bin);
  const depthkv::llama::LlamaConfig& c = m.model.config;
  depthkv::ProfileFile f;
  f.n_layers = c.n_layers;
  f.model = depthkv::model_identity(bin);
  f.model.file_name = "renamed.bin";  // the name is not compared
  f.head_curves["h2o"].n_kv_heads = c.n_kv_heads;
  CHECK_NOTHROW(depthkv::llama::check_profile_matches(f, c, bin));
  f.layer_window.assign(static_cast<std::size_t>(c.n_layers), 0);  // every layer global, as the model
  CHECK_NOTHROW(depthkv::llama::check_profile_matches(f, c, bin));

  const auto err = [&](const depthkv::ProfileFile& p) {
    return om_error_of([&] { depthkv::llama::check_profile_matches(p, c, bin); });
  };
  depthkv::ProfileFile p = f;
  p.n_layers = c.n_layers + 1;
  CHECK_THAT(err(p), Catch::Contains("the profile is of another model: it has " + std::to_string(c.n_layers + 1) +
                                     " layers, the model " + std::to_string(c.n_layers) + " (profile of renamed.bin)"));
  p = f;
  p.head_curves["h2o"].n_kv_heads = c.n_kv_heads + 2;
  CHECK_THAT(err(p), Catch::Contains("its h2o head curves are for " + std::to_string(c.n_kv_heads + 2) + " KV heads"));
  p = f;
  p.layer_window[1] = 32;
  CHECK_THAT(err(p), Catch::Contains("sliding windows differ from the model's"));
  p = f;
  p.model.size += 1;  // a profile of another file of the same shape
  CHECK_THAT(err(p), Catch::Contains("the profile was measured on another model: profile 'renamed.bin'"));
  // a profile measured elsewhere (no fnv1a64 hash of a file) is checked on the structure alone
  p.model.header_hash = "hf:sha256:0123";
  CHECK_NOTHROW(depthkv::llama::check_profile_matches(p, c, bin));
}

TEST_CASE("token_span_starts: a word's pieces and a number's digits form one span", "[llama][open_model][span][real]") {
  OpenModelOptions opt;
  opt.need_tokenizer = true;
  const OpenedModel m = open_model(om_stories("stories260K.bin"), opt);
  const std::string text = "Her number was 7017563 and the key was 3846855 today.";
  const std::vector<int> ids = m.tokenizer->encode(text, /*bos=*/true, /*eos=*/false);
  const std::vector<std::int32_t> start = depthkv::llama::token_span_starts(*m.tokenizer, ids);
  REQUIRE(start.size() == ids.size());
  // the text of each span, from its tokens' pieces, without the spaces around it
  REQUIRE(ids[0] == m.tokenizer->bos_id());
  CHECK(start[0] == 0);
  std::vector<std::string> spans;
  for (std::size_t i = 1; i < ids.size(); ++i) {  // BOS (its own span) prints nothing
    const std::string piece = m.tokenizer->decode(ids[i - 1], ids[i]);
    REQUIRE(start[i] >= 1);
    REQUIRE(start[i] <= static_cast<std::int32_t>(i));
    if (start[i] == static_cast<std::int32_t>(i)) spans.emplace_back();
    spans.back() += piece;
  }
  std::vector<std::string> words;
  for (std::string s : spans) {
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(' ') + 1);
    if (!s.empty()) words.push_back(s);
  }
  CHECK(words == std::vector<std::string>{"Her", "number", "was", "7017563", "and", "the", "key", "was", "3846855",
                                          "today", "."});
  CHECK(ids.size() > words.size() + 4);  // the tokenizer split the numbers (and words) into several pieces
}
