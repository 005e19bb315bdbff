// The tokenizers on the real models of scripts/get-models.sh against golden ids of llama.cpp (the
// reference): SmolLM2-135M-Instruct (byte-level BPE, pre-tokenizer `smollm`) and Gemma 3 270M
// (SentencePiece with 165 user-defined tokens).
//
// Golden ids: measured with llama.cpp through llama-cpp-python 0.3.36 (its vendored llama.cpp,
// built from the sdist), `Llama(model_path, vocab_only=True).tokenize(text, add_bos=..., special=...)`,
// by scripts/tokenizer_parity.py --golden-out; the full comparison (with Hugging Face's tokenizer)
// is in docs/results/real_models/smollm2_tokenizer.md and gemma3_tokenizer.md.
// The model files are found by tests/support/model_data.hpp ($DEPTHKV_MODEL_DIR, else
// ~/.cache/depthkv/models); a missing file fails these tests (run scripts/get-models.sh).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "depthkv/llama/bpe_tokenizer.hpp"
#include "depthkv/llama/gguf.hpp"
#include "depthkv/llama/tokenizer.hpp"
#include "support/model_data.hpp"

namespace {

// A text, whether control-token text is parsed (BpeTokenizer's parse_special), and llama.cpp's
// ids for it (no BOS).
struct GoldenCase {
  std::string text;
  bool special;
  std::vector<int> ids;
};

const depthkv::llama::BpeTokenizer& smollm2_tokenizer() {
  static const depthkv::llama::BpeTokenizer tok(
      depthkv::llama::load_gguf_vocabulary(depthkv_test::model_path("SmolLM2-135M-Instruct.Q4_1.gguf")));
  return tok;
}

const depthkv::llama::Tokenizer& gemma3_tokenizer() {
  static const depthkv::llama::Tokenizer tok(
      depthkv::llama::load_gguf_vocabulary(depthkv_test::model_path("gemma-3-270m-q4_k_m.gguf")));
  return tok;
}

}  // namespace

