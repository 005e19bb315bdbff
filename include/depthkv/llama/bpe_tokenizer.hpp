#pragma once
/// @file llama/bpe_tokenizer.hpp
/// @brief Byte-level BPE (GGUF vocabularies of kind `gpt2`: Llama 3.x, Qwen 2/2.5/3/3.5,
/// SmolLM, DeepSeek, GPT-2, Mistral tekken), token for token as llama.cpp's `llama_tokenize`.
/// Needs the `depthkv::llama` CMake target (PCRE2).
///
/// `encode(text, bos, eos, parse_special)`:
/// 1. Special tokens: the tokens of type user-defined (4) are always matched in the text as
///    whole tokens; with `parse_special`, those of type control (3) and unknown (2) too (e.g.
///    `<|begin_of_text|>`, `<|im_start|>`), longest first, as llama.cpp's
///    `tokenizer_st_partition`. Off by default, so such text is tokenized as plain text.
/// 2. The text between them is split by the pre-tokenizer that `tokenizer.ggml.pre` names
///    (depthkv/llama/pre_tokenizer.hpp; an unknown name is an error).
/// 3. Each piece is mapped byte by byte to GPT-2's printable characters (`bytes_to_unicode`:
///    the bytes `!`..`~`, `¡`..`¬`, `®`..`ÿ` stand for themselves, the 68 others for U+0100
///    upwards in byte order) and merged by `tokenizer.ggml.merges`: repeatedly the adjacent
///    pair of lowest rank (the leftmost on ties). With the pre-tokenizer's `ignore_merges`
///    (llama-bpe, tekken), a piece that is a whole token is taken as it is.
/// BOS/EOS are added when asked for; `add_bos()`/`add_eos()` say what the file wants (the
/// `add_bos_token`/`add_eos_token` keys; absent: llama.cpp's default for the pre-tokenizer).
///
/// Decoding is exact: `decode(encode(s)) == s` for every byte string `s`, also for invalid
/// UTF-8 and NUL bytes, when the vocabulary has a token for each of GPT-2's 256 byte characters.
/// Invalid UTF-8 is kept byte for byte: no pre-tokenizer pattern matches an invalid byte, so it
/// lands in a piece of its own (with the unmatched text around it) and is encoded through its
/// byte token. (llama.cpp replaces each invalid byte by U+FFFD before splitting; on invalid input
/// only, its ids differ from these.) A byte whose character is no token (SmolLM2 has none for
/// 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1 and 0xF1, 0xF2, 0xF5..0xFF) takes part in no
/// merge and is dropped, as llama.cpp drops it. A normal token decodes to the
/// bytes its characters stand for (a character outside GPT-2's map, which real vocabularies do
/// not have, is copied as UTF-8); control, user-defined and unknown tokens decode to their text.
///
/// @code
/// const auto vocab = depthkv::llama::load_gguf_vocabulary("ggml-vocab-llama-bpe.gguf");
/// depthkv::llama::BpeTokenizer tok(vocab);
/// std::vector<int> ids = tok.encode("Hello world", /*bos=*/tok.add_bos(), /*eos=*/false);
/// // ids == {128000, 9906, 1917}
/// std::string text = tok.decode(std::vector<int>(ids.begin() + 1, ids.end()));  // "Hello world"
/// @endcode

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/detail/token_partition.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/pre_tokenizer.hpp"
#include "depthkv/llama/text_tokenizer.hpp"

namespace depthkv {
namespace llama {

/// GGUF token types (`tokenizer.ggml.token_type`).
enum class TokenType : std::int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};

namespace detail {

/// GPT-2's `bytes_to_unicode`: the code point that stands for each byte.
inline const std::array<std::uint32_t, 256>& gpt2_byte_to_codepoint() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    std::uint32_t extra = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = printable ? b : extra++;
    }
    return t;
  }();
  return table;
}

