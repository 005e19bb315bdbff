#pragma once
/// @file llama/tokenizer.hpp
/// @brief The llama2.c BPE tokenizer (SentencePiece vocabularies): byte-exact `encode`,
/// `decode` and `safe_piece` as karpathy/llama2.c `run.c`, loaded from a llama2.c `tok*.bin`
/// file or from a GGUF vocabulary of kind `llama`; and pre-tokenized input files for models
/// whose vocabulary cannot be tokenized here.
///
/// `encode(text, bos, eos)` does what run.c's `encode` does: the text is a C string (it ends at
/// its first NUL byte); when it is non-empty the piece " " (dummy prefix) comes first; the text
/// is split into UTF-8 code points (at most 4 bytes), each looked up as a piece, a code point
/// that is no piece becoming one token per byte (byte fallback: token byte + 3 in llama2.c
/// files, the `<0xHH>` piece in GGUF vocabularies); then the adjacent pair whose concatenation is
/// the best-scored piece is merged, the leftmost on ties, until no pair merges (BOS, when
/// requested, takes part in the merging exactly as in run.c). The merge loop runs on a heap
/// over a precomputed pair table (O(n log n)) and yields exactly the result of run.c's
/// quadratic loop (checked against a transcription of it in the tests and the fuzzer).
///
/// A GGUF vocabulary may hold user-defined tokens (type 4; Gemma 3 has 165: runs of 1..31
/// newlines, 2..31 spaces and 1..31 tabs, HTML tags, `<start_of_image>`). As llama.cpp does
/// (`tokenizer_st_partition`), these are matched in the text before anything else, longest
/// first, each occurrence becoming that token; the text between them is encoded as above,
/// fragment by fragment (merges never cross a user-defined token; the dummy prefix goes before a
/// fragment that starts the text or follows such a token; BOS takes no part in the merging).
/// Without user-defined tokens (llama2.c files, most SentencePiece GGUF files) `encode` is
/// run.c's, unchanged.
///
/// @code
/// depthkv::llama::Tokenizer tok("tok512.bin");
/// std::vector<int> ids = tok.encode("Once upon a time", /*bos=*/true, /*eos=*/false);
/// // ids == {1, 403, 407, 261, 378}
/// std::string text;
/// for (std::size_t i = 1; i < ids.size(); ++i) text += tok.safe_piece(tok.decode(ids[i - 1], ids[i]));
/// // text == "Once upon a time"
/// @endcode

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <ostream>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/detail/mapped_file.hpp"
#include "depthkv/llama/detail/token_partition.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/text_tokenizer.hpp"

namespace depthkv {
namespace llama {

/// llama2.c-compatible BPE tokenizer over a SentencePiece-style vocabulary (pieces + scores).
class Tokenizer : public TextTokenizer {
 public:
  /// An empty tokenizer (vocab_size() == 0); every encode/decode throws.
  Tokenizer() = default;

  /// Loads a llama2.c tokenizer file (`tok512.bin`: int32 max_token_length, then per token
  /// float32 score, int32 length, bytes).
  /// @param path the file
  /// @param vocab_size number of tokens to read (the model's vocab size, as run.c does), or -1
  ///   to read tokens until the end of the file
  /// @throws Error when the file cannot be read, is truncated, has trailing bytes, a negative
  ///   or oversized length, a non-finite score, fewer than 3 tokens (BOS = 1 and EOS = 2), or
  ///   a different number of tokens than `vocab_size`
  explicit Tokenizer(const std::string& path, int vocab_size = -1) {
    const detail::MappedFile file(path);
    load_llama2c(file.data(), file.size(), vocab_size, path);
  }

