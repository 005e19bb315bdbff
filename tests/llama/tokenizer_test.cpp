#include "depthkv/llama/tokenizer.hpp"

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "llama/file_util.hpp"
#include "support/test_data.hpp"
#include "support/stories_data.hpp"

using depthkv::Error;
using depthkv::llama::Tokenizer;
using depthkv::llama::Vocabulary;
using depthkv_test::Bytes;

namespace {


// Reference: a literal transcription of the algorithm of llama2.c run.c `encode` (quadratic
// merge loop, first best pair wins), kept independent of the library's heap-based version.
std::vector<int> reference_encode(const Tokenizer& t, const std::string& text, bool bos, bool eos) {
  std::map<std::string, int> lookup;
  for (int i = t.vocab_size() - 1; i >= 0; --i) lookup[t.piece(i)] = i;
  auto find = [&](const std::string& s) {
    auto it = lookup.find(s);
    return it == lookup.end() ? -1 : it->second;
  };
  std::vector<int> tokens;
  if (bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(find(" "));
  std::string buf;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) buf.clear();
    buf += static_cast<char>(c);
    const unsigned char nx = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
    if ((nx & 0xC0) == 0x80 && buf.size() < 4) continue;
    const int id = find(buf);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (char b : buf) tokens.push_back(static_cast<unsigned char>(b) + 3);
    }
    buf.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int best_id = -1, best_idx = -1;
    for (int i = 0; i + 1 < static_cast<int>(tokens.size()); ++i) {
      const int id = find(t.piece(tokens[i]) + t.piece(tokens[i + 1]));
      if (id != -1 && t.score(id) > best_score) {
        best_score = t.score(id);
        best_id = id;
        best_idx = i;
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  if (eos) tokens.push_back(2);
  return tokens;
}

std::string decode_all(const Tokenizer& t, const std::vector<int>& ids) {
  std::string s;
  for (std::size_t i = 1; i < ids.size(); ++i) s += t.decode(ids[i - 1], ids[i]);
  return s;
}

std::vector<std::string> story_paragraphs(std::size_t max_count) {
  std::ifstream f(depthkv_test::data_path("text/tinystories_valid.txt"), std::ios::binary);
  std::vector<std::string> out;
  std::string line, cur;
  while (std::getline(f, line) && out.size() < max_count) {
    if (line.empty()) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += (cur.empty() ? "" : "\n") + line;
    }
  }
  return out;
}

Bytes tok_file(std::int32_t max_len, const std::vector<std::pair<float, std::string>>& toks) {
  Bytes b;
  depthkv_test::put(b, max_len);
  for (const auto& t : toks) {
    depthkv_test::put(b, t.first);
    depthkv_test::put(b, static_cast<std::int32_t>(t.second.size()));
    b.insert(b.end(), t.second.begin(), t.second.end());
  }
  return b;
}

}  // namespace

TEST_CASE("tokenizer: tok512 encodes the documented example", "[llama][tokenizer]") {
  const Tokenizer t = depthkv_test::stories_tok512();
  CHECK(t.vocab_size() == 512);
  CHECK(t.bos_id() == 1);
  CHECK(t.eos_id() == 2);
  CHECK(t.max_token_length() == 7);
  CHECK(t.encode("Once upon a time", false, false) == std::vector<int>{403, 407, 261, 378});
  CHECK(t.encode("Once upon a time", true, false) == std::vector<int>{1, 403, 407, 261, 378});
  CHECK(t.encode("Once upon a time", true, true) == std::vector<int>{1, 403, 407, 261, 378, 2});
  CHECK(t.encode("", false, false).empty());
  CHECK(t.encode("", true, true) == std::vector<int>{1, 2});
  // A C string: the text ends at its first NUL byte.
  CHECK(t.encode(std::string("Once upon a time\0 tail", 22), false, false) == std::vector<int>{403, 407, 261, 378});
  CHECK(t.piece(1) == "\n<s>\n");
  CHECK(t.piece(259) == " t");
  CHECK_THROWS_AS(t.piece(512), Error);
  CHECK_THROWS_AS(t.score(-1), Error);
}

