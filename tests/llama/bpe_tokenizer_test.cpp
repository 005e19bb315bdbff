// Byte-level BPE: llama.cpp's own tokenizer test set (../shared/vocab, every case byte-exact),
// exact round trips on random (also invalid) UTF-8, the pre-tokenizers, special tokens, and the
// errors of broken vocabularies.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/pre_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "llama/file_util.hpp"
#include "llama/gguf_writer.hpp"
#include "support/test_data.hpp"

using depthkv::Error;
using depthkv::llama::BpeTokenizer;
using depthkv::llama::PreTokenizer;
using depthkv::llama::TokenType;
using depthkv::llama::Vocabulary;

using depthkv_test::slurp;

namespace {

// llama.cpp's format: cases separated by "\n__ggml_vocab_test__\n" (the file ends with one);
// one line of expected ids per case.
struct VocabCases {
  std::vector<std::string> inputs;
  std::vector<std::vector<int>> expected;
};

VocabCases read_cases(const std::string& name) {
  VocabCases c;
  const std::string inp = slurp(depthkv_test::data_path("vocab/" + name + ".inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::size_t p = 0;
  while (p < inp.size()) {
    const std::size_t q = inp.find(sep, p);
    REQUIRE(q != std::string::npos);
    c.inputs.push_back(inp.substr(p, q - p));
    p = q + sep.size();
  }
  std::istringstream out(slurp(depthkv_test::data_path("vocab/" + name + ".out")));
  std::string line;
  while (std::getline(out, line)) {
    std::istringstream ls(line);
    std::vector<int> ids;
    int id = 0;
    while (ls >> id) ids.push_back(id);
    c.expected.push_back(ids);
  }
  REQUIRE(c.inputs.size() == c.expected.size());
  return c;
}

const BpeTokenizer& real_bpe(const std::string& name) {
  static std::vector<std::pair<std::string, std::unique_ptr<BpeTokenizer>>> cache;
  for (const auto& e : cache)
    if (e.first == name) return *e.second;
  const Vocabulary v = depthkv::llama::load_gguf_vocabulary(depthkv_test::data_path("vocab/" + name));
  cache.emplace_back(name, std::make_unique<BpeTokenizer>(v));
  return *cache.back().second;
}

std::string gpt2_char(int byte) {
  std::string s;
  depthkv::llama::detail::append_utf8(s, depthkv::llama::detail::gpt2_byte_to_codepoint()[static_cast<std::size_t>(byte)]);
  return s;
}

// A small byte-level vocabulary: the 256 byte characters, then `extra` tokens; merges as given.
Vocabulary tiny_vocab(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                      const std::string& pre = "gpt-2") {
  Vocabulary v;
  v.model = "gpt2";
  v.pre = pre;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_char(b));
  for (const auto& t : extra) v.tokens.push_back(t);
  v.merges = merges;
  v.has_merges = true;
  return v;
}

}  // namespace

TEST_CASE("bpe: llama.cpp's test vocabularies, every case byte-exact", "[llama][bpe][data]") {
  const std::string name = GENERATE(as<std::string>{}, "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
                                    "ggml-vocab-gpt-2.gguf");
  const BpeTokenizer& tok = real_bpe(name);
  const VocabCases c = read_cases(name);
  int pass = 0;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const std::vector<int> ids = tok.encode(c.inputs[i], /*bos=*/false, /*eos=*/false, /*parse_special=*/false);
    INFO(name << " case " << i << ": '" << c.inputs[i] << "'");
    CHECK(ids == c.expected[i]);
    CHECK(tok.decode(ids) == c.inputs[i]);
    if (ids == c.expected[i]) ++pass;
  }
  WARN(name << ": " << pass << " of " << c.inputs.size() << " cases byte-exact");
  CHECK(pass == static_cast<int>(c.inputs.size()));
}

TEST_CASE("bpe: the SentencePiece test vocabularies still go through Tokenizer, every case byte-exact",
          "[llama][bpe][data]") {
  const std::string name = GENERATE(as<std::string>{}, "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf");
  const Vocabulary v = depthkv::llama::load_gguf_vocabulary(depthkv_test::data_path("vocab/" + name));
  CHECK(v.model == "llama");
  CHECK_THROWS_AS(BpeTokenizer(v), Error);  // not byte-level BPE
  const depthkv::llama::Tokenizer tok(v);
  const VocabCases c = read_cases(name);
  int pass = 0;
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const std::vector<int> ids = tok.encode(c.inputs[i], /*bos=*/false, /*eos=*/false);
    INFO(name << " case " << i << ": '" << c.inputs[i] << "'");
    CHECK(ids == c.expected[i]);
    if (ids == c.expected[i]) ++pass;
  }
  WARN(name << ": " << pass << " of " << c.inputs.size() << " cases byte-exact");
}