TEST_CASE("real vocab: SmolLM2 (smollm) encodes as llama.cpp: number symbols, digits, whitespace, Unicode",
          "[llama][tokenizer][real-model]") {
  const depthkv::llama::BpeTokenizer& tok = smollm2_tokenizer();
  CHECK(tok.pre_tokenizer().name() == "smollm");
  const std::vector<GoldenCase> cases = {
      // Ⅻ ① ½: "Ⅻ ① ½"
      {"\xE2\x85\xAB \xE2\x91\xA0 \xC2\xBD", false, {173, 223, 121, 216, 173, 235, 250, 216, 16738}},
      // fractions: "¼ ¾ ⅓ ⅞ of it"
      {"\xC2\xBC \xC2\xBE \xE2\x85\x93 \xE2\x85\x9E of it",
       false,
       {28151, 216, 43124, 216, 173, 223, 237, 216, 173, 223, 248, 282, 357}},
      // Roman numerals: "Ⅰ Ⅱ Ⅲ ⅳ Chapter Ⅻ"
      {"\xE2\x85\xA0 \xE2\x85\xA1 \xE2\x85\xA2 \xE2\x85\xB3 Chapter \xE2\x85\xAB",
       false,
       {173, 223, 250, 216, 173, 223, 111, 216, 173, 223, 112, 216, 173, 223, 128, 4281, 216, 173, 223, 121}},
      // circled: "①②③ ⑩ ⑳"
      {"\xE2\x91\xA0\xE2\x91\xA1\xE2\x91\xA2 \xE2\x91\xA9 \xE2\x91\xB3",
       false,
       {173, 235, 250, 173, 235, 111, 173, 235, 112, 216, 173, 235, 119, 216, 173, 235, 128}},
      // superscripts: "x² + y³ = z¹⁰"
      {"x\xC2\xB2 + y\xC2\xB3 = z\xC2\xB9\xE2\x81\xB0",
       false,
       {104, 19133, 1232, 329, 39050, 446, 1892, 43183, 32571, 125}},
      // other digits: "٣٤٥ १२३ １２３ 〇"
      {"\xD9\xA3\xD9\xA4\xD9\xA5 \xE0\xA5\xA7\xE0\xA5\xA8\xE0\xA5\xA9 \xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93 "
       "\xE3\x80\x87",
       false,
       {164, 113, 164,  114, 164,  115, 216,  9310, 117, 9310,  118, 9310,
        119, 216, 8083, 235, 8083, 236, 8083, 237,  216, 12109, 225}},
      // letters + numbers: "Ⅻth ½cup x²y"
      {"\xE2\x85\xABth \xC2\xBD"
       "cup x\xC2\xB2y",
       false,
       {173, 223, 121, 373, 216, 16738, 28627, 1792, 19133, 105}},
      // 1234567: "1234567"
      {"1234567", false, {33, 34, 35, 36, 37, 38, 39}},
      // 3.14159: "3.14159"
      {"3.14159", false, {35, 30, 33, 36, 33, 37, 41}},
      // 1,000,000: "1,000,000"
      {"1,000,000", false, {33, 28, 32, 32, 32, 28, 32, 32, 32}},
      // space + number: "pay 42 or 1000 dollars"
      {"pay 42 or 1000 dollars", false, {9480, 216, 36, 34, 355, 216, 33, 32, 32, 32, 8358}},
      // mixed: "x \t \n  \n\t y"
      {"x \t \n  \n\t y", false, {104, 216, 197, 3717, 256, 3354, 329}},
      // trailing spaces: "end   "
      {"end   ", false, {486, 333}},
      // NBSP, NEL, ideographic: "a bc　d e"
      {"a\xC2\xA0"
       "b\xC2\x85"
       "c\xE3\x80\x80"
       "d\xE2\x80\x89"
       "e",
       false,
       {81, 15442, 82, 141, 223, 83, 12109, 218, 84, 321, 227, 85}},
      // indented code: "def f():\n    if x:\n        return 1\n"
      {"def f():\n    if x:\n        return 1\n",
       false,
       {1604, 275, 3734, 472, 585, 1792, 42, 448, 1003, 216, 33, 198}},
      // long runs: "a", 40 spaces, "b", 40 newlines, "c", 35 tabs, "d"
      {"a                                        "
       "b\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nc\t\t\t\t\t\t\t\t\t"
       "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\td",
       false,
       {81,    12427, 415, 278, 22342, 22342, 22342, 22342, 22342, 22342, 22342, 22342,
        22342, 16506, 198, 83,  13591, 13591, 13591, 13591, 1656,  197,   84}},
      // control characters: "a\u0004b\u001dc\u0013de"
      {"a\x04"
       "b\x1D"
       "c\x13"
       "d\x7F"
       "e",
       false,
       {81, 82, 83, 84, 217, 85}},
      // planes 1-2 (F0, F1, F2 leads): "x😀񀀀򀀁y"
      {"x\xF0\x9F\x98\x80\xF1\x80\x80\x80\xF2\x80\x80\x81y",
       false,
       {104, 10813, 242, 218, 218, 218, 218, 218, 218, 219, 105}},
      // accents: "café naïve résumé Ångström façade"
      {"caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m fa\xC3\xA7"
       "ade",
       false,
       {83, 1939, 2756, 15486, 46494, 412, 2756, 5422, 2756, 5549, 223, 863, 1321, 45682, 40852}},
      // combining marks: "café ä ñ Z̤͔ͧä͖"
      {"cafe\xCC\x81 a\xCC\x88 n\xCC\x83 Z\xCC\xA4\xCD\x94\xCD\xA7"
       "a\xCC\x88\xCD\x96",
       false,
       {83,  9980, 151, 219, 253, 151, 226, 304, 151, 221, 1777,
        151, 114,  152, 238, 152, 117, 81,  151, 226, 152, 240}},
      // CJK: "你好，世界。日本語のテキストです。"
      {"\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8"
       "\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x81\xA7\xE3\x81\x99\xE3\x80"
       "\x82",
       false,
       {18645, 250, 48392, 138,   12831, 7906,  240, 178,   239, 230,   19076, 23274, 115, 40993, 179,
        120,   248, 26453, 11100, 224,   10391, 251, 10391, 134, 11100, 226,   7365,  117, 39958, 19076}},
      // ZWJ sequences: "👨‍👩‍👧‍👦 🏳️‍🌈 👩🏽‍💻"
      {"\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7\xE2\x80\x8D\xF0\x9F\x91\xA6 "
       "\xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88 "
       "\xF0\x9F\x91\xA9\xF0\x9F\x8F\xBD\xE2\x80\x8D\xF0\x9F\x92\xBB",
       false,
       {10813, 235,   118,   321, 231,   10813, 235, 119, 321,   231,   10813, 235,   117,
        321,   231,   10813, 235, 116,   15107, 233, 128, 31752, 321,   231,   10813, 230,
        226,   15107, 235,   119, 10813, 233,   138, 321, 231,   10813, 236,   136}},
      // upper case: "IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D"
      {"IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D", false, {2901,  23,   67,    422,   2154,  23,  68, 12246,
                                                         23,    3256, 26587, 23,    18525, 339, 23, 61,
                                                         26587, 23,   16421, 18209, 23,    52}},
      // I'M: "I'M"
      {"I'M", false, {57, 23, 61}},
      // mixed case: "It'S dOn'T yOu'Re"
      {"It'S dOn'T yOu'Re", false, {1589, 23, 67, 287, 3280, 23, 68, 329, 63, 101, 23, 3733}},
      // curly apostrophe: "it’s don’t"
      {"it\xE2\x80\x99s don\xE2\x80\x99t", false, {269, 417, 99, 1326, 417, 100}},
      // chat text, --special:
      // "<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn><|endoftext|>"
      {"<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn><|endoftext|>",
       true,
       {1,  4093, 198, 26843, 2,  198, 44, 3738, 79, 1714,  79, 20589,
        46, 3980, 198, 26843, 44, 486, 79, 1714, 79, 20589, 46, 0}},
      // chat text, plain:
      // "<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn><|endoftext|>"
      {"<|im_start|>user\nHi<|im_end|>\n<start_of_turn>model\nHi<end_of_turn><|endoftext|>",
       false,
       {44,  108, 306, 79,   3738, 108,   46,    4093, 198, 26843, 44,   108,  306, 79,
        486, 108, 46,  198,  44,   3738,  79,    1714, 79,  20589, 46,   3980, 198, 26843,
        44,  486, 79,  1714, 79,   20589, 21198, 108,  486, 1714,  2692, 108,  46}},
  };
  for (const GoldenCase& c : cases) {
    INFO("text: " << c.text << " (special: " << c.special << ")");
    CHECK(tok.encode(c.text, false, false, c.special) == c.ids);
  }
  // Unicode numbers (Nd, Nl, No) are pieces of their own, as llama.cpp's `\p{N}` split (Hugging
  // Face's tokenizer built from the GGUF file lacks that split and merges " ½" into 3351, 138).
  CHECK(tok.encode(" \xC2\xBD", false, false) == std::vector<int>{216, 16738});
  // The vocabulary asks for no BOS (add_bos_token false): "Hello world" is 19556, 905.
  CHECK_FALSE(tok.add_bos());
  CHECK(tok.encode("Hello world", tok.add_bos(), false) == std::vector<int>{19556, 905});
}