TEST_CASE("tokenizer: decode follows llama2.c (space after BOS, raw bytes)", "[llama][tokenizer]") {
  const Tokenizer t = depthkv_test::stories_tok512();
  CHECK(decode_all(t, t.encode("Once upon a time", true, false)) == "Once upon a time");
  CHECK(t.decode(1, 403) == "Once");      // " Once" after BOS loses its space
  CHECK(t.decode(378, 403) == " Once");
  CHECK(t.decode(0, 3 + 0x0A) == "\n");   // <0x0A>
  CHECK(t.decode(0, 3 + 0x41) == "A");
  CHECK(t.decode(0, 3) == "");            // <0x00> prints nothing
  CHECK(t.decode(0, 3 + 0xE2) == std::string(1, '\xE2'));
  CHECK(t.decode(0, 1) == "\n<s>\n");
  CHECK_THROWS_AS(t.decode(0, 512), Error);
  CHECK_THROWS_AS(t.decode(0, -1), Error);
  CHECK(Tokenizer::safe_piece("") == "");
  CHECK(Tokenizer::safe_piece("\x01") == "");
  CHECK(Tokenizer::safe_piece("\xE2") == "");  // lone high byte: not printable in the C locale
  CHECK(Tokenizer::safe_piece("\n") == "\n");
  CHECK(Tokenizer::safe_piece("\t") == "\t");
  CHECK(Tokenizer::safe_piece("a") == "a");
  CHECK(Tokenizer::safe_piece("\x01\x02") == "\x01\x02");
  std::ostringstream os;
  Tokenizer::safe_print(os, "\x7f");
  Tokenizer::safe_print(os, " hi");
  CHECK(os.str() == " hi");
}

TEST_CASE("tokenizer: encode equals the quadratic run.c reference and round-trips", "[llama][tokenizer]") {
  const Tokenizer t = depthkv_test::stories_tok512();
  const auto paras = story_paragraphs(60);
  REQUIRE(paras.size() >= 50);
  for (const auto& p : paras) {
    const auto ids = t.encode(p, true, false);
    REQUIRE(ids == reference_encode(t, p, true, false));
    REQUIRE(decode_all(t, ids) == p);  // decoding is exact (byte fallback covers everything)
  }
  // Random byte strings (invalid UTF-8, control bytes, long continuation runs), fixed seed.
  std::mt19937 rng(12345);
  const std::string alphabet = "abcdefgh ,.!?\n\t'\"\xE2\x80\x9C\xC3\xA9\x80\xBF\xFF\xF0\x9F\x98\x80";
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int len = static_cast<int>(rng() % 80);
    for (int i = 0; i < len; ++i) {
      const unsigned char c = rng() % 4 == 0 ? static_cast<unsigned char>(1 + rng() % 255)
                                             : static_cast<unsigned char>(alphabet[rng() % alphabet.size()]);
      s += static_cast<char>(c);
    }
    const bool bos = trial % 2 == 0;
    const auto ids = t.encode(s, bos, trial % 3 == 0);
    REQUIRE(ids == reference_encode(t, s, bos, trial % 3 == 0));
    if (bos && trial % 3 != 0) {
      REQUIRE(decode_all(t, ids) == s);
    }
  }
}

TEST_CASE("tokenizer: the aidreams260K tokenizer loads and round-trips", "[llama][tokenizer]") {
  const Tokenizer t(depthkv_test::data_path("models/aidreams260K/tok512.bin"), 512);
  CHECK(t.vocab_size() == 512);
  CHECK(t.max_token_length() == 10);
  for (const auto& p : story_paragraphs(10)) {
    const auto ids = t.encode(p, true, false);
    CHECK(ids == reference_encode(t, p, true, false));
    CHECK(decode_all(t, ids) == p);
  }
}

