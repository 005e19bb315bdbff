#pragma once
/// @file llama/detail/token_partition.hpp
/// @brief Cutting a text at literal tokens before it is encoded (llama.cpp's
/// `tokenizer_st_partition`): each token in turn, over the text fragments left by the ones
/// before it, every occurrence becoming a fragment of its own. The byte-level BPE tokenizer cuts
/// at its special and user-defined tokens, the SentencePiece tokenizer at its user-defined ones.

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace depthkv {
namespace llama {
namespace detail {

/// A piece of a text: bytes [offset, offset + length), either text to encode (`token` -1) or one
/// occurrence of the token `token`.
struct TextFragment {
  std::size_t offset, length;
  int token;  ///< >= 0: the token's id; -1: text
};

/// Cuts `text` at every occurrence of each (piece, id) of `tokens`, in their order (a piece
/// earlier in the list wins where two overlap; llama.cpp lists the longest first), into `frags`
/// (cleared first; empty for an empty text). Empty pieces must not be given.
inline void partition_at_tokens(const std::string& text, const std::vector<std::pair<std::string_view, int>>& tokens,
                                std::vector<TextFragment>& frags) {
  frags.clear();
  if (text.empty()) return;
  frags.push_back({0, text.size(), -1});
  std::vector<TextFragment> next;
  const std::string_view all(text);
  for (const auto& tok : tokens) {
    const std::string_view sp = tok.first;
    if (all.find(sp) == std::string_view::npos) continue;
    next.clear();
    for (const TextFragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view view = all.substr(f.offset, f.length);
      std::size_t pos = 0;
      while (true) {
        const std::size_t hit = view.find(sp, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({f.offset + pos, hit - pos, -1});
        next.push_back({f.offset + hit, sp.size(), tok.second});
        pos = hit + sp.size();
      }
      if (pos < f.length) next.push_back({f.offset + pos, f.length - pos, -1});
    }
    frags.swap(next);
  }
}

}  // namespace detail
}  // namespace llama
}  // namespace depthkv
