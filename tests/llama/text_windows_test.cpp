// Tests of depthkv/llama/text_windows.hpp: the document split (the TinyStories opening rule, a
// literal separator, no splitting) and the token windows cut from the documents.

#include "depthkv/llama/text_windows.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"
#include "support/stories_data.hpp"

using namespace depthkv::llama;
using Docs = std::vector<std::string>;

namespace {

const std::string& tinystories() {
  static const std::string t = read_text_file(depthkv_test::data_path("text/tinystories_valid.txt"));
  return t;
}

/// FNV-1a over the ids of every window.
std::uint64_t hash_windows(const std::vector<std::vector<int>>& windows) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& w : windows)
    for (int id : w) {
      h ^= static_cast<std::uint32_t>(id);
      h *= 1099511628211ull;
    }
  return h;
}

}  // namespace

TEST_CASE("the default split is the TinyStories rule: stories and windows unchanged",
          "[text_windows][real]") {
  const std::string& text = tinystories();
  const Docs stories = split_documents(text);
  REQUIRE(stories == split_stories(text));
  REQUIRE(stories == split_documents(text, DocumentSplit::opening("Once upon a time")));
  REQUIRE(DocumentSplit().is_default());
  REQUIRE(DocumentSplit().rule == SplitRule::kOpening);
  // The stream and its 756 windows of 512 tokens, as computed before the split became an option
  // (split_stories + encode_stories + token_windows of the same file and tokenizer).
  const std::vector<int> ids = encode_stories(depthkv_test::stories_tok512(), stories);
  const auto windows = token_windows(ids, 512);
  CHECK(stories.size() == 714);
  CHECK(ids.size() == 387292);
  REQUIRE(windows.size() == 756);
  CHECK(hash_windows(windows) == 0xb7ca37add7cc27dcull);
}

TEST_CASE("the opening rule: paragraphs, text before the first opening, an empty opening", "[text_windows]") {
  const std::string t = "Preface.\n\nOnce upon a time A.\n\nMore A.\n\n\n\nOnce upon a time B.";
  CHECK(split_documents(t) == Docs{"Preface.", "Once upon a time A.\nMore A.", "Once upon a time B."});
  CHECK(split_documents(t, DocumentSplit::opening("More")) ==
        Docs{"Preface.\nOnce upon a time A.", "More A.\nOnce upon a time B."});
  // every paragraph a document
  CHECK(split_documents(t, DocumentSplit::opening("")) ==
        Docs{"Preface.", "Once upon a time A.", "More A.", "Once upon a time B."});
  // a text without the opening is one document (paragraphs joined with one newline), as before
  CHECK(split_documents("a\n\nb", DocumentSplit::opening("Chapter")) == Docs{"a\nb"});
  CHECK(split_documents("").empty());
}

TEST_CASE("a literal separator: pieces between separators, trimmed, empty ones dropped", "[text_windows]") {
  const DocumentSplit eot = DocumentSplit::separator("<|endoftext|>");
  REQUIRE(eot.rule == SplitRule::kSeparator);
  REQUIRE_FALSE(eot.is_default());
  CHECK(split_documents("One.\n<|endoftext|>\nTwo\n\nparagraphs.\n<|endoftext|>\n", eot) ==
        Docs{"One.", "Two\n\nparagraphs."});
  // separators at both ends, repeated, and pieces of whitespace only
  CHECK(split_documents("<|endoftext|>a<|endoftext|><|endoftext|> \t\r\n<|endoftext|>b c<|endoftext|>",
                        eot) == Docs{"a", "b c"});
  // inner whitespace and non-ASCII bytes stay; only ASCII whitespace around a piece is removed
  CHECK(split_documents("\xC2\xA0x  y\xC2\xA0<|endoftext|>z", eot) == Docs{"\xC2\xA0x  y\xC2\xA0", "z"});
  // a multi-line separator; overlapping occurrences are taken left to right
  CHECK(split_documents("a\n\n\nb\n\n\n\nc", DocumentSplit::separator("\n\n\n")) == Docs{"a", "b", "c"});
  CHECK(split_documents("xaaay", DocumentSplit::separator("aa")) == Docs{"x", "ay"});
  CHECK(split_documents("<|endoftext|>", eot).empty());
  CHECK(split_documents("", eot).empty());
}

TEST_CASE("a separator reproduces the stories it was joined from", "[text_windows][real]") {
  const Docs stories = split_stories(tinystories());
  std::string joined;
  for (const std::string& s : stories) joined += s + "\n<|endoftext|>\n";
  const Docs back = split_documents(joined, DocumentSplit::separator("<|endoftext|>"));
  REQUIRE(back == stories);
  CHECK(encode_stories(depthkv_test::stories_tok512(), back) == encode_stories(depthkv_test::stories_tok512(), stories));
}

TEST_CASE("a separator absent from the text, or empty, is an error", "[text_windows]") {
  const DocumentSplit eot = DocumentSplit::separator("<|endoftext|>");
  CHECK_THROWS_AS(split_documents("Once upon a time.\n\nThe end.", eot), depthkv::Error);
  CHECK_THROWS_WITH(split_documents("Once upon a time.", eot),
                    Catch::Contains("separator \"<|endoftext|>\"") && Catch::Contains("does not occur"));
  DocumentSplit empty;
  empty.rule = SplitRule::kSeparator;
  empty.marker.clear();
  CHECK_THROWS_WITH(split_documents("a", empty), Catch::Contains("separator is empty"));
}

TEST_CASE("no splitting: the whole text byte for byte, and an empty separator means no splitting",
          "[text_windows]") {
  REQUIRE(DocumentSplit::separator("") == DocumentSplit::whole());
  const std::string t = "\n Once upon a time.\n\nOnce upon a time.\n";
  CHECK(split_documents(t, DocumentSplit::whole()) == Docs{t});
  CHECK(split_documents("", DocumentSplit::whole()).empty());
  // one BOS for the whole text, and windows over all of it
  const std::vector<int> ids = encode_stories(depthkv_test::stories_tok512(), split_documents(t, DocumentSplit::whole()));
  CHECK(ids == depthkv_test::stories_tok512().encode(t, true, false));
}

TEST_CASE("describe names the rule and escapes the marker", "[text_windows]") {
  CHECK(DocumentSplit().describe() == "opening \"Once upon a time\"");
  CHECK(DocumentSplit::separator("<|endoftext|>").describe() == "separator \"<|endoftext|>\"");
  CHECK(DocumentSplit::separator("\n\t\r\\\"\x01").describe() == "separator \"\\n\\t\\r\\\\\\\"\\x01\"");
  CHECK(DocumentSplit::whole().describe() == "whole text");
  CHECK(DocumentSplit::whole().rule_name() == "whole");
  CHECK(DocumentSplit::opening("x") != DocumentSplit::separator("x"));
}

TEST_CASE("read_text_file: whole files, and a directory or a missing file is an error naming it", "[text_windows]") {
  using depthkv::llama::read_text_file;
  depthkv_test::TempDir dir;
  std::string text(200000, 'x');  // more than one read
  text += "\nend";
  const std::string p = dir.write("t.txt", std::vector<std::uint8_t>(text.begin(), text.end()));
  CHECK(read_text_file(p) == text);
  CHECK(read_text_file(dir.write("empty.txt", {})).empty());
  CHECK_THROWS_WITH(read_text_file(dir.path()), Catch::Contains("'" + dir.path() + "' is a directory, not a text file"));
  CHECK_THROWS_WITH(read_text_file(dir.file("missing.txt")), Catch::Contains("cannot open text file"));
}
