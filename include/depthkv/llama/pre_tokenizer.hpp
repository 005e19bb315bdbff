#pragma once
/// @file llama/pre_tokenizer.hpp
/// @brief The pre-tokenizers of byte-level BPE vocabularies, chosen by the GGUF key
/// `tokenizer.ggml.pre` as llama.cpp chooses them: each splits text into the pieces that BPE
/// then merges inside. Needs the `depthkv::llama` CMake target (PCRE2).
///
/// A pre-tokenizer is a list of regular expressions (PCRE2, UTF + UCP mode, so `\p{L}`, `\p{N}`,
/// `\s` follow Unicode), applied one after the other as Hugging Face's `Split(Isolated)`
/// pre-tokenizers and llama.cpp's `unicode_regex_split` apply them: every piece so far is
/// searched on its own (anchors and lookarounds see only the piece), and both the matches and
/// the text between them become the next pieces. `\s` and `\S` mean Unicode's White_Space
/// property and its complement, as in the models' own regex engines. The split rules are those of the models'
/// `tokenizer.json` (llama.cpp writes some with explicit case classes such as `'[sS]` instead of
/// `(?i:'s)`, which is used here too). Invalid UTF-8 is allowed: no pattern item matches an
/// invalid byte, so such bytes end up in the pieces between matches, byte for byte.
///
/// Known names (`PreTokenizer::names()`): `llama-bpe` (Llama 3.x; also `llama3`, `llama-v3`,
/// `falcon3`, `pixtral`, ...), `qwen2` (Qwen 2 / 2.5 / 3; also `deepseek-r1-qwen`, `stablelm2`,
/// `megrez`), `qwen35` (Qwen 3.5), `gpt-2` (also `phi-2`, `mpt`, `olmo`, `jais`),
/// `deepseek-llm`, `deepseek-coder`, `smollm` (also `starcoder`, `refact`, `command-r`,
/// `codeshell`, `exaone`, `minerva-7b`), `tekken`, `dbrx`, `smaug-bpe`, `default`.
///
/// @code
/// depthkv::llama::PreTokenizer pre("llama-bpe");
/// std::vector<depthkv::llama::PreTokenizer::Span> pieces;
/// pre.split("Hello world 123", pieces);  // "Hello", " world", " ", "123"
/// @endcode

#include <cstddef>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/detail/pcre2_regex.hpp"

namespace depthkv {
namespace llama {

namespace detail {

/// A pre-tokenizer's definition: its split rules and what llama.cpp sets for it.
struct PreTokenizerSpec {
  std::vector<std::string> patterns;  ///< applied in order
  bool ignore_merges = false;         ///< a piece that is a whole token is taken as it is (no merging)
  bool add_bos = false;               ///< BOS is added when the file has no `add_bos_token`
};

// English contractions, case-insensitive as (?i:'s|'t|'re|'ve|'m|'ll|'d).
#define DEPTHKV_PRE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
// GPT-2's rule (llama.cpp's list; the text between matches becomes pieces anyway).
#define DEPTHKV_PRE_GPT2 R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re"
// CJK ideographs, part of the pre-unified range and Hangul, as DeepSeek's tokenizer.json.
#define DEPTHKV_PRE_DEEPSEEK_CJK R"re([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re"

/// The split rules of the "deepseek-llm" pre-tokenizer, in order.
inline std::vector<std::string> deepseek_llm_patterns() {
  return {
      R"re([\r\n])re",
      // the cased letters of DeepSeek's tokenizer.json, as code points
      R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})re"
      R"re(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})re"
      R"re(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})re"
      R"re(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})re"
      R"re(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})re"
      R"re(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})re"
      R"re(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
      R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})re"
      R"re(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
      R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})re"
      R"re(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})re"
      R"re(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})re"
      R"re(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re",
      R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re",
      R"re(\s+\z)re",  // "$" of the original: the end of the piece
      DEPTHKV_PRE_DEEPSEEK_CJK,
      R"re(\p{N}+)re"};
}