  /// Builds the tokenizer of a GGUF vocabulary of kind `llama` (SentencePiece), converted as
  /// llama2.c's `tokenizer.py export` does: "▁" (U+2581) becomes " " in every piece, the BOS
  /// piece becomes "\n<s>\n" and the EOS piece "\n</s>\n"; byte fallback uses the `<0xHH>`
  /// pieces. The dummy prefix follows `add_space_prefix`.
  /// @param vocab the vocabulary (see `load_gguf_vocabulary`)
  /// @throws Error when the vocabulary is of another kind (e.g. `gpt2`: use `BpeTokenizer`
  ///   from depthkv/llama/bpe_tokenizer.hpp, or pre-tokenized input, see `read_token_file`), has no or
  ///   mismatched scores, non-finite scores, or BOS/EOS ids out of range
  explicit Tokenizer(const Vocabulary& vocab) {
    DEPTHKV_CHECK(vocab.model == "llama",
                  "the model's vocabulary is of kind '"
                      << vocab.model
                      << "' (tokenizer.ggml.model); Tokenizer handles only SentencePiece vocabularies (kind 'llama'): "
                         "use BpeTokenizer (depthkv/llama/bpe_tokenizer.hpp) for kind 'gpt2', or pre-tokenized input "
                         "(a file of token ids, see read_token_file)");
    DEPTHKV_CHECK(!vocab.tokens.empty(), "GGUF vocabulary has no tokens");
    DEPTHKV_CHECK(vocab.scores.size() == vocab.tokens.size(),
                  "GGUF vocabulary of kind 'llama' needs one score per token: " << vocab.tokens.size() << " tokens, "
                                                                                << vocab.scores.size() << " scores");
    const int n = vocab.size();
    bos_id_ = vocab.bos_id >= 0 ? vocab.bos_id : 1;
    eos_id_ = vocab.eos_id >= 0 ? vocab.eos_id : 2;
    DEPTHKV_CHECK(bos_id_ < n && eos_id_ < n, "GGUF vocabulary: BOS id " << bos_id_ << " or EOS id " << eos_id_
                                                                           << " out of range for " << n << " tokens");
    add_dummy_prefix_ = vocab.add_space_prefix;
    pieces_.reserve(vocab.tokens.size());
    for (int i = 0; i < n; ++i) {
      std::string p;
      if (i == bos_id_) {
        p = "\n<s>\n";
      } else if (i == eos_id_) {
        p = "\n</s>\n";
      } else {
        p = replace_all(vocab.tokens[static_cast<std::size_t>(i)], "\xE2\x96\x81", " ");
      }
      pieces_.push_back(std::move(p));
    }
    scores_ = vocab.scores;
    for (int i = 0; i < n; ++i) {
      DEPTHKV_CHECK(std::isfinite(scores_[static_cast<std::size_t>(i)]),
                    "GGUF vocabulary: token " << i << " has a non-finite score");
    }
    if (vocab.token_types.size() == vocab.tokens.size()) {
      const std::int32_t kUserDefined = 4;  // tokenizer.ggml.token_type
      for (int i = 0; i < n; ++i) {
        const std::string& t = vocab.tokens[static_cast<std::size_t>(i)];
        if (vocab.token_types[static_cast<std::size_t>(i)] == kUserDefined && i != bos_id_ && i != eos_id_ &&
            !t.empty() && t.find('\0') == std::string::npos)
          user_defined_.emplace_back(t, i);
      }
      std::stable_sort(user_defined_.begin(), user_defined_.end(),
                       [](const std::pair<std::string, int>& a, const std::pair<std::string, int>& b) {
                         return a.first.size() > b.first.size();
                       });
    }
    finish(/*llama2c_bytes=*/false);
  }

  /// Loads a llama2.c tokenizer from memory (see the file constructor).
  /// @param data the file's bytes
  /// @param size their number
  /// @param vocab_size tokens to read, or -1 for all
  /// @param source name for error messages
  /// @return the tokenizer
  /// @throws Error as the file constructor
  static Tokenizer from_memory(const std::uint8_t* data, std::size_t size, int vocab_size = -1,
                               const std::string& source = "<memory>") {
    Tokenizer t;
    t.load_llama2c(data, size, vocab_size, source);
    return t;
  }

