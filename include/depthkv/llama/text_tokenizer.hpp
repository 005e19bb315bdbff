#pragma once
/// @file llama/text_tokenizer.hpp
/// @brief The interface every text tokenizer of the engine offers (SentencePiece `Tokenizer`,
/// byte-level BPE `BpeTokenizer`), so that the text windows, the representation probe and the
/// command-line tools take either kind.
///
/// @code
/// const depthkv::llama::TextTokenizer& tok = ...;  // a Tokenizer or a BpeTokenizer
/// std::vector<int> ids = tok.encode("Once upon a time", /*bos=*/true, /*eos=*/false);
/// std::string text;
/// for (std::size_t i = 1; i < ids.size(); ++i) text += tok.decode(ids[i - 1], ids[i]);
/// @endcode

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace depthkv {
namespace llama {

/// Text <-> token ids, as one kind of vocabulary defines it.
class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  /// @return number of tokens
  virtual int vocab_size() const = 0;
  /// @return id of the beginning-of-sequence token (-1 when the vocabulary has none)
  virtual int bos_id() const = 0;
  /// @return id of the end-of-sequence token (-1 when the vocabulary has none)
  virtual int eos_id() const = 0;

  /// Encodes `text` (without any special-token parsing).
  /// @param text UTF-8 text
  /// @param bos prepend BOS
  /// @param eos append EOS
  /// @return token ids
  /// @throws Error as the implementation documents
  virtual std::vector<int> encode(const std::string& text, bool bos, bool eos) const = 0;

  /// The bytes of `token` when it follows `prev_token` (SentencePiece drops the space after BOS;
  /// byte-level BPE ignores `prev_token`).
  /// @param prev_token the previous token (any int)
  /// @param token the token to decode
  /// @return its bytes (possibly part of a UTF-8 character)
  /// @throws Error when `token` is out of range
  virtual std::string decode(int prev_token, int token) const = 0;

  /// What a generation loop prints for a decoded piece (llama2.c's safe_printf for
  /// SentencePiece; the bytes themselves for byte-level BPE).
  /// @param piece a result of `decode`
  /// @return the text to print
  virtual std::string printable(const std::string& piece) const = 0;

  /// @param token a token id
  /// @return whether sampling it ends a generation beyond BOS (always false for SentencePiece,
  ///   whose loop stops at BOS as llama2.c's; EOS and EOT for byte-level BPE)
  virtual bool ends_generation(int token) const = 0;

 protected:
  TextTokenizer() = default;
  TextTokenizer(const TextTokenizer&) = default;
  TextTokenizer& operator=(const TextTokenizer&) = default;
  TextTokenizer(TextTokenizer&&) = default;
  TextTokenizer& operator=(TextTokenizer&&) = default;
};

namespace detail {
/// 1: an ASCII digit; 2: an ASCII letter or a byte of a multi-byte UTF-8 character; 0: other.
inline int span_class(unsigned char c) {
  if (c >= '0' && c <= '9') return 1;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return 2;
  return 0;
}
}  // namespace detail

/// The span of every position of `ids` for span pooling (`ScorerConfig::span_pooling`,
/// `PolicyData::span_start`): position i continues the span of i - 1 when the bytes of token i
/// (`decode(ids[i - 1], ids[i])`) start with a digit and those of token i - 1 end with one (a digit
/// run: a number written one digit per token), or start with a letter and those of i - 1 end with
/// one (the pieces of one word); a space, punctuation or an empty piece starts a new span.
/// @return span_start[i]: the first position of i's span (span_start[0] = 0)
/// @throws Error from `decode` on an id outside the vocabulary
inline std::vector<std::int32_t> token_span_starts(const TextTokenizer& tok, const std::vector<int>& ids) {
  std::vector<std::int32_t> start(ids.size());
  std::string prev_piece;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string piece = tok.decode(i == 0 ? tok.bos_id() : ids[i - 1], ids[i]);
    const bool joins = i > 0 && !piece.empty() && !prev_piece.empty() &&
                       detail::span_class(static_cast<unsigned char>(piece.front())) != 0 &&
                       detail::span_class(static_cast<unsigned char>(piece.front())) ==
                           detail::span_class(static_cast<unsigned char>(prev_piece.back()));
    start[i] = joins ? start[i - 1] : static_cast<std::int32_t>(i);
    prev_piece = piece;
  }
  return start;
}

}  // namespace llama
}  // namespace depthkv