/// Appends the UTF-8 encoding of `cp` (< 0x110000).
inline void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// Decodes one UTF-8 character at `s[i]` (shortest form, no surrogates).
/// @return its length in bytes, or 0 when the bytes there are not a valid character
inline std::size_t utf8_next(const std::string& s, std::size_t i, std::uint32_t& cp) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  std::uint32_t min = 0;
  if (c < 0x80) {
    cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const unsigned char d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace detail

/// Byte-level BPE tokenizer of a GGUF vocabulary of kind `gpt2` (see the file comment).
/// Immutable after construction: `encode`/`decode` may run on several threads at once.
class BpeTokenizer : public TextTokenizer {
 public:
  /// @param vocab a vocabulary of kind `gpt2` (see `read_vocabulary`)
  /// @throws Error when the vocabulary is of another kind, has no tokens, no `merges` key, an
  ///   unknown or missing `pre` name, token types not one per token, a malformed merge or one
  ///   naming a string that is not a token, or BOS/EOS/EOT ids out of range
  explicit BpeTokenizer(const Vocabulary& vocab) : pre_(check_vocab(vocab)) {
    const int n = vocab.size();
    pieces_ = vocab.tokens;
    types_.assign(pieces_.size(), static_cast<std::int32_t>(TokenType::kNormal));
    if (!vocab.token_types.empty()) types_ = vocab.token_types;
    index_.reserve(pieces_.size());
    for (int i = 0; i < n; ++i) index_.emplace(pieces_[static_cast<std::size_t>(i)], i);  // lowest id of duplicates

    init_special_ids(vocab);
    add_bos_ = vocab.add_bos_set ? vocab.add_bos : pre_.add_bos();
    add_eos_ = vocab.add_eos;
    init_byte_tables();
    init_merges(vocab);
    init_specials();

    // What each token decodes to.
    bytes_.reserve(pieces_.size());
    for (int i = 0; i < n; ++i) bytes_.push_back(unmap(i));
  }

  /// @return number of tokens
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  /// @return BOS id (`tokenizer.ggml.bos_token_id`), -1 when the file has none
  int bos_id() const override { return bos_id_; }
  /// @return EOS id (`tokenizer.ggml.eos_token_id`), -1 when the file has none
  int eos_id() const override { return eos_id_; }
  /// @return end-of-turn id (`tokenizer.ggml.eot_token_id`, else the first of `<|eot_id|>`,
  ///   `<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`, `<|end_of_text|>` that is a
  ///   token), -1 when none
  int eot_id() const { return eot_id_; }
  /// @return whether the file asks for BOS before a text (`add_bos_token`; absent: true for
  ///   llama-bpe and tekken, false otherwise, as llama.cpp)
  bool add_bos() const { return add_bos_; }
  /// @return whether the file asks for EOS after a text (`add_eos_token`, default false)
  bool add_eos() const { return add_eos_; }
  /// @return the pre-tokenizer
  const PreTokenizer& pre_tokenizer() const { return pre_; }
  /// @return number of merges (pairs with a rank)
  std::size_t merge_count() const { return merges_.size(); }

  /// @param id token id
  /// @return its text as stored (GPT-2 characters for normal tokens)
  /// @throws Error when out of range
  const std::string& piece(int id) const {
    check_id(id, "piece");
    return pieces_[static_cast<std::size_t>(id)];
  }
  /// @param id token id
  /// @return its type (kNormal when the file has no token types)
  /// @throws Error when out of range
  TokenType token_type(int id) const {
    check_id(id, "token_type");
    return static_cast<TokenType>(types_[static_cast<std::size_t>(id)]);
  }
  /// @param text a token's stored text
  /// @return its id (the lowest of duplicates), -1 when it is no token
  int lookup(const std::string& text) const {
    const auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
  }

  /// Encodes `text` (see the file comment).
  /// @param text any bytes (UTF-8 text; invalid sequences are kept)
  /// @param bos prepend BOS
  /// @param eos append EOS
  /// @param parse_special match control and unknown tokens in the text (user-defined tokens are
  ///   always matched)
  /// @return token ids
  /// @throws Error when BOS/EOS is asked for but the vocabulary has none, or on a PCRE2 matching
  ///   error
  std::vector<int> encode(const std::string& text, bool bos, bool eos, bool parse_special) const {
    std::vector<int> out;
    out.reserve(text.size() / 3 + 2);
    if (bos) {
      DEPTHKV_CHECK(bos_id_ >= 0, "BOS asked for, but the vocabulary has no BOS token (tokenizer.ggml.bos_token_id)");
      out.push_back(bos_id_);
    }
    std::vector<Fragment> frags;
    partition(text, parse_special, frags);
    std::vector<PreTokenizer::Span> spans;
    Work work;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      spans.clear();
      pre_.split(text.data() + f.offset, f.length, spans);
      for (const PreTokenizer::Span& s : spans) encode_piece(text.data() + f.offset + s.offset, s.length, work, out);
    }
    if (eos) {
      DEPTHKV_CHECK(eos_id_ >= 0, "EOS asked for, but the vocabulary has no EOS token (tokenizer.ggml.eos_token_id)");
      out.push_back(eos_id_);
    }
    return out;
  }

  /// Encodes `text` without special-token parsing (`encode(text, bos, eos, false)`).
  std::vector<int> encode(const std::string& text, bool bos, bool eos) const override {
    return encode(text, bos, eos, /*parse_special=*/false);
  }

  /// @param id token id
  /// @return the bytes it stands for (see the file comment)
  /// @throws Error when out of range
  const std::string& token_bytes(int id) const {
    check_id(id, "token_bytes");
    return bytes_[static_cast<std::size_t>(id)];
  }

  /// @param ids token ids
  /// @param special include the text of control tokens (BOS, EOS, `<|im_start|>`...); when
  ///   false they decode to nothing
  /// @return the concatenated bytes
  /// @throws Error when an id is out of range
  std::string decode(const std::vector<int>& ids, bool special = true) const {
    std::string out;
    for (int id : ids) {
      const std::string& b = token_bytes(id);
      if (special || token_type(id) != TokenType::kControl) out += b;
    }
    return out;
  }

  /// @param prev_token ignored (byte-level BPE needs no context)
  /// @param token the token
  /// @return `token_bytes(token)`
  std::string decode(int /*prev_token*/, int token) const override { return token_bytes(token); }

  /// @return `piece` unchanged (the bytes are printed as they are)
  std::string printable(const std::string& piece) const override { return piece; }

  /// @return whether `token` is EOS or EOT
  bool ends_generation(int token) const override {
    return token >= 0 && (token == eos_id_ || token == eot_id_);
  }

 private:
  struct Merge {
    int rank;
    int id;
  };
  using Fragment = detail::TextFragment;  // token >= 0: a special token; -1: text
  // A candidate merge of the pair at positions (left, right) holding (left_id, right_id).
  struct Cand {
    int rank;
    int left, right;
    int left_id, right_id;
    int merged;
  };
  // Heap order: the lowest rank on top, the leftmost on ties.
  struct Worse {
    bool operator()(const Cand& a, const Cand& b) const {
      if (a.rank != b.rank) return a.rank > b.rank;
      return a.left > b.left;
    }
  };
  // Per-call buffers of the merge loop.
  struct Work {
    std::vector<int> ids;
    std::vector<int> prev, next;
    std::vector<Cand> heap;
    std::string mapped;
    // the ids of short pieces already encoded in this call (a text repeats its words)
    std::unordered_map<std::string, std::vector<int>> cache;
  };
  static constexpr std::size_t kCachedPieceBytes = 32;
  static constexpr std::size_t kCacheEntries = 1 << 16;

  static std::string check_vocab(const Vocabulary& v) {
    DEPTHKV_CHECK(v.model == "gpt2", "BpeTokenizer needs a vocabulary of kind 'gpt2' (byte-level BPE), got '"
                                         << v.model << "' (tokenizer.ggml.model)");
    DEPTHKV_CHECK(!v.tokens.empty(), "BPE vocabulary has no tokens");
    DEPTHKV_CHECK(v.tokens.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max() / 2),
                  "BPE vocabulary: too many tokens");
    DEPTHKV_CHECK(v.has_merges, "BPE vocabulary has no merges (the key tokenizer.ggml.merges is missing)");
    DEPTHKV_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
                  "BPE vocabulary: " << v.token_types.size() << " token types for " << v.tokens.size()
                                     << " tokens (truncated vocabulary?)");
    DEPTHKV_CHECK(!v.pre.empty(), "BPE vocabulary has no pre-tokenizer name (tokenizer.ggml.pre is missing; "
                                  "llama.cpp would fall back to 'default' with a warning, depthkv does not guess)");
    return v.pre;
  }

  // Sets bos_id_/eos_id_/eot_id_ from the vocabulary (negative ids: none); without an EOT id,
  // llama.cpp's fallback: the end-of-turn token found by its text. Needs pieces_ and index_.
  // Throws when an id is >= the vocabulary size.
  void init_special_ids(const Vocabulary& vocab) {
    const int n = vocab.size();
    auto in_range = [n](int id, const char* what) {
      DEPTHKV_CHECK(id < n, "BPE vocabulary: " << what << " id " << id << " is out of range for " << n << " tokens");
      return id < 0 ? -1 : id;
    };
    bos_id_ = in_range(vocab.bos_id, "BOS");
    eos_id_ = in_range(vocab.eos_id, "EOS");
    eot_id_ = in_range(vocab.eot_id, "EOT");
    if (eot_id_ >= 0) return;
    for (const char* t : {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>"}) {
      const int id = lookup(t);
      if (id >= 0) {
        eot_id_ = id;
        return;
      }
    }
  }

  // Byte tokens: the token spelled by each byte's GPT-2 character (byte_token_), and the
  // inverse map of those characters (codepoint_byte_).
  void init_byte_tables() {
    const auto& b2c = detail::gpt2_byte_to_codepoint();
    for (int b = 0; b < 256; ++b) {
      std::string s;
      detail::append_utf8(s, b2c[static_cast<std::size_t>(b)]);
      byte_token_[b] = lookup(s);
      codepoint_byte_[b2c[static_cast<std::size_t>(b)]] = static_cast<unsigned char>(b);
    }
  }

  // Merges: (left id, right id) -> (rank, merged id); the first occurrence of a pair wins.
  // Throws on a merge that is not "left right" or names a string that is not a token.
  void init_merges(const Vocabulary& vocab) {
    merges_.reserve(vocab.merges.size());
    for (std::size_t r = 0; r < vocab.merges.size(); ++r) {
      const std::string& m = vocab.merges[r];
      const std::size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      DEPTHKV_CHECK_AS("BpeTokenizer", sp != std::string::npos && sp + 1 < m.size(),
                       "BPE merge " << r << " '" << m << "' is not two strings separated by a space");
      const std::string left = m.substr(0, sp), right = m.substr(sp + 1);
      const int l = lookup(left), rt = lookup(right), merged = lookup(left + right);
      DEPTHKV_CHECK_AS("BpeTokenizer", l >= 0,
                       "BPE merge " << r << " '" << m << "' names '" << left << "', which is not a token");
      DEPTHKV_CHECK_AS("BpeTokenizer", rt >= 0,
                       "BPE merge " << r << " '" << m << "' names '" << right << "', which is not a token");
      DEPTHKV_CHECK_AS(
          "BpeTokenizer", merged >= 0,
          "BPE merge " << r << " '" << m << "' makes '" << left + right << "', which is not a token");
      DEPTHKV_CHECK_AS("BpeTokenizer", r < static_cast<std::size_t>(std::numeric_limits<int>::max()),
                       "too many BPE merges");
      merges_.emplace(pair_key(l, rt), Merge{static_cast<int>(r), merged});
    }
  }

  // Special tokens matched in the text (step 1): the non-empty control, user-defined and
  // unknown tokens, longest first, then by id.
  void init_specials() {
    for (int i = 0; i < vocab_size(); ++i) {
      const TokenType t = token_type(i);
      if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
          !pieces_[static_cast<std::size_t>(i)].empty())
        specials_.push_back(i);
    }
    std::stable_sort(specials_.begin(), specials_.end(), [this](int a, int b) {
      return pieces_[static_cast<std::size_t>(a)].size() > pieces_[static_cast<std::size_t>(b)].size();
    });
  }

  void check_id(int id, const char* what) const {
    DEPTHKV_CHECK(id >= 0 && id < vocab_size(),
                  what << ": token id " << id << " out of range [0, " << vocab_size() << ")");
  }

  static std::uint64_t pair_key(int left, int right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  // Step 1: special tokens cut the text into fragments (text or one token), each special token
  // in turn over the text fragments left so far (user-defined ones always, the others when
  // `parse_special`).
  void partition(const std::string& text, bool parse_special, std::vector<Fragment>& frags) const {
    std::vector<std::pair<std::string_view, int>> cut;
    for (int id : specials_)
      if (parse_special || static_cast<TokenType>(types_[static_cast<std::size_t>(id)]) == TokenType::kUserDefined)
        cut.emplace_back(pieces_[static_cast<std::size_t>(id)], id);
    detail::partition_at_tokens(text, cut, frags);
  }

  // Steps 3-4 for one piece of the pre-tokenizer.
  void encode_piece(const char* s, std::size_t n, Work& w, std::vector<int>& out) const {
    if (n == 0) return;
    DEPTHKV_CHECK(n < static_cast<std::size_t>(std::numeric_limits<int>::max()),
                  "a pre-tokenizer piece of " << n << " bytes is too long for BPE");
    if (n > 1 && n <= kCachedPieceBytes) {
      std::string key(s, n);
      const auto hit = w.cache.find(key);
      if (hit != w.cache.end()) {
        out.insert(out.end(), hit->second.begin(), hit->second.end());
        return;
      }
      const std::size_t before = out.size();
      encode_uncached(s, n, w, out);
      if (w.cache.size() < kCacheEntries)
        w.cache.emplace(std::move(key), std::vector<int>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
      return;
    }
    encode_uncached(s, n, w, out);
  }

  // Steps 3-4 without the cache.
  void encode_uncached(const char* s, std::size_t n, Work& w, std::vector<int>& out) const {
    const auto& b2c = detail::gpt2_byte_to_codepoint();
    if (pre_.ignore_merges() && n > 1) {
      w.mapped.clear();
      for (std::size_t i = 0; i < n; ++i) detail::append_utf8(w.mapped, b2c[static_cast<unsigned char>(s[i])]);
      const int whole = lookup(w.mapped);
      if (whole >= 0) {
        out.push_back(whole);
        return;
      }
    }
    // A byte whose GPT-2 character is no token (-1) stays in place, never merges and is dropped
    // from the output, as llama.cpp drops it.
    w.ids.resize(n);
    for (std::size_t i = 0; i < n; ++i) w.ids[i] = byte_token_[static_cast<unsigned char>(s[i])];
    if (n == 1) {
      if (w.ids[0] >= 0) out.push_back(w.ids[0]);
      return;
    }
    merge(n, w);
    for (int i = 0; i != -1; i = w.next[static_cast<std::size_t>(i)]) {
      const int id = w.ids[static_cast<std::size_t>(i)];
      if (id >= 0) out.push_back(id);
    }
  }

  // Lowest rank first, leftmost on ties; a heap of candidate pairs over a linked list, stale
  // candidates (a side merged since) skipped when popped.
  void merge(std::size_t n, Work& w) const {
    w.prev.resize(n);
    w.next.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      w.prev[i] = static_cast<int>(i) - 1;
      w.next[i] = i + 1 == n ? -1 : static_cast<int>(i) + 1;
    }
    std::vector<Cand>& heap = w.heap;
    heap.clear();
    auto push = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const int lid = w.ids[static_cast<std::size_t>(l)], rid = w.ids[static_cast<std::size_t>(r)];
      if (lid < 0 || rid < 0) return;  // a byte without a token
      const auto it = merges_.find(pair_key(lid, rid));
      if (it == merges_.end()) return;
      heap.push_back(Cand{it->second.rank, l, r, lid, rid, it->second.id});
      std::push_heap(heap.begin(), heap.end(), Worse());
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(static_cast<int>(i), static_cast<int>(i) + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), Worse());
      const Cand c = heap.back();
      heap.pop_back();
      const std::size_t l = static_cast<std::size_t>(c.left), r = static_cast<std::size_t>(c.right);
      if (w.next[l] != c.right || w.ids[l] != c.left_id || w.ids[r] != c.right_id || w.prev[r] != c.left) continue;
      w.ids[l] = c.merged;
      w.next[l] = w.next[r];
      if (w.next[r] >= 0) w.prev[static_cast<std::size_t>(w.next[r])] = c.left;
      w.prev[r] = -2;  // removed
      w.next[r] = -2;
      push(w.prev[l], c.left);
      push(c.left, w.next[l]);
    }
  }

  // The bytes of token `id` (see the file comment).
  std::string unmap(int id) const {
    const std::string& p = pieces_[static_cast<std::size_t>(id)];
    const TokenType t = static_cast<TokenType>(types_[static_cast<std::size_t>(id)]);
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) return p;
    std::string out;
    out.reserve(p.size());
    for (std::size_t i = 0; i < p.size();) {
      std::uint32_t cp = 0;
      const std::size_t len = detail::utf8_next(p, i, cp);
      if (len == 0) {  // not UTF-8: copied
        out.push_back(p[i]);
        ++i;
        continue;
      }
      const auto it = codepoint_byte_.find(cp);
      if (it != codepoint_byte_.end()) {
        out.push_back(static_cast<char>(it->second));
      } else {
        out.append(p, i, len);
      }
      i += len;
    }
    return out;
  }

  PreTokenizer pre_;
  std::vector<std::string> pieces_;
  std::vector<std::int32_t> types_;
  std::vector<std::string> bytes_;                  // what each token decodes to
  std::unordered_map<std::string, int> index_;      // text -> lowest id
  std::unordered_map<std::uint64_t, Merge> merges_; // (left, right) -> rank, merged id
  std::unordered_map<std::uint32_t, unsigned char> codepoint_byte_;  // GPT-2 character -> byte
  std::vector<int> specials_;                       // control / user-defined / unknown, longest first
  int byte_token_[256] = {};
  int bos_id_ = -1, eos_id_ = -1, eot_id_ = -1;
  bool add_bos_ = false, add_eos_ = false;
};

}  // namespace llama
}  // namespace depthkv