TEST_CASE("tokenizer: corrupt llama2.c tokenizer files are rejected", "[llama][tokenizer][corrupt]") {
  const std::string path = depthkv_test::data_path("models/stories260K/tok512.bin");
  const Bytes full = depthkv_test::read_bytes(path);
  // Every cut point: either an error or, never, a silently shorter vocabulary of the wrong size.
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    INFO("cut at " << cut);
    REQUIRE_THROWS_AS(Tokenizer::from_memory(full.data(), cut, 512), Error);
  }
  // Reading "to the end" accepts cuts only at token boundaries, and then yields fewer tokens.
  std::size_t accepted = 0;
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    try {
      const Tokenizer t = Tokenizer::from_memory(full.data(), cut, -1);
      CHECK(t.vocab_size() < 512);
      ++accepted;
    } catch (const Error&) {
    }
  }
  CHECK(accepted == 512 - 3);  // boundaries after tokens 3..511
  Bytes extra = full;
  extra.push_back(7);
  CHECK_THROWS_AS(Tokenizer::from_memory(extra.data(), extra.size(), 512), Error);
  CHECK_THROWS_AS(Tokenizer::from_memory(full.data(), full.size(), 511), Error);
  CHECK_THROWS_AS(Tokenizer::from_memory(full.data(), full.size(), 513), Error);
  CHECK_THROWS_AS(Tokenizer::from_memory(full.data(), full.size(), 0), Error);

  const std::vector<std::pair<float, std::string>> ok = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}, {-1, " "}, {-2, "a"}};
  CHECK_NOTHROW(Tokenizer::from_memory(tok_file(7, ok).data(), tok_file(7, ok).size()));
  CHECK_THROWS_AS(Tokenizer::from_memory(tok_file(4, ok).data(), tok_file(4, ok).size()), Error);  // "\n</s>\n" > max
  CHECK_THROWS_AS(Tokenizer::from_memory(tok_file(0, ok).data(), tok_file(0, ok).size()), Error);
  CHECK_THROWS_AS(Tokenizer::from_memory(tok_file(-5, ok).data(), tok_file(-5, ok).size()), Error);
  auto nan_toks = ok;
  nan_toks[4].first = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_AS(Tokenizer::from_memory(tok_file(7, nan_toks).data(), tok_file(7, nan_toks).size()), Error);
  Bytes neg = tok_file(7, ok);
  depthkv_test::poke<std::int32_t>(neg, 4 + 4, -1);  // first token's length
  CHECK_THROWS_AS(Tokenizer::from_memory(neg.data(), neg.size()), Error);
  Bytes huge = tok_file(7, ok);
  depthkv_test::poke<std::int32_t>(huge, 4 + 4, std::numeric_limits<std::int32_t>::max());
  CHECK_THROWS_AS(Tokenizer::from_memory(huge.data(), huge.size()), Error);
  const std::vector<std::pair<float, std::string>> two = {{0, "<unk>"}, {0, "\n<s>\n"}};
  CHECK_THROWS_AS(Tokenizer::from_memory(tok_file(7, two).data(), tok_file(7, two).size()), Error);

  depthkv_test::TempDir dir;
  CHECK_THROWS_AS(Tokenizer(dir.write("cut.bin", Bytes(full.begin(), full.begin() + 1000)), 512), Error);
  CHECK_THROWS_AS(Tokenizer(dir.path() + "/missing.bin"), Error);
}

TEST_CASE("tokenizer: small vocabularies, byte fallback and missing pieces", "[llama][tokenizer]") {
  // No " " piece: the dummy prefix cannot be produced.
  const std::vector<std::pair<float, std::string>> nospace = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}, {0, "a"}};
  const Tokenizer a = Tokenizer::from_memory(tok_file(7, nospace).data(), tok_file(7, nospace).size());
  CHECK_THROWS_AS(a.encode("a", false, false), Error);
  CHECK(a.encode("", true, false) == std::vector<int>{1});
  // A byte whose fallback id (byte + 3) is past the vocabulary is an error, not a bad id.
  const std::vector<std::pair<float, std::string>> small = {{0, "<unk>"}, {0, "\n<s>\n"}, {0, "\n</s>\n"}, {0, " "}, {-1, "x"}};
  const Tokenizer s = Tokenizer::from_memory(tok_file(7, small).data(), tok_file(7, small).size());
  CHECK(s.encode("x", false, false) == std::vector<int>{3, 4});
  CHECK_THROWS_AS(s.encode("y", false, false), Error);
  // tok512: a character outside the vocabulary falls back to its UTF-8 bytes.
  const Tokenizer t = depthkv_test::stories_tok512();
  const auto ids = t.encode("\xE2\x82\xAC", false, false);  // U+20AC euro sign
  CHECK(ids == reference_encode(t, "\xE2\x82\xAC", false, false));
  CHECK(decode_all(t, ids) == "\xE2\x82\xAC");
}

