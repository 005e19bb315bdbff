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

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

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
  std::size_t p = 0;
  int n = 0, pass = 0;
  std::string expected;
  while (p < inp.size() && std::getline(out, expected)) {
    const std::size_t q = inp.find(sep, p);
    REQUIRE(q != std::string::npos);
    const std::string text = inp.substr(p, q - p);
    p = q + sep.size();
    const std::string file = tmp.file("case.txt");
    std::ofstream(file, std::ios::binary | std::ios::trunc) << text;
    const depthkv_test::CliRun r =
        run_cli("tokenize --model " + shell_quoted(model) + " --text-file " + shell_quoted(file) + " --no-bos");
    INFO(name << " case " << n << ": '" << text << "'");
    REQUIRE(r.status == 0);
    CHECK(r.out == normalized(expected) + "\n");
    pass += r.out == normalized(expected) + "\n";
    ++n;
  }
  CHECK(n == 46);
  WARN("depthkv tokenize, " << name << ": " << pass << " of " << n << " lines byte-exact");
}

TEST_CASE("tokenize: BOS, --special, --json, --prompt and errors", "[tokenize][real]") {
  const std::string model = shell_quoted(depthkv_test::data_path("vocab/ggml-vocab-llama-bpe.gguf"));
  CHECK(run_cli("tokenize --model " + model + " --prompt 'Hello world'").out == "128000 9906 1917\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt 'Hello world' --no-bos --json").out == "[9906, 1917]\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt '<|begin_of_text|>Hello' --no-bos --special").out ==
        "128000 9906\n");
  CHECK(run_cli("tokenize --model " + model + " --prompt '' --no-bos").out == "\n");
  require_error(run_cli("tokenize --model " + model, "2>&1"), "exactly one of --text-file");
  const std::string spm = shell_quoted(depthkv_test::data_path("vocab/ggml-vocab-llama-spm.gguf"));
  CHECK(run_cli("tokenize --model " + spm + " --prompt 'Hello world' --no-bos").status == 0);
}