TEST_CASE("bpe: llama-bpe file facts (BOS/EOS/EOT, add_bos, special tokens)", "[llama][bpe][data]") {
  const BpeTokenizer& tok = real_bpe("ggml-vocab-llama-bpe.gguf");
  CHECK(tok.pre_tokenizer().name() == "llama-bpe");
  CHECK(tok.bos_id() == 128000);
  CHECK(tok.piece(tok.bos_id()) == "<|begin_of_text|>");
  CHECK(tok.token_type(tok.bos_id()) == TokenType::kControl);
  CHECK(tok.eos_id() >= 0);
  CHECK(tok.eot_id() >= 0);
  CHECK(tok.ends_generation(tok.eos_id()));
  CHECK(tok.add_bos());
  CHECK(tok.encode("Hello world", tok.add_bos(), false) == std::vector<int>{128000, 9906, 1917});
  // parse_special: the text of a control token is that token only when asked for.
  const std::string text = "<|begin_of_text|>Hello";
  const std::vector<int> plain = tok.encode(text, false, false, false);
  const std::vector<int> special = tok.encode(text, false, false, true);
  CHECK(special == std::vector<int>{128000, 9906});
  CHECK(plain.size() > 2);
  CHECK(tok.decode(plain) == text);
  CHECK(tok.decode(special) == text);
  CHECK(tok.decode(special, /*special=*/false) == "Hello");
  const BpeTokenizer& gpt2 = real_bpe("ggml-vocab-gpt-2.gguf");
  CHECK_FALSE(gpt2.add_bos());  // gpt-2: no BOS unless the file says so
}

TEST_CASE("bpe: round trips on random UTF-8, including invalid sequences", "[llama][bpe][data]") {
  const std::string name = GENERATE(as<std::string>{}, "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf",
                                    "ggml-vocab-gpt-2.gguf");
  const BpeTokenizer& tok = real_bpe(name);
  std::mt19937 rng(13);
  auto random_text = [&](bool invalid) {
    std::string s;
    const int n = static_cast<int>(rng() % 64);
    for (int i = 0; i < n; ++i) {
      const unsigned kind = rng() % 10;
      std::uint32_t cp;
      if (kind < 4) {
        cp = 0x20 + rng() % 0x5F;  // ASCII
      } else if (kind == 4) {
        cp = rng() % 0x20;  // controls, newlines, NUL
      } else if (kind < 7) {
        cp = 0x80 + rng() % 0x780;  // 2-byte
      } else if (kind < 9) {
        cp = 0x800 + rng() % 0xF800;  // 3-byte
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x4E00;
      } else {
        cp = 0x10000 + rng() % 0x100000;  // 4-byte
      }
      depthkv::llama::detail::append_utf8(s, cp);
      if (invalid && rng() % 8 == 0) s.push_back(static_cast<char>(0x80 + rng() % 0x80));  // stray byte
      if (invalid && rng() % 16 == 0 && !s.empty()) s.pop_back();                          // cut character
    }
    return s;
  };
  for (int t = 0; t < 300; ++t) {
    const std::string s = random_text(t % 2 == 1);
    const std::vector<int> ids = tok.encode(s, false, false);
    for (int id : ids) REQUIRE((id >= 0 && id < tok.vocab_size()));
    INFO("text of " << s.size() << " bytes");
    REQUIRE(tok.decode(ids) == s);
    std::string streamed;
    for (int id : ids) streamed += tok.printable(tok.decode(-1, id));
    REQUIRE(streamed == s);
  }
}

