#pragma once
/// @file llama/text_windows.hpp
/// @brief Turning a corpus (such as `text/tinystories_valid.txt`) into fixed-length token windows
/// for perplexity, profiling and evaluation.
///
/// ## The splitting rule
/// 1. The text is cut into documents by a DocumentSplit (default: the TinyStories rule):
///    - SplitRule::kOpening (the default, opening `"Once upon a time"`): the text is split into
///      paragraphs at blank lines (`"\n\n"`); empty paragraphs are dropped. A paragraph that
///      starts with the opening starts a new document; every other paragraph continues the
///      current one (text before the first opening is a document of its own, so a text without
///      the opening is one document). The paragraphs of a document are joined with a single
///      `"\n"`. An empty opening makes every paragraph a document.
///    - SplitRule::kSeparator: the documents are the pieces between occurrences of a literal,
///      non-empty separator (e.g. `"<|endoftext|>"`), each with its leading and trailing ASCII
///      whitespace removed; empty pieces are dropped; the separator is not part of any document.
///      A separator that does not occur in a non-empty text is an error (a mistyped separator
///      would otherwise silently make the whole text one document).
///    - SplitRule::kWhole: no splitting; the whole text, byte for byte, is one document (an empty
///      text has none).
/// 2. Each document is encoded with BOS before it (`encode(doc, bos=true, eos=false)`, as
///    llama2.c does, with its dummy-prefix space), and the documents' tokens are concatenated.
/// 3. The stream is cut into consecutive non-overlapping windows of `window` tokens; the last,
///    incomplete window is dropped. Windows ignore document boundaries (a window may start inside
///    a document; BOS tokens inside a window stay).
/// With stories260K this gives a full-cache mean NLL of about 1.25 nats on the first 64 windows
/// of 512 tokens (an independent implementation reports about 1.26), 1.51 over all windows.
///
/// @code
/// depthkv::llama::Tokenizer tok("tok512.bin");
/// auto stories = depthkv::llama::split_documents(text);                // TinyStories rule
/// // other corpora: split_documents(text, DocumentSplit::separator("<|endoftext|>"))
/// //                split_documents(text, DocumentSplit::whole())
/// auto ids = depthkv::llama::encode_stories(tok, stories);
/// auto windows = depthkv::llama::token_windows(ids, 512);           // [n][512]
/// auto evalw = depthkv::llama::split_windows(windows, /*context=*/384);   // context + continuation
/// @endcode

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/detail/mapped_file.hpp"
#include "depthkv/llama/text_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"

namespace depthkv {
namespace llama {

/// Reads a whole file (`detail::read_whole_file`).
/// @throws Error when it cannot be opened or read, or is a directory
inline std::string read_text_file(const std::string& path) { return detail::read_whole_file(path, "text"); }

/// Splits a corpus into stories by the opening rule (SplitRule::kOpening of the file comment).
/// @param text the corpus
/// @param opening paragraph prefix that starts a story ("": every paragraph is a story)
/// @return the stories, paragraphs joined with "\n"
inline std::vector<std::string> split_stories(const std::string& text, const std::string& opening = "Once upon a time") {
  std::vector<std::string> stories;
  std::size_t p = 0;
  while (p < text.size()) {
    std::size_t q = text.find("\n\n", p);
    if (q == std::string::npos) q = text.size();
    const std::string para = text.substr(p, q - p);
    p = q + 2;
    if (para.empty()) continue;
    if (stories.empty() || para.compare(0, opening.size(), opening) == 0)
      stories.push_back(para);
    else
      stories.back() += "\n" + para;
  }
  return stories;
}

/// How split_documents cuts a corpus into documents (rule 1 of the file comment).
enum class SplitRule {
  kOpening,    ///< a paragraph starting with the marker starts a document
  kSeparator,  ///< documents are the pieces between occurrences of the marker
  kWhole,      ///< the whole text is one document
};

/// A document split: a rule and its marker (the opening or the separator).
///
/// @code
/// DocumentSplit a;                                        // TinyStories: opening "Once upon a time"
/// auto b = DocumentSplit::separator("<|endoftext|>");     // pieces between separators
/// auto c = DocumentSplit::separator("");                  // == DocumentSplit::whole()
/// @endcode
struct DocumentSplit {
  SplitRule rule = SplitRule::kOpening;
  std::string marker = "Once upon a time";  ///< the opening (kOpening) or the separator (kSeparator)

  /// Paragraphs starting with `prefix` start a document ("": every paragraph is one).
  static DocumentSplit opening(std::string prefix) { return {SplitRule::kOpening, std::move(prefix)}; }
  /// Documents between occurrences of `sep`; an empty `sep` means no splitting (whole()).
  static DocumentSplit separator(std::string sep) {
    if (sep.empty()) return whole();
    return {SplitRule::kSeparator, std::move(sep)};
  }
  /// The whole text is one document.
  static DocumentSplit whole() { return {SplitRule::kWhole, std::string()}; }

