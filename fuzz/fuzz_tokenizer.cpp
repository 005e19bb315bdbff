// libFuzzer target for the tokenizer: llama2.c tokenizer files, GGUF-style vocabularies,
// encode/decode (checked against a literal quadratic transcription of llama2.c's encode on
// short texts, and for exact round trips with tok512), and token-id files. Only
// depthkv::Error may come out.
//
// The first input byte picks the mode:
//   0: encode the rest with tok512 (DEPTHKV_FUZZ_TOKENIZER_FILE, env DEPTHKV_FUZZ_TOKENIZER
//      overrides; a small built-in vocabulary when the file is missing);
//   1: parse the rest as a llama2.c tokenizer file and use it;
//   2: build a Vocabulary from the rest (pieces separated by 0xFF, then after a 0xFE byte the
//      text) and encode the text with it;
//   3: parse the rest as a token-id list.
// A first byte of 0xF0 or more picks a byte-level BPE mode instead:
//   0xF0..0xF7: encode the rest with a real vocabulary, picked by bits 1-2 of the first byte:
//      llama-bpe (0xF0, 0xF1, 0xF6, 0xF7; DEPTHKV_FUZZ_BPE_FILE, env DEPTHKV_FUZZ_BPE
//      overrides), qwen2 (0xF2, 0xF3) or gpt-2 (0xF4, 0xF5), the last two from the same folder
//      (ggml-vocab-qwen2.gguf, ggml-vocab-gpt-2.gguf); a small built-in vocabulary when a file
//      is missing. Special-token parsing on odd bytes; the ids must decode back to exactly the
//      rest;
//   0xF8..0xFF: build a byte-level vocabulary from the rest: its first byte picks the
//      pre-tokenizer (PreTokenizer::names()[byte % count]), then extra tokens separated by 0xFF,
//      then after 0xFE the merges, then after 0xFD the text; and check the same round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"

using depthkv::llama::Tokenizer;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool g_base_from_file = false;  // tok512 (llama2.c byte fallback) or the built-in vocabulary

std::unique_ptr<Tokenizer> base_tokenizer() {
  const char* env = std::getenv("DEPTHKV_FUZZ_TOKENIZER");
  std::string path = env ? env : "";
#ifdef DEPTHKV_FUZZ_TOKENIZER_FILE
  if (path.empty()) path = DEPTHKV_FUZZ_TOKENIZER_FILE;
#endif
  if (!path.empty() && std::ifstream(path).good()) {
    g_base_from_file = true;
    return std::make_unique<Tokenizer>(path);
  }
  depthkv::llama::Vocabulary v;  // fallback: bytes, a space, a few merges
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) v.tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
  for (const char* p : {"\xE2\x96\x81", "\xE2\x96\x81t", "he", "\xE2\x96\x81the", "a", "t", "h", "e", "n", "an", "\xE2\x96\x81" "a"})
    v.tokens.push_back(p);
  for (std::size_t i = 0; i < v.tokens.size(); ++i) v.scores.push_back(i < 259 ? 0.0f : -static_cast<float>(i % 5));
  v.bos_id = 1;
  v.eos_id = 2;
  return std::make_unique<Tokenizer>(v);
}

// Literal transcription of llama2.c run.c encode (quadratic), with the same byte-fallback
// table as the tokenizer under test. Returns false where run.c would produce an invalid id
// (no " " piece, or a byte without a fallback token).
using PieceMap = std::map<std::string, int>;

PieceMap piece_map(const Tokenizer& t) {
  PieceMap lookup;
  for (int i = t.vocab_size() - 1; i >= 0; --i) {
    const std::string& p = t.piece(i);
    lookup[p.substr(0, p.find('\0'))] = i;  // the lowest id of duplicate pieces wins
  }
  return lookup;
}