  /// @return number of tokens
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  /// @return id of the beginning-of-sequence token (1 in llama2.c)
  int bos_id() const override { return bos_id_; }
  /// @return id of the end-of-sequence token (2 in llama2.c)
  int eos_id() const override { return eos_id_; }
  /// @return the longest piece in bytes (as stored in llama2.c files, else computed)
  int max_token_length() const { return max_token_length_; }
  /// @return the number of user-defined tokens matched in the text before encoding (GGUF only)
  int user_defined_count() const { return static_cast<int>(user_defined_.size()); }

  /// @param id token id
  /// @return its piece, as stored (llama2.c form: spaces, "\n<s>\n" for BOS)
  /// @throws Error when `id` is out of range
  const std::string& piece(int id) const {
    check_id(id, "piece");
    return pieces_[static_cast<std::size_t>(id)];
  }

  /// @param id token id
  /// @return its merge score
  /// @throws Error when `id` is out of range
  float score(int id) const {
    check_id(id, "score");
    return scores_[static_cast<std::size_t>(id)];
  }

  /// Encodes `text` exactly as llama2.c's run.c `encode` (with user-defined tokens, as llama.cpp:
  /// see the file comment).
  /// @param text UTF-8 text; it ends at its first NUL byte, as a C string
  /// @param bos prepend BOS
  /// @param eos append EOS
  /// @return token ids
  /// @throws Error when the tokenizer is empty, the vocabulary has no " " piece for the dummy
  ///   prefix, or a byte has no byte-fallback token
  std::vector<int> encode(const std::string& text_in, bool bos, bool eos) const override {
    DEPTHKV_CHECK(!pieces_.empty(), "encode on an empty tokenizer");
    const std::string text = text_in.substr(0, text_in.find('\0'));
    std::vector<int> tokens;
    tokens.reserve(text.size() + 3);
    if (bos) tokens.push_back(bos_id_);
    if (user_defined_.empty()) {  // run.c: BOS, the dummy prefix and the text merge together
      if (!text.empty() && add_dummy_prefix_) tokens.push_back(dummy_prefix());
      append_code_points(text, 0, text.size(), tokens);
      merge(tokens);
    } else {
      std::vector<Fragment> frags;
      partition(text, frags);
      std::vector<int> part;
      bool after_token = true;  // llama.cpp: the dummy prefix goes first and after each such token
      for (const Fragment& f : frags) {
        if (f.token >= 0) {
          tokens.push_back(f.token);
          after_token = true;
          continue;
        }
        part.clear();
        if (add_dummy_prefix_ && after_token) part.push_back(dummy_prefix());
        append_code_points(text, f.offset, f.offset + f.length, part);
        merge(part);
        tokens.insert(tokens.end(), part.begin(), part.end());
        after_token = false;
      }
    }
    if (eos) tokens.push_back(eos_id_);
    return tokens;
  }

  /// The text of `token` following `prev_token`, exactly as run.c's `decode`: right after BOS
  /// a leading space is dropped; a piece of the form `<0xHH>` is the raw byte HH (byte 0 gives
  /// ""); pieces are C strings (they end at their first NUL byte).
  /// @param prev_token the previous token (any int; only compared with BOS)
  /// @param token the token to decode
  /// @return its text
  /// @throws Error when `token` is out of range
  std::string decode(int prev_token, int token) const override {
    check_id(token, "decode");
    const std::string& p = cpieces_[static_cast<std::size_t>(token)];
    std::size_t start = 0;
    if (prev_token == bos_id_ && !p.empty() && p[0] == ' ') start = 1;
    int byte = -1;
    if (parse_byte_piece(p, start, byte)) {
      return byte == 0 ? std::string() : std::string(1, static_cast<char>(byte));
    }
    return p.substr(start);
  }

  /// What run.c's `safe_printf` prints for `piece`: nothing for an empty piece or for a single
  /// byte that is neither printable nor whitespace in the C locale, else the piece up to its
  /// first NUL byte.
  /// @param piece a decoded piece
  /// @return the printable text
  static std::string safe_piece(const std::string& piece) {
    const std::string p = piece.substr(0, piece.find('\0'));
    if (p.empty()) return p;
    if (p.size() == 1) {
      const unsigned char b = static_cast<unsigned char>(p[0]);
      const bool print = b >= 0x20 && b <= 0x7E;
      const bool space = b == ' ' || (b >= '\t' && b <= '\r');
      if (!print && !space) return std::string();
    }
    return p;
  }