TEST_CASE("tokenizer: GGUF vocabularies", "[llama][tokenizer]") {
  Vocabulary v;
  v.model = "gpt2";
  v.tokens = {"a", "b", "c"};
  try {
    Tokenizer t(v);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("gpt2") != std::string::npos);
    CHECK(msg.find("pre-tokenized") != std::string::npos);
  }
  v.model = "llama";
  CHECK_THROWS_AS(Tokenizer(v), Error);  // no scores
  v.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "\xE2\x96\x81" "a", "a", "<0x62>"};
  v.scores = {0, 0, 0, -1, -2, -3, 0};
  v.bos_id = 1;
  v.eos_id = 2;
  const Tokenizer t(v);
  CHECK(t.piece(1) == "\n<s>\n");
  CHECK(t.piece(2) == "\n</s>\n");
  CHECK(t.piece(3) == " ");
  CHECK(t.piece(4) == " a");
  CHECK(t.encode("a", true, true) == std::vector<int>{1, 4, 2});
  CHECK(t.encode("b", false, false) == std::vector<int>{3, 6});  // byte fallback through <0x62>
  CHECK_THROWS_AS(t.encode("c", false, false), Error);          // no <0x63> piece
  CHECK(t.decode(1, 4) == "a");
  CHECK(t.decode(3, 6) == "b");
  v.add_space_prefix = false;
  CHECK(Tokenizer(v).encode("a", false, false) == std::vector<int>{5});
  v.bos_id = 7;
  CHECK_THROWS_AS(Tokenizer(v), Error);
  v.bos_id = 1;
  v.scores[5] = std::numeric_limits<float>::infinity();
  CHECK_THROWS_AS(Tokenizer(v), Error);
}

TEST_CASE("tokenizer: token id files", "[llama][tokenizer]") {
  using depthkv::llama::parse_token_ids;
  using depthkv::llama::read_token_file;
  CHECK(parse_token_ids("1 403, 407,261\n378\n", 512) == std::vector<int>{1, 403, 407, 261, 378});
  CHECK(parse_token_ids("[1, 2, 3]", 4) == std::vector<int>{1, 2, 3});
  CHECK(parse_token_ids("", 4).empty());
  CHECK(parse_token_ids(" \n,, ", 4).empty());
  CHECK_THROWS_AS(parse_token_ids("1 512", 512), Error);
  CHECK_THROWS_AS(parse_token_ids("-1", 512), Error);
  CHECK_THROWS_AS(parse_token_ids("12a", 512), Error);
  CHECK_THROWS_AS(parse_token_ids("1.5", 512), Error);
  CHECK_THROWS_AS(parse_token_ids("-", 512), Error);
  CHECK_THROWS_AS(parse_token_ids("99999999999999999999999999", std::numeric_limits<int>::max()), Error);
  CHECK_THROWS_AS(parse_token_ids("1", 0), Error);
  depthkv_test::TempDir dir;
  const std::string s = "1 403 407 261 378";
  const std::string p = dir.write("ids.txt", Bytes(s.begin(), s.end()));
  CHECK(read_token_file(p, 512) == std::vector<int>{1, 403, 407, 261, 378});
  CHECK_THROWS_AS(read_token_file(p, 400), Error);
  CHECK_THROWS_AS(read_token_file(dir.path() + "/missing.txt", 512), Error);
}

TEST_CASE("tokenizer: a directory is not a token file, and the reader says so", "[llama][tokenizer]") {
  using depthkv::llama::read_token_file;
  depthkv_test::TempDir dir;
  CHECK_THROWS_WITH(read_token_file(dir.path(), 512),
                    Catch::Contains("'" + dir.path() + "' is a directory, not a token file"));
  CHECK_THROWS_WITH(read_token_file(dir.path() + "/missing.txt", 512),
                    Catch::Contains("cannot open token file '" + dir.path() + "/missing.txt': No such file"));
  // a pipe is read to its end (no size to trust)
  CHECK(read_token_file("/dev/null", 512).empty());
}