/// @param name a `tokenizer.ggml.pre` value
/// @param spec set to its definition
/// @return false when the name is unknown
inline bool pre_tokenizer_spec(const std::string& name, PreTokenizerSpec& spec) {
  auto any = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (name == n) return true;
    return false;
  };
  spec = PreTokenizerSpec();
  const std::string llama3 = DEPTHKV_PRE_CONTRACTIONS
      R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
  if (any({"llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"})) {
    spec.patterns = {llama3};
    spec.ignore_merges = true;
    spec.add_bos = true;
  } else if (any({"dbrx", "smaug-bpe"})) {
    spec.patterns = {llama3};
  } else if (any({"qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"})) {
    spec.patterns = {DEPTHKV_PRE_CONTRACTIONS
                     R"re(|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"};
  } else if (name == "qwen35") {
    spec.patterns = {DEPTHKV_PRE_CONTRACTIONS
                     R"re(|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"};
  } else if (any({"gpt-2", "phi-2", "mpt", "olmo", "jais"})) {
    spec.patterns = {DEPTHKV_PRE_GPT2};
  } else if (any({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"})) {
    spec.patterns = {R"re(\p{N})re", DEPTHKV_PRE_GPT2};
  } else if (name == "tekken") {
    spec.patterns = {
        R"re([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)re"
        R"re(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)re"
        R"re(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"};
    spec.ignore_merges = true;
    spec.add_bos = true;
  } else if (name == "deepseek-llm") {
    spec.patterns = deepseek_llm_patterns();
  } else if (name == "deepseek-coder") {
    spec.patterns = {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", DEPTHKV_PRE_DEEPSEEK_CJK,
                     R"re(\p{N})re"};
  } else if (name == "default") {
    spec.patterns = {R"re([\p{P}\$\+<=>\^~\|]+)re", DEPTHKV_PRE_GPT2, R"re(\p{N}+)re", R"re([0-9][0-9][0-9])re"};
  } else {
    return false;
  }
  return true;
}

/// The code points of Unicode's White_Space property, as a class body.
inline const char* white_space_class() {
  return R"re(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})re";
}

/// Rewrites `\s` and `\S` of a pattern as Unicode's White_Space property and its complement
/// (inside and outside character classes), the meaning the models' regex engines (Oniguruma in
/// Hugging Face tokenizers, Rust's regex in tiktoken) and llama.cpp's tables give them (PCRE2's
/// own `\s` in UCP mode leaves out U+0085).
inline std::string expand_white_space(const std::string& p) {
  const std::string ws = white_space_class();
  std::string out;
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 's') {
        out += in_class ? ws : "[" + ws + "]";
      } else if (e == 'S') {
        DEPTHKV_CHECK(!in_class, "pre-tokenizer pattern: \\S inside a character class is not supported: " << p);
        out += "[^" + ws + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is a literal
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

#undef DEPTHKV_PRE_CONTRACTIONS
#undef DEPTHKV_PRE_GPT2
#undef DEPTHKV_PRE_DEEPSEEK_CJK

}  // namespace detail

/// A byte-level BPE pre-tokenizer (see the file comment). Copies share the compiled patterns;
/// `split` may be called from several threads at once.
class PreTokenizer {
 public:
  /// A piece: `length` bytes at `offset` of the split text.
  struct Span {
    std::size_t offset;
    std::size_t length;
  };

  /// @param name a `tokenizer.ggml.pre` value (see `names()`)
  /// @throws Error naming `name` (and the known names) when it is unknown
  explicit PreTokenizer(const std::string& name) : name_(name) {
    detail::PreTokenizerSpec spec;
    DEPTHKV_CHECK(detail::pre_tokenizer_spec(name, spec),
                  "unknown pre-tokenizer '" << name << "' (tokenizer.ggml.pre); depthkv knows " << known_names());
    ignore_merges_ = spec.ignore_merges;
    add_bos_ = spec.add_bos;
    for (const std::string& p : spec.patterns)
      regexes_.push_back(std::make_shared<const detail::Pcre2Regex>(detail::expand_white_space(p)));
  }

  /// @return the names accepted by the constructor
  static std::vector<std::string> names() {
    return {"llama-bpe", "llama3",    "llama-v3",     "falcon3",   "falcon-h1", "pixtral",      "midm-2.0",
            "lfm2",      "dbrx",      "smaug-bpe",    "qwen2",     "deepseek-r1-qwen", "stablelm2", "megrez",
            "qwen35",    "gpt-2",     "phi-2",        "mpt",       "olmo",      "jais",         "smollm",
            "starcoder", "refact",    "command-r",    "codeshell", "exaone",    "minerva-7b",   "tekken",
            "deepseek-llm", "deepseek-coder", "default"};
  }

  /// @return the name it was built from
  const std::string& name() const { return name_; }
  /// @return whether a piece that is a whole token skips merging (llama.cpp's ignore_merges)
  bool ignore_merges() const { return ignore_merges_; }
  /// @return whether BOS is added by default (when the file has no `add_bos_token`)
  bool add_bos() const { return add_bos_; }
  /// @return the patterns, in the order they are applied
  std::vector<std::string> patterns() const {
    std::vector<std::string> out;
    for (const auto& r : regexes_) out.push_back(r->pattern());
    return out;
  }

  /// Splits `text[0, length)` into pieces, appended to `out` in order (they cover the text
  /// exactly, none empty).
  /// @param text the bytes (any bytes; invalid UTF-8 is kept)
  /// @param length their number
  /// @param out receives the pieces (offsets into `text`)
  /// @throws Error on a PCRE2 matching error
  void split(const char* text, std::size_t length, std::vector<Span>& out) const {
    detail::Pcre2Scratch scratch;
    std::vector<Span> cur{{0, length}}, next;
    if (length == 0) cur.clear();
    for (const auto& re : regexes_) {
      next.clear();
      for (const Span& s : cur) split_one(*re, text + s.offset, s.length, s.offset, scratch, next);
      cur.swap(next);
    }
    out.insert(out.end(), cur.begin(), cur.end());
  }

  /// @param text the text
  /// @param out receives the pieces
  /// @throws Error as the other overload
  void split(const std::string& text, std::vector<Span>& out) const { split(text.data(), text.size(), out); }

 private:
  static std::string known_names() {
    std::ostringstream os;
    const std::vector<std::string> n = names();
    for (std::size_t i = 0; i < n.size(); ++i) os << (i ? ", " : "") << n[i];
    return os.str();
  }

  // The matches of `re` in the piece and the text between them, as pieces (offsets + base).
  static void split_one(const detail::Pcre2Regex& re, const char* s, std::size_t n, std::size_t base,
                        detail::Pcre2Scratch& scratch, std::vector<Span>& out) {
    std::size_t pos = 0, last = 0;
    while (pos < n) {
      std::size_t b = 0, e = 0;
      if (!re.find(s, n, pos, scratch, b, e)) break;
      if (e == b) {  // an empty match: search again from the next character
        pos = b + 1;
        while (pos < n && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > last) out.push_back({base + last, b - last});
      out.push_back({base + b, e - b});
      pos = last = e;
    }
    if (last < n) out.push_back({base + last, n - last});
  }

  std::string name_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
  std::vector<std::shared_ptr<const detail::Pcre2Regex>> regexes_;
};

}  // namespace llama
}  // namespace depthkv