  /// Writes `safe_piece(piece)` to `os`.
  /// @param os output stream
  /// @param piece a decoded piece
  static void safe_print(std::ostream& os, const std::string& piece) { os << safe_piece(piece); }

  /// @param piece a decoded piece
  /// @return `safe_piece(piece)` (what run.c prints)
  std::string printable(const std::string& piece) const override { return safe_piece(piece); }

  /// @return false: llama2.c's generation loop stops at BOS only
  bool ends_generation(int /*token*/) const override { return false; }

 private:
  // A stretch of the text: a user-defined token (token >= 0) or text to encode (-1).
  using Fragment = detail::TextFragment;

  int dummy_prefix() const {
    const int space = lookup(" ");
    DEPTHKV_CHECK(space >= 0, "the vocabulary has no \" \" piece for the dummy prefix");
    return space;
  }

  // Appends the pieces of the UTF-8 code points of text[begin, end) (run.c: at most 4 bytes
  // gathered, continuation bytes appended), byte fallback for a code point that is no piece.
  void append_code_points(const std::string& text, std::size_t begin, std::size_t end, std::vector<int>& tokens) const {
    std::string buf;
    for (std::size_t i = begin; i < end; ++i) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      if ((c & 0xC0) != 0x80) buf.clear();
      buf.push_back(static_cast<char>(c));
      const unsigned char next = i + 1 < end ? static_cast<unsigned char>(text[i + 1]) : 0;
      if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
      const int id = lookup(buf);
      if (id >= 0) {
        tokens.push_back(id);
      } else {
        for (const char b : buf) {
          const int bid = byte_token_[static_cast<unsigned char>(b)];
          DEPTHKV_CHECK(bid >= 0, "byte 0x" << std::hex << static_cast<int>(static_cast<unsigned char>(b))
                                            << " has no byte-fallback token in a vocabulary of "
                                            << std::dec << pieces_.size() << " tokens");
          tokens.push_back(bid);
        }
      }
      buf.clear();
    }
  }

  // Splits `text` at the user-defined tokens, longest first, each leftmost occurrence first (as
  // llama.cpp's tokenizer_st_partition).
  void partition(const std::string& text, std::vector<Fragment>& frags) const {
    std::vector<std::pair<std::string_view, int>> cut(user_defined_.begin(), user_defined_.end());
    detail::partition_at_tokens(text, cut, frags);
  }

