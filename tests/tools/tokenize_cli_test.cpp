// Tests of `depthkv tokenize` (tools/cmd_tokenize.cpp), run as a separate process: every case of
// llama.cpp's test vocabularies (byte-level BPE and SentencePiece) comes out as its .out line.

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

namespace {

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;
using depthkv_test::slurp;

std::string normalized(const std::string& ids_line) {  // the .out lines start with a space
  std::istringstream in(ids_line);
  std::string out, id;
  while (in >> id) out += (out.empty() ? "" : " ") + id;
  return out;
}

}  // namespace

TEST_CASE("tokenize: reproduces every .out line of llama.cpp's test vocabularies", "[tokenize][real]") {
  const std::string name =
      GENERATE(as<std::string>{}, "ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf", "ggml-vocab-gpt-2.gguf",
               "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf");
  const std::string model = depthkv_test::data_path("vocab/" + name);
  const std::string inp = slurp(model + ".inp");
  std::istringstream out(slurp(model + ".out"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  depthkv_test::TempDir tmp;
  std::vector<std::string> texts, expected;
  std::string args = "tokenize --model " + shell_quoted(model) + " --no-bos";
  for (std::size_t p = 0; p < inp.size();) {  // one file per case
    const std::size_t q = inp.find(sep, p);
    REQUIRE(q != std::string::npos);
    texts.push_back(inp.substr(p, q - p));
    p = q + sep.size();
    const std::string file = tmp.file("case" + std::to_string(texts.size()) + ".txt");
    std::ofstream(file, std::ios::binary | std::ios::trunc) << texts.back();
    args += " --text-file " + shell_quoted(file);
  }
  for (std::string line; std::getline(out, line);) expected.push_back(normalized(line));
  REQUIRE(texts.size() == 46);
  REQUIRE(expected.size() == texts.size());
  // one run, one line per file
  const depthkv_test::CliRun r = run_cli(args);
  REQUIRE(r.status == 0);
  std::istringstream lines(r.out);
  int pass = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    std::string line;
    INFO(name << " case " << i << ": '" << texts[i] << "'");
    REQUIRE(std::getline(lines, line));
    CHECK(line == expected[i]);
    pass += line == expected[i];
  }
  std::string rest;
  CHECK_FALSE(std::getline(lines, rest));
  WARN("depthkv tokenize, " << name << ": " << pass << " of " << texts.size() << " lines byte-exact");
  // a case on its own gives its line alone, with exactly one newline
  const depthkv_test::CliRun one =
      run_cli("tokenize --model " + shell_quoted(model) + " --no-bos --text-file " + shell_quoted(tmp.file("case1.txt")));
  CHECK(one.out == expected[0] + "\n");
}

TEST_CASE("tokenize: BOS, --special, --json, --prompt and errors", "[tokenize][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("vocab/ggml-vocab-llama-bpe.gguf"));
  CHECK(run_cli("tokenize --model " + model + " --prompt 'Hello world'").out == "128000 9906 1917\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt 'Hello world' --no-bos --json").out == "[9906, 1917]\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt '<|begin_of_text|>Hello' --no-bos --special").out ==
        "128000 9906\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt '' --no-bos").out == "\n");
  require_error(run_cli("tokenize --model " + model, "2>&1"), "give --prompt TEXT or --text-file FILE");
  const std::string spm = shell_quoted(depthkv_test::data_path("vocab/ggml-vocab-llama-spm.gguf"));
  CHECK(run_cli("tokenize --model " + spm + " --prompt 'Hello world' --no-bos").status == 0);
}
