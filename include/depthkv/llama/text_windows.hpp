#pragma once
/// @file llama/text_windows.hpp
/// @brief Turning a story corpus (such as `text/tinystories_valid.txt`) into fixed-length token
/// windows for perplexity, profiling and evaluation.
///
/// ## The splitting rule
/// 1. The text is split into paragraphs at blank lines (`"\n\n"`); empty paragraphs are dropped.
/// 2. A paragraph that starts with the opening (default `"Once upon a time"`) starts a new
///    story; every other paragraph continues the current story (text before the first opening is
///    a story of its own). The paragraphs of a story are joined with a single `"\n"`.
/// 3. Each story is encoded with BOS before it (`encode(story, bos=true, eos=false)`, as
///    llama2.c does, with its dummy-prefix space), and the stories' tokens are concatenated.
/// 4. The stream is cut into consecutive non-overlapping windows of `window` tokens; the last,
///    incomplete window is dropped. Windows ignore story boundaries (a window may start inside a
///    story; BOS tokens inside a window stay).
/// With stories260K this gives a full-cache mean NLL of about 1.25 nats on the first 64 windows
/// of 512 tokens (an independent implementation reports about 1.26), 1.51 over all windows.
///
/// @code
/// depthkv::llama::Tokenizer tok("tok512.bin");
/// auto stories = depthkv::llama::split_stories(text);
/// auto ids = depthkv::llama::encode_stories(tok, stories);
/// auto windows = depthkv::llama::token_windows(ids, 512);           // [n][512]
/// auto evalw = depthkv::llama::split_windows(windows, /*context=*/384);   // context + continuation
/// @endcode

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/text_tokenizer.hpp"
#include "depthkv/llama/tokenizer.hpp"

namespace depthkv {
namespace llama {

/// Reads a whole file.
/// @throws Error when it cannot be read
inline std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DEPTHKV_CHECK(f.good(), "cannot open text file '" << path << "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Splits a corpus into stories (rules 1 and 2 of the file comment).
/// @param text the corpus
/// @param opening paragraph prefix that starts a story
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

/// Encodes every story with BOS before it and concatenates the tokens (rule 3).
/// @throws Error from the tokenizer
inline std::vector<int> encode_stories(const TextTokenizer& tok, const std::vector<std::string>& stories) {
  std::vector<int> ids;
  for (const std::string& s : stories) {
    const std::vector<int> e = tok.encode(s, /*bos=*/true, /*eos=*/false);
    ids.insert(ids.end(), e.begin(), e.end());
  }
  return ids;
}

/// Consecutive non-overlapping windows of `window` tokens (rule 4).
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