  static std::string replace_all(std::string s, const std::string& from, const std::string& to) {
    std::size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
      s.replace(pos, from.size(), to);
      pos += to.size();
    }
    return s;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // sscanf(piece, "<0x%02hhX>", &b) == 1 as in run.c: "<0x", optional C-locale whitespace, then
  // a field of at most 2 characters holding an optional sign and at least one hex digit; what
  // follows is not checked. (glibc's acceptance of a "0x" prefix inside the 2-character field
  // is not reproduced: no real vocabulary has such pieces.)
  static bool parse_byte_piece(const std::string& p, std::size_t start, int& byte) {
    if (p.compare(start, 3, "<0x") != 0) return false;
    std::size_t i = start + 3;
    while (i < p.size() && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r'))) ++i;
    int width = 2;
    bool neg = false;
    if (i < p.size() && (p[i] == '+' || p[i] == '-')) {
      neg = p[i] == '-';
      ++i;
      --width;
    }
    int value = 0, digits = 0;
    while (digits < width && i < p.size() && hex_value(p[i]) >= 0) {
      value = value * 16 + hex_value(p[i]);
      ++i;
      ++digits;
    }
    if (digits == 0) return false;
    byte = (neg ? -value : value) & 0xFF;
    return true;
  }

  void check_id(int id, const char* what) const {
    DEPTHKV_CHECK(id >= 0 && id < vocab_size(),
                  what << ": token id " << id << " out of range [0, " << vocab_size() << ")");
  }

  static std::uint64_t pair_key(int left, int right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  int lookup(const std::string& s) const {
    const auto it = index_.find(s);
    return it == index_.end() ? -1 : it->second;
  }

  void load_llama2c(const std::uint8_t* data, std::size_t size, int vocab_size, const std::string& source) {
    DEPTHKV_CHECK(detail::host_is_little_endian(), "llama2.c tokenizers can only be read on little-endian hosts");
    DEPTHKV_CHECK(vocab_size == -1 || vocab_size >= 3,
                  source << ": vocab_size must be -1 (read all) or >= 3, got " << vocab_size);
    detail::ByteReader in(data, size, source);
    const std::int32_t max_len = in.read<std::int32_t>("max_token_length");
    DEPTHKV_CHECK(max_len >= 1 && max_len <= (1 << 20),
                  source << ": max_token_length " << max_len << " is out of range [1, 2^20]");
    while (vocab_size < 0 ? in.remaining() > 0 : static_cast<int>(pieces_.size()) < vocab_size) {
      const std::size_t id = pieces_.size();
      DEPTHKV_CHECK(id < static_cast<std::size_t>(std::numeric_limits<int>::max()), source << ": too many tokens");
      const float score = in.read<float>("a token score");
      const std::int32_t len = in.read<std::int32_t>("a token length");
      DEPTHKV_CHECK(len >= 0 && len <= max_len, source << ": token " << id << " has length " << len
                                                       << " outside [0, max_token_length " << max_len << "]");
      DEPTHKV_CHECK(std::isfinite(score), source << ": token " << id << " has a non-finite score");
      const std::uint8_t* p = in.take(static_cast<std::uint64_t>(len), "token bytes");
      pieces_.emplace_back(reinterpret_cast<const char*>(p), static_cast<std::size_t>(len));
      scores_.push_back(score);
    }
    DEPTHKV_CHECK(in.remaining() == 0, source << ": " << in.remaining() << " trailing bytes after "
                                              << pieces_.size() << " tokens (wrong vocab_size or not a llama2.c tokenizer?)");
    DEPTHKV_CHECK(pieces_.size() >= 3, source << ": a llama2.c tokenizer needs at least 3 tokens (BOS = 1, EOS = 2), got "
                                              << pieces_.size());
    bos_id_ = 1;
    eos_id_ = 2;
    add_dummy_prefix_ = true;
    finish(/*llama2c_bytes=*/true);
    max_token_length_ = max_len;
  }

  void finish(bool llama2c_bytes) {
    const int n = static_cast<int>(pieces_.size());
    cpieces_.clear();
    cpieces_.reserve(pieces_.size());
    index_.clear();
    index_.reserve(pieces_.size());
    max_token_length_ = 0;
    for (int i = 0; i < n; ++i) {
      const std::string& p = pieces_[static_cast<std::size_t>(i)];
      cpieces_.push_back(p.substr(0, p.find('\0')));
      index_.emplace(cpieces_.back(), i);  // keeps the lowest id of duplicate pieces
      if (static_cast<int>(p.size()) > max_token_length_) max_token_length_ = static_cast<int>(p.size());
    }
    // Merge table: (left, right) -> the piece their concatenation spells, for every way of
    // splitting every piece into two pieces. Keys use canonical ids (the lowest id of a
    // string), so duplicate pieces cannot blow the table up: at most sum(len + 1) entries.
    canon_.assign(pieces_.size(), 0);
    for (int i = 0; i < n; ++i) canon_[static_cast<std::size_t>(i)] = index_.at(cpieces_[static_cast<std::size_t>(i)]);
    merges_.clear();
    for (const auto& entry : index_) {
      const std::string& str = entry.first;
      for (std::size_t k = 0; k <= str.size(); ++k) {
        const int l = lookup(str.substr(0, k));
        if (l < 0) continue;
        const int r = lookup(str.substr(k));
        if (r < 0) continue;
        merges_.emplace(pair_key(l, r), entry.second);
      }
    }
    for (int b = 0; b < 256; ++b) {
      if (llama2c_bytes) {
        byte_token_[b] = b + 3 < n ? b + 3 : -1;  // run.c: (unsigned char)byte + 3
      } else {
        static const char* hex = "0123456789ABCDEF";
        const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
        byte_token_[b] = lookup(name);
      }
    }
  }

  // A candidate merge of the adjacent positions (left, right) into piece `id` of score `score`;
  // the stamps are the two positions' versions when the candidate was made.
  struct MergeCand {
    float score;
    std::size_t left, right;
    std::uint32_t stamp_left, stamp_right;
    int id;
  };
  // Heap order: the highest score on top, the leftmost on ties.
  struct MergeWorse {
    bool operator()(const MergeCand& a, const MergeCand& b) const {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    }
  };
  using MergeHeap = std::priority_queue<MergeCand, std::vector<MergeCand>, MergeWorse>;

  // The positions of `merge` as a doubly linked list: neighbours, liveness and a version per
  // position (bumped when the position's token changes).
  struct MergeList {
    static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
    std::vector<std::size_t> prev, next;
    std::vector<std::uint32_t> stamp;
    std::vector<char> alive;

    explicit MergeList(std::size_t n) : prev(n), next(n), stamp(n, 0), alive(n, 1) {
      for (std::size_t i = 0; i < n; ++i) {
        prev[i] = i == 0 ? kNone : i - 1;
        next[i] = i + 1 == n ? kNone : i + 1;
      }
    }
    // True when both positions of `c` are alive, still adjacent and unchanged since `c` was made.
    bool is_current(const MergeCand& c) const {
      return alive[c.left] && alive[c.right] && next[c.left] == c.right && stamp[c.left] == c.stamp_left &&
             stamp[c.right] == c.stamp_right;
    }
    // Applies `c`: its left position takes the merged token, its right position is unlinked.
    void join(const MergeCand& c, std::vector<int>& tokens) {
      tokens[c.left] = c.id;
      ++stamp[c.left];
      alive[c.right] = 0;
      next[c.left] = next[c.right];
      if (next[c.right] != kNone) prev[next[c.right]] = c.left;
    }
    // Keeps the alive positions of `tokens`, in order.
    void compact(std::vector<int>& tokens) const {
      std::size_t w = 0;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (alive[i]) tokens[w++] = tokens[i];
      }
      tokens.resize(w);
    }
  };

  // Pushes the candidate merge of positions (l, r) when both exist, their pieces merge and the
  // merged piece scores above run.c's initial best_score (-1e10).
  void push_merge(const std::vector<int>& tokens, const MergeList& list, std::size_t l, std::size_t r,
                  MergeHeap& heap) const {
    if (l == MergeList::kNone || r == MergeList::kNone) return;
    const auto it = merges_.find(pair_key(canon_[static_cast<std::size_t>(tokens[l])],
                                           canon_[static_cast<std::size_t>(tokens[r])]));
    if (it == merges_.end()) return;
    const int id = it->second;
    const float s = scores_[static_cast<std::size_t>(id)];
    const float kFloor = -1e10f;  // run.c's initial best_score: only scores above it merge
    if (!(s > kFloor)) return;
    heap.push(MergeCand{s, l, r, list.stamp[l], list.stamp[r], id});
  }

  // Greedy merging of the best-scored adjacent pair (leftmost on ties), as run.c's loop, with a
  // max-heap of candidate pairs over a linked list; stale candidates are skipped lazily.
  void merge(std::vector<int>& tokens) const {
    const std::size_t n = tokens.size();
    if (n < 2) return;
    MergeList list(n);
    MergeHeap heap;
    for (std::size_t i = 0; i + 1 < n; ++i) push_merge(tokens, list, i, i + 1, heap);
    while (!heap.empty()) {
      const MergeCand c = heap.top();
      heap.pop();
      if (!list.is_current(c)) continue;
      list.join(c, tokens);
      push_merge(tokens, list, list.prev[c.left], c.left, heap);
      push_merge(tokens, list, c.left, list.next[c.left], heap);
    }
    list.compact(tokens);
  }

  std::vector<std::string> pieces_;   // as stored
  std::vector<std::string> cpieces_;  // up to the first NUL (C-string view, as run.c sees them)
  std::vector<float> scores_;
  std::unordered_map<std::string, int> index_;          // C-string piece -> lowest id
  std::vector<int> canon_;                              // id -> lowest id of the same C-string
  std::unordered_map<std::uint64_t, int> merges_;       // (canon left, canon right) -> merged piece
  int byte_token_[256] = {};
  std::vector<std::pair<std::string, int>> user_defined_;  // GGUF user-defined tokens, longest first
  int bos_id_ = 1;
  int eos_id_ = 2;
  int max_token_length_ = 0;
  bool add_dummy_prefix_ = true;
};

namespace detail {

/// @return true for the characters between token ids: ',', '[', ']' and whitespace
inline bool is_token_id_separator(char c) {
  return c == ',' || c == '[' || c == ']' || std::isspace(static_cast<unsigned char>(c));
}

/// An optionally signed decimal integer read by `scan_decimal`.
struct ScannedDecimal {
  long long value = 0;     ///< signed value; the magnitude saturates above 2^40 (far above any int)
  std::size_t digits = 0;  ///< digits read (0: no number)
};

/// Reads an optional '+'/'-' and the decimal digits that follow in `text` from byte `i`.
/// @param text the text
/// @param i the start; on return, the byte after the last character read
/// @return the value and the number of digits
inline ScannedDecimal scan_decimal(const std::string& text, std::size_t& i) {
  const std::size_t n = text.size();
  ScannedDecimal d;
  bool neg = false;
  if (text[i] == '-' || text[i] == '+') {
    neg = text[i] == '-';
    ++i;
  }
  while (i < n && text[i] >= '0' && text[i] <= '9') {
    if (d.value < (1LL << 40)) d.value = d.value * 10 + (text[i] - '0');  // saturates far above any int
    ++i;
    ++d.digits;
  }
  if (neg) d.value = -d.value;
  return d;
}

}  // namespace detail

/// Parses token ids separated by whitespace and/or commas (brackets '[' ']' are ignored, so a
/// JSON array works too).
/// @param text the ids, decimal
/// @param vocab_size every id must lie in [0, vocab_size)
/// @param source name for error messages
/// @return the ids in order (empty when the text holds none)
/// @throws Error on anything that is not a decimal integer or an id out of range
inline std::vector<int> parse_token_ids(const std::string& text, int vocab_size,
                                        const std::string& source = "<token ids>") {
  DEPTHKV_CHECK(vocab_size > 0, source << ": vocab_size must be positive, got " << vocab_size);
  std::vector<int> ids;
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    if (detail::is_token_id_separator(text[i])) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    const detail::ScannedDecimal d = detail::scan_decimal(text, i);
    DEPTHKV_CHECK(d.digits > 0 && (i == n || detail::is_token_id_separator(text[i])),
                  source << ": not a token id at byte " << start << ": '" << text.substr(start, 16) << "'");
    const long long v = d.value;
    DEPTHKV_CHECK(v >= 0 && v < vocab_size, source << ": token id " << text.substr(start, i - start)
                                                   << " at byte " << start << " is out of range [0, " << vocab_size
                                                   << ")");
    ids.push_back(static_cast<int>(v));
  }
  return ids;
}

/// Reads a file of pre-tokenized input: token ids separated by whitespace and/or commas (the
/// way to feed models whose vocabulary no tokenizer of depthkv handles).
/// @param path the file
/// @param vocab_size every id must lie in [0, vocab_size)
/// @return the ids
/// @throws Error when the file cannot be read or is a directory, or as `parse_token_ids`
inline std::vector<int> read_token_file(const std::string& path, int vocab_size) {
  return parse_token_ids(detail::read_whole_file(path, "token"), vocab_size, path);
}

}  // namespace llama
}  // namespace depthkv