TEST_CASE("real vocab: SmolLM2 drops a byte that has no token, as llama.cpp, instead of failing",
          "[llama][tokenizer][real-model]") {
  const depthkv::llama::BpeTokenizer& tok = smollm2_tokenizer();
  // SmolLM2 has no token for the GPT-2 characters of bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D,
  // 0xC0, 0xC1, 0xF1, 0xF2, 0xF5..0xFF; llama.cpp leaves such a byte out (golden ids).
  CHECK(tok.encode("a\x04"
                   "b",
                   false, false) == std::vector<int>{81, 82});
  CHECK(tok.encode("a \x04\x04 b", false, false) == std::vector<int>{81, 216, 278});
  CHECK(tok.encode("\x04", false, false).empty());
  CHECK(tok.encode("x\xF1\x80\x80\x80y", false, false) == std::vector<int>{104, 218, 218, 218, 105});
  // the bytes that do have tokens still decode back
  CHECK(tok.decode(tok.encode("a\x04"
                              "b\x1D",
                              false, false)) == "ab");
}

TEST_CASE("real vocab: Gemma 3 encodes as llama.cpp: user-defined whitespace runs and tags, Unicode",
          "[llama][tokenizer][real-model]") {
  const depthkv::llama::Tokenizer& tok = gemma3_tokenizer();
  CHECK(tok.user_defined_count() == 165);
  const std::vector<GoldenCase> cases = {
      // two spaces: "a  b"
      {"a  b", false, {236746, 138, 236763}},
      // eight spaces: "a        b"
      {"a        b", false, {236746, 144, 236763}},
      // leading spaces: "   lead"
      {"   lead", false, {139, 40227}},
      // indented code: "def f():\n    if x:\n        return 1\n"
      {"def f():\n    if x:\n        return 1\n",
       false,
       {2063, 517, 6141, 107, 140, 584, 1123, 236787, 107, 144, 2060, 236743, 236770, 107}},
      // long runs: "a", 40 spaces, "b", 40 newlines, "c", 35 tabs, "d"
      {"a                                        "
       "b\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nc\t\t\t\t\t\t\t\t\t"
       "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\td",
       false,
       {236746, 167, 145, 236763, 137, 115, 236755, 255998, 255971, 236753}},
      // newlines: "a\nb\n\nc\n\n\nd"
      {"a\nb\n\nc\n\n\nd", false, {236746, 107, 236763, 108, 236755, 109, 236753}},
      // tabs: "a\tb\t\tc"
      {"a\tb\t\tc", false, {236746, 255968, 236763, 255969, 236755}},
      // CRLF: "line one\r\nline two\r\n"
      {"line one\r\nline two\r\n", false, {1257, 886, 251, 107, 1257, 1156, 251, 107}},
      // HTML: "<div><p>Hi</p><br></div>\n<table><tr><td>1</td></tr></table>"
      {"<div><p>Hi</p><br></div>\n<table><tr><td>1</td></tr></table>",
       false,
       {224, 236820, 236758, 236813, 10979, 954, 236758, 1798, 1457, 236813, 235, 107, 168, 173, 175, 236770,
        183, 181, 176}},
      // C: "if (a!=b&&c<=d) { x += y->z[0]; }"
      {"if (a!=b&&c<=d) { x += y->z[0]; }", false, {584,   568,    236746, 20181,  236763, 18753, 236755,
                                                    22159, 236753, 236768, 642,    1123,   3323,  570,
                                                    1160,  236802, 236840, 236771, 2312,   682}},
      // Ⅻ ① ½: "Ⅻ ① ½"
      {"\xE2\x85\xAB \xE2\x91\xA0 \xC2\xBD", false, {464, 371, 409, 85761, 47041}},
      // accents: "café naïve résumé Ångström façade"
      {"caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xC3\x85ngstr\xC3\xB6m fa\xC3\xA7"
       "ade",
       false,
       {123125, 236859, 120362, 118515, 44667, 829, 80406, 96008}},
      // CJK: "你好，世界。日本語のテキストです。"
      {"\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8"
       "\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x81\xA7\xE3\x81\x99\xE3\x80"
       "\x82",
       false,
       {144626, 236900, 12811, 236924, 94951, 236945, 95830, 3652, 236924}},
      // emoji: "I ❤️ 🍕🎉 👍🏽!"
      {"I \xE2\x9D\xA4\xEF\xB8\x8F \xF0\x9F\x8D\x95\xF0\x9F\x8E\x89 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD!",
       false,
       {236777, 64813, 236743, 245414, 242061, 103712, 242713, 236888}},
      // upper case: "IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D"
      {"IT'S DON'T YOU'RE WE'VE I'M WE'LL HE'D",
       false,
       {1768,  236789, 236773, 52402,  236789, 236774, 19786, 236789, 1357,   19716, 236789,
        11818, 564,    236789, 236792, 19716,  236789, 2182,  13962,  236789, 236796}},
      // NBSP, NEL, ideographic: "a bc　d e"
      {"a\xC2\xA0"
       "b\xC2\x85"
       "c\xE3\x80\x80"
       "d\xE2\x80\x89"
       "e",
       false,
       {236746, 432, 398, 236763, 432, 371, 236755, 465, 366, 366, 236753, 464, 366, 375, 236744}},
  };
  for (const GoldenCase& c : cases) {
    INFO("text: " << c.text);
    CHECK(tok.encode(c.text, false, false) == c.ids);
  }
  // BOS as the vocabulary asks (add_bos_token true): <bos> = 2, then "Hello world".
  CHECK(tok.encode("Hello world", true, false) == std::vector<int>{2, 9259, 1902});
  CHECK(tok.encode("", false, false).empty());
}