TEST_CASE("bpe: invalid UTF-8 is kept byte for byte through byte tokens, never replaced by U+FFFD",
          "[llama][bpe][data]") {
  const BpeTokenizer& tok = real_bpe("ggml-vocab-llama-bpe.gguf");
  const auto byte_token = [&](unsigned char b) {
    std::string s;
    depthkv::llama::detail::append_utf8(s, depthkv::llama::detail::gpt2_byte_to_codepoint()[b]);
    return tok.lookup(s);
  };
  const std::string fffd = "\xEF\xBF\xBD";
  // a stray continuation byte, bytes never in UTF-8, overlong forms, a surrogate, beyond U+10FFFF,
  // a truncated character, a five-byte form
  for (const std::string bad : {"\x80", "\xFF", "\xFE\xFF", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80",
                                "\xF4\x90\x80\x80", "\xE2\x82", "\xF8\x88\x80\x80\x80"}) {
    INFO("bytes " << bad.size());
    const std::vector<int> ids = tok.encode(bad, false, false);
    REQUIRE(tok.decode(ids) == bad);
    CHECK(tok.decode(ids).find(fffd) == std::string::npos);
  }
  CHECK(tok.encode("\xFF", false, false) == std::vector<int>{byte_token(0xFF)});
  // an invalid byte is a piece of its own between the pieces around it (llama.cpp would encode
  // U+FFFD there instead)
  std::vector<int> expect = tok.encode("Hello", false, false);
  expect.push_back(byte_token(0xFF));
  for (int id : tok.encode("world", false, false)) expect.push_back(id);
  CHECK(tok.encode("Hello\xFFworld", false, false) == expect);
  CHECK(tok.decode(expect) == "Hello\xFFworld");
}

TEST_CASE("bpe: merges by rank, leftmost on ties, ignore_merges, byte tokens", "[llama][bpe]") {
  // ab (rank 0), then bb... only "ab" and "aab" exist.
  Vocabulary v = tiny_vocab({"ab", "aab", "bb"}, {"a b", "a ab", "b b"});
  const BpeTokenizer t(v);
  CHECK(t.merge_count() == 3);
  const int ab = 256, aab = 257, bb = 258;
  CHECK(t.encode("ab", false, false) == std::vector<int>{ab});
  CHECK(t.encode("aab", false, false) == std::vector<int>{aab});
  CHECK(t.encode("abb", false, false) == std::vector<int>{ab, t.lookup("b")});  // rank 0 first
  CHECK(t.encode("bbb", false, false) == std::vector<int>{bb, t.lookup("b")});  // leftmost first
  CHECK(t.encode("", false, false).empty());
  // a space is GPT-2 character U+0120
  CHECK(t.encode(" ", false, false) == std::vector<int>{t.lookup("\xC4\xA0")});
  CHECK(t.decode(t.encode("a b\n\t\x01\xFF", false, false)) == "a b\n\t\x01\xFF");
  // ignore_merges (llama-bpe): a piece that is a whole token is taken without merging.
  Vocabulary w = tiny_vocab({"xyz"}, {}, "llama-bpe");
  CHECK(BpeTokenizer(w).encode("xyz", false, false) == std::vector<int>{256});
  w.pre = "gpt-2";
  CHECK(BpeTokenizer(w).encode("xyz", false, false).size() == 3);
  // a byte the vocabulary has no token for is dropped, as llama.cpp drops it (SmolLM2 lacks 0x04, 0xF5..0xFF, ...)
  Vocabulary n = tiny_vocab({}, {});
  n.tokens[0x41] = "not-A";
  const BpeTokenizer tn(n);
  CHECK(tn.encode("A", false, false).empty());
  CHECK(tn.encode("BAB", false, false).size() == 2);
  CHECK(tn.encode("B", false, false).size() == 1);
}

TEST_CASE("bpe: special tokens, BOS/EOS/EOT and add_bos", "[llama][bpe]") {
  Vocabulary v = tiny_vocab({"<|start|>", "<|user|>", "<|end|>", "<|start|>x"}, {});
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types[256] = 3;  // control
  v.token_types[257] = 4;  // user-defined: always matched
  v.token_types[258] = 3;
  v.token_types[259] = 3;  // longer, so it wins where it matches
  v.bos_id = 256;
  v.eos_id = 258;
  const BpeTokenizer t(v);
  CHECK_FALSE(t.add_bos());
  CHECK(t.eot_id() == 258);  // found by its text
  CHECK(t.encode("<|user|>", false, false) == std::vector<int>{257});
  CHECK(t.encode("<|start|>", false, false).size() > 1);
  CHECK(t.encode("<|start|>", false, false, true) == std::vector<int>{256});
  CHECK(t.encode("<|start|>x<|start|>", false, false, true) == std::vector<int>{259, 256});
  CHECK(t.encode("a", true, true) == std::vector<int>{256, t.lookup("a"), 258});
  CHECK(t.ends_generation(258));
  CHECK_FALSE(t.ends_generation(256));
  v.add_bos_set = true;
  v.add_bos = true;
  v.add_eos = true;
  const BpeTokenizer u(v);
  CHECK(u.add_bos());
  CHECK(u.add_eos());
  v.bos_id = -1;
  CHECK_THROWS_AS(BpeTokenizer(v).encode("a", true, false), Error);
  v.bos_id = 999;
  CHECK_THROWS_AS(BpeTokenizer(v), Error);
}