bool reference_encode(const Tokenizer& t, const PieceMap& lookup, const std::string& text_in, bool bos, bool eos,
                      bool prefix, bool llama2c_bytes, std::vector<int>& tokens) {
  const std::string text = text_in.substr(0, text_in.find('\0'));
  auto find = [&](const std::string& s) {
    auto it = lookup.find(s);
    return it == lookup.end() ? -1 : it->second;
  };
  auto cpiece = [&](int id) { return t.piece(id).substr(0, t.piece(id).find('\0')); };
  auto byte_id = [&](unsigned char b) {
    if (llama2c_bytes) return b + 3 < t.vocab_size() ? b + 3 : -1;
    const char* hex = "0123456789ABCDEF";
    return find(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
  };
  tokens.clear();
  if (bos) tokens.push_back(t.bos_id());
  if (!text.empty() && prefix) {
    const int sp = find(" ");
    if (sp < 0) return false;
    tokens.push_back(sp);
  }
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
      for (char b : buf) {
        const int bid = byte_id(static_cast<unsigned char>(b));
        if (bid < 0) return false;
        tokens.push_back(bid);
      }
    }
    buf.clear();
  }
  while (true) {
    float best = -1e10f;
    int best_id = -1, best_idx = -1;
    for (int i = 0; i + 1 < static_cast<int>(tokens.size()); ++i) {
      const int id = find(cpiece(tokens[i]) + cpiece(tokens[i + 1]));
      if (id != -1 && t.score(id) > best) {
        best = t.score(id);
        best_id = id;
        best_idx = i;
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  if (eos) tokens.push_back(t.eos_id());
  return true;
}

void exercise(const Tokenizer& t, const std::string& text, bool prefix, bool llama2c_bytes, bool differential,
              const PieceMap* pieces = nullptr) {
  PieceMap local;
  if (differential && pieces == nullptr) {
    local = piece_map(t);
    pieces = &local;
  }
  for (int flags = 0; flags < 4; ++flags) {
    const bool bos = flags & 1, eos = flags & 2;
    std::vector<int> ids;
    bool ok = true;
    try {
      ids = t.encode(text, bos, eos);
    } catch (const depthkv::Error&) {
      ok = false;
    }
    for (int id : ids) check(id >= 0 && id < t.vocab_size());
    if (differential) {
      std::vector<int> ref;
      const bool ref_ok = reference_encode(t, *pieces, text, bos, eos, prefix, llama2c_bytes, ref);
      check(ok == ref_ok);
      if (ok) check(ids == ref);
    }
    std::string out;
    for (std::size_t i = 1; i < ids.size(); ++i) out += Tokenizer::safe_piece(t.decode(ids[i - 1], ids[i]));
    (void)out;
  }
}

std::string gpt2_char(int b) {
  std::string s;
  depthkv::llama::detail::append_utf8(s, depthkv::llama::detail::gpt2_byte_to_codepoint()[static_cast<std::size_t>(b)]);
  return s;
}

depthkv::llama::Vocabulary bpe_byte_vocab(const std::string& pre) {
  depthkv::llama::Vocabulary v;
  v.model = "gpt2";
  v.pre = pre;
  v.has_merges = true;
  for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_char(b));
  return v;
}

/// @param file "" for the llama-bpe file, else a file name beside it
std::unique_ptr<depthkv::llama::BpeTokenizer> base_bpe(const std::string& file) {
  const char* env = std::getenv("DEPTHKV_FUZZ_BPE");
  std::string path = env ? env : "";
#ifdef DEPTHKV_FUZZ_BPE_FILE
  if (path.empty()) path = DEPTHKV_FUZZ_BPE_FILE;
#endif
  if (!file.empty() && !path.empty()) {
    const std::size_t slash = path.find_last_of('/');
    path = (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) + file;
  }
  if (!path.empty() && std::ifstream(path).good())
    return std::make_unique<depthkv::llama::BpeTokenizer>(depthkv::llama::load_gguf_vocabulary(path));
  depthkv::llama::Vocabulary v = bpe_byte_vocab("llama-bpe");
  for (const char* t : {"he", "hel", "hell", "hello", "\xC4\xA0t", "<|bos|>"}) v.tokens.push_back(t);
  v.merges = {"h e", "he l", "hel l", "hell o", "\xC4\xA0 t"};
  v.token_types.assign(v.tokens.size(), 1);
  v.token_types.back() = 3;
  v.bos_id = static_cast<int>(v.tokens.size()) - 1;
  return std::make_unique<depthkv::llama::BpeTokenizer>(v);
}

void bpe_round_trip(const depthkv::llama::BpeTokenizer& t, const std::string& text, bool special) {
  const std::vector<int> ids = t.encode(text, false, false, special);
  for (int id : ids) check(id >= 0 && id < t.vocab_size());
  check(t.decode(ids) == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const std::unique_ptr<Tokenizer> base = base_tokenizer();
  const int mode = data[0] % 4;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    if (data[0] >= 0xF0 && data[0] < 0xF8) {
      static const std::unique_ptr<depthkv::llama::BpeTokenizer> bpe[3] = {
          base_bpe(""), base_bpe("ggml-vocab-qwen2.gguf"), base_bpe("ggml-vocab-gpt-2.gguf")};
      const int which = (data[0] >> 1) & 3;
      bpe_round_trip(*bpe[which == 3 ? 0 : which], rest, (data[0] & 1) != 0);
    } else if (data[0] >= 0xF8) {
      if (rest.empty()) return 0;
      static const std::vector<std::string> names = depthkv::llama::PreTokenizer::names();
      depthkv::llama::Vocabulary v = bpe_byte_vocab(names[static_cast<unsigned char>(rest[0]) % names.size()]);
      const std::string body = rest.substr(1);
      const std::size_t m = body.find('\xFE');
      const std::size_t x = body.find('\xFD', m == std::string::npos ? 0 : m);
      const std::string extra = body.substr(0, std::min(m, x));
      std::size_t s = 0;
      while (!extra.empty()) {
        const std::size_t e = extra.find('\xFF', s);
        v.tokens.push_back(extra.substr(s, e == std::string::npos ? std::string::npos : e - s));
        if (e == std::string::npos) break;
        s = e + 1;
      }
      if (m != std::string::npos) {
        const std::string merges = body.substr(m + 1, x == std::string::npos ? std::string::npos : x - m - 1);
        std::size_t p = 0;
        while (true) {
          const std::size_t e = merges.find('\n', p);
          v.merges.push_back(merges.substr(p, e == std::string::npos ? std::string::npos : e - p));
          if (e == std::string::npos) break;
          p = e + 1;
        }
      }
      const std::string text = x == std::string::npos ? std::string("hello world") : body.substr(x + 1);
      const depthkv::llama::BpeTokenizer t(v);
      bpe_round_trip(t, text, true);
    } else if (mode == 0) {
      static const PieceMap base_pieces = piece_map(*base);
      exercise(*base, rest, true, g_base_from_file, rest.size() <= 128, &base_pieces);
      // Round trip: every byte string (up to its first NUL) decodes back exactly after BOS.
      const std::vector<int> ids = base->encode(rest, true, false);
      std::string back;
      for (std::size_t i = 1; i < ids.size(); ++i) back += base->decode(ids[i - 1], ids[i]);
      check(back == rest.substr(0, rest.find('\0')));
    } else if (mode == 1) {
      const Tokenizer t = Tokenizer::from_memory(reinterpret_cast<const std::uint8_t*>(rest.data()), rest.size());
      exercise(t, "Once upon a time, \xE2\x82\xAC!", true, true, t.vocab_size() <= 600);
      for (int i = 0; i < t.vocab_size(); ++i) (void)t.decode(t.bos_id(), i);
    } else if (mode == 2) {
      const std::size_t split = rest.find('\xFE');
      const std::string pieces = rest.substr(0, split);
      const std::string text = split == std::string::npos ? std::string("a b") : rest.substr(split + 1);
      depthkv::llama::Vocabulary v;
      v.model = "llama";
      std::size_t start = 0;
      while (true) {
        const std::size_t e = pieces.find('\xFF', start);
        v.tokens.push_back(pieces.substr(start, e == std::string::npos ? std::string::npos : e - start));
        v.scores.push_back(-static_cast<float>(static_cast<unsigned char>(v.tokens.back().empty() ? 0 : v.tokens.back()[0]) % 7));
        if (e == std::string::npos) break;
        start = e + 1;
      }
      v.bos_id = v.size() > 1 ? 1 : -1;
      v.eos_id = v.size() > 2 ? 2 : -1;
      const Tokenizer t(v);
      exercise(t, text, true, false, text.size() <= 96 && t.vocab_size() <= 600);
    } else {
      const std::vector<int> ids = depthkv::llama::parse_token_ids(rest, 512);
      for (int id : ids) check(id >= 0 && id < 512);
    }
  } catch (const depthkv::Error&) {
  }
  return 0;
}