  /// @return true for the default (the TinyStories rule)
  bool is_default() const { return *this == DocumentSplit(); }
  /// @return "opening", "separator" or "whole"
  std::string rule_name() const {
    switch (rule) {
      case SplitRule::kOpening: return "opening";
      case SplitRule::kSeparator: return "separator";
      case SplitRule::kWhole: return "whole";
    }
    return "?";
  }
  /// @return e.g. `opening "Once upon a time"`, `separator "<|endoftext|>"`, `whole text`
  /// (control characters of the marker written as \n, \r, \t or \xHH)
  std::string describe() const {
    if (rule == SplitRule::kWhole) return "whole text";
    std::string m;
    for (unsigned char ch : marker) {
      if (ch == '\n') m += "\\n";
      else if (ch == '\r') m += "\\r";
      else if (ch == '\t') m += "\\t";
      else if (ch == '\\') m += "\\\\";
      else if (ch == '"') m += "\\\"";
      else if (ch < 0x20 || ch == 0x7F) {
        const char* hex = "0123456789abcdef";
        m += "\\x";
        m += hex[ch >> 4];
        m += hex[ch & 15];
      } else {
        m += static_cast<char>(ch);
      }
    }
    return rule_name() + " \"" + m + "\"";
  }
  bool operator==(const DocumentSplit& o) const { return rule == o.rule && marker == o.marker; }
  bool operator!=(const DocumentSplit& o) const { return !(*this == o); }
};

namespace detail {

/// The pieces of `text` between occurrences of `sep` (not empty), each with leading and trailing
/// ASCII whitespace (" \t\n\r\v\f") removed; pieces left empty are dropped.
/// @param text the corpus
/// @param sep the separator (not empty)
/// @return the pieces, in text order
inline std::vector<std::string> split_trimmed(const std::string& text, const std::string& sep) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  std::vector<std::string> docs;
  std::size_t p = 0;
  while (p <= text.size()) {
    std::size_t q = text.find(sep, p);
    if (q == std::string::npos) q = text.size();
    std::size_t b = p, e = q;
    while (b < e && space(text[b])) ++b;
    while (e > b && space(text[e - 1])) --e;
    if (e > b) docs.push_back(text.substr(b, e - b));
    p = q + sep.size();
  }
  return docs;
}

}  // namespace detail

/// Splits a corpus into documents (rule 1 of the file comment).
/// @param text the corpus
/// @param split the rule (default: the TinyStories opening rule, which is split_stories(text))
/// @return the documents, in text order
/// @throws Error when a separator is empty or does not occur in a non-empty text
inline std::vector<std::string> split_documents(const std::string& text, const DocumentSplit& split = {}) {
  if (split.rule == SplitRule::kOpening) return split_stories(text, split.marker);
  if (split.rule == SplitRule::kWhole) {
    if (text.empty()) return {};
    return {text};
  }
  const std::string& sep = split.marker;
  DEPTHKV_CHECK(!sep.empty(), "document separator is empty (use DocumentSplit::whole() for no splitting)");
  DEPTHKV_CHECK(text.empty() || text.find(sep) != std::string::npos,
                "document " << split.describe() << " does not occur in the text (" << text.size()
                            << " bytes); give the separator that is in the text, or no splitting");
  return detail::split_trimmed(text, sep);
}

/// Encodes every story (document) with BOS before it and concatenates the tokens (rule 2).
/// @throws Error from the tokenizer
inline std::vector<int> encode_stories(const TextTokenizer& tok, const std::vector<std::string>& stories) {
  std::vector<int> ids;
  for (const std::string& s : stories) {
    const std::vector<int> e = tok.encode(s, /*bos=*/true, /*eos=*/false);
    ids.insert(ids.end(), e.begin(), e.end());
  }
  return ids;
}

/// Consecutive non-overlapping windows of `window` tokens (rule 3).
/// @param skip windows to skip at the start
/// @param max_windows at most this many windows (-1: all)
/// @throws Error when window < 2
inline std::vector<std::vector<int>> token_windows(const std::vector<int>& ids, int window, int skip = 0,
                                                   int max_windows = -1) {
  DEPTHKV_CHECK(window >= 2, "window must be >= 2 tokens, got " << window);
  DEPTHKV_CHECK(skip >= 0, "skip must be >= 0, got " << skip);
  std::vector<std::vector<int>> out;
  const std::size_t n = ids.size() / static_cast<std::size_t>(window);
  for (std::size_t w = static_cast<std::size_t>(skip); w < n; ++w) {
    if (max_windows >= 0 && static_cast<int>(out.size()) >= max_windows) break;
    out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(w * window),
                     ids.begin() + static_cast<std::ptrdiff_t>((w + 1) * window));
  }
  return out;
}

/// A context and the continuation teacher-forced after it (positions continue from the context).
struct EvalWindow {
  std::vector<int> context;       ///< >= 1 token
  std::vector<int> continuation;  ///< >= 1 token
};

/// Splits each window into its first `context` tokens and the rest (the continuation).
/// @throws Error when a window is not longer than `context` or context < 1
inline std::vector<EvalWindow> split_windows(const std::vector<std::vector<int>>& windows, int context) {
  DEPTHKV_CHECK(context >= 1, "context must be >= 1 token, got " << context);
  std::vector<EvalWindow> out;
  for (std::size_t w = 0; w < windows.size(); ++w) {
    DEPTHKV_CHECK(static_cast<int>(windows[w].size()) > context,
                  "window " << w << " has " << windows[w].size() << " tokens, not more than the context " << context);
    out.push_back({std::vector<int>(windows[w].begin(), windows[w].begin() + context),
                   std::vector<int>(windows[w].begin() + context, windows[w].end())});
  }
  return out;
}

}  // namespace llama
}  // namespace depthkv