TEST_CASE("bpe: every known pre-tokenizer compiles and splits", "[llama][bpe][pre]") {
  const std::string text = "Hello World! 1234567 don't \xE4\xBD\xA0\xE5\xA5\xBD  \n\n\tx \xFF\xC3";
  for (const std::string& name : PreTokenizer::names()) {
    const PreTokenizer p(name);
    std::vector<PreTokenizer::Span> s;
    p.split(text, s);
    std::size_t at = 0;
    for (const auto& span : s) {  // the pieces tile the text
      CHECK(span.offset == at);
      CHECK(span.length > 0);
      at += span.length;
    }
    CHECK(at == text.size());
  }
  const PreTokenizer llama("llama-bpe");
  std::vector<PreTokenizer::Span> s;
  llama.split(std::string("Hello world 12345"), s);
  std::vector<std::string> pieces;
  const std::string t = "Hello world 12345";
  for (const auto& span : s) pieces.push_back(t.substr(span.offset, span.length));
  CHECK(pieces == std::vector<std::string>{"Hello", " world", " ", "123", "45"});
  try {
    PreTokenizer bad("no-such-pre");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("no-such-pre") != std::string::npos);
  }
}

TEST_CASE("bpe: broken vocabularies are clear errors", "[llama][bpe][corrupt]") {
  auto message = [](const Vocabulary& v) {
    try {
      BpeTokenizer t(v);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Vocabulary v = tiny_vocab({"ab"}, {"a b"});
  v.pre = "no-such-pre";
  CHECK(message(v).find("'no-such-pre'") != std::string::npos);
  v.pre = "";
  CHECK(message(v).find("tokenizer.ggml.pre") != std::string::npos);
  v.pre = "gpt-2";
  v.has_merges = false;
  v.merges.clear();
  CHECK(message(v).find("tokenizer.ggml.merges") != std::string::npos);
  v = tiny_vocab({"ab"}, {"a q"});
  v.tokens[0x71] = "not-q";
  CHECK(message(v).find("'q', which is not a token") != std::string::npos);
  CHECK(message(v).rfind("depthkv: BpeTokenizer: BPE merge 0 'a q' names 'q'", 0) ==
        0);  // the constructor's name
  v = tiny_vocab({}, {"a b"});
  CHECK(message(v).find("'ab', which is not a token") != std::string::npos);
  v = tiny_vocab({}, {"ab"});
  CHECK(message(v).find("not two strings") != std::string::npos);
  v = tiny_vocab({}, {});
  v.token_types.assign(10, 1);
  CHECK(message(v).find("truncated") != std::string::npos);
  v = tiny_vocab({}, {});
  v.model = "llama";
  CHECK(message(v).find("'llama'") != std::string::npos);

  // A GGUF file cut inside its vocabulary: the reader says so.
  depthkv_test::GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_str("tokenizer.ggml.model", "gpt2");
  w.kv_str("tokenizer.ggml.pre", "gpt-2");
  const Vocabulary tv = tiny_vocab({"ab"}, {"a b"});
  w.kv_str_array("tokenizer.ggml.tokens", tv.tokens);
  w.kv_str_array("tokenizer.ggml.merges", tv.merges);
  const depthkv_test::Bytes whole = w.build();
  {
    const auto f = depthkv::llama::GgufFile::from_memory(whole.data(), whole.size());
    const BpeTokenizer t(depthkv::llama::read_vocabulary(f));
    CHECK(t.encode("ab", false, false) == std::vector<int>{256});
  }
  const depthkv_test::Bytes cut(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(whole.size() * 2 / 3));
  CHECK_THROWS_AS(depthkv::llama::GgufFile::from_memory(cut.data(), cut.size()), Error);
  // no merges key in the file
  depthkv_test::GgufWriter w2;
  w2.kv_str("tokenizer.ggml.model", "gpt2");
  w2.kv_str("tokenizer.ggml.pre", "gpt-2");
  w2.kv_str_array("tokenizer.ggml.tokens", tv.tokens);
  const depthkv_test::Bytes nm = w2.build();
  const auto f2 = depthkv::llama::GgufFile::from_memory(nm.data(), nm.size());
  CHECK(message(depthkv::llama::read_vocabulary(f2)).find("tokenizer.ggml.merges") != std::string::npos);
}
