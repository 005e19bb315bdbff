// reference_logits: the engine's full-cache outputs on given token ids, for comparing its
// numerics with another implementation (scripts/hf_parity.py compares them with Hugging Face's
// model loaded from the same GGUF file).
//
//   reference_logits --model M --ids FILE --logits-out OUT [--chunk 512] [--threads 0]
//     FILE holds whitespace-separated token ids; OUT receives the logits of every position as
//     float32, row-major [n x vocab] (row i predicts the token after ids[i]).
//   reference_logits --model M --prompts FILE --greedy N [--threads 0]
//     FILE holds one prompt per line as token ids; prints one JSON object per prompt: the N
//     greedy tokens and, per step, the gap between the top two logits and the top five (id, logit).
// Both run on a float32 cache (the quality protocol's), as one prefill then decode steps.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "depthkv/error.hpp"
#include "depthkv/llama/engine.hpp"
#include "depthkv/llama/open_model.hpp"

namespace {

using depthkv::llama::ForwardOptions;
using depthkv::llama::LlamaEngine;
using depthkv::llama::RowMatrix;

std::vector<int> parse_ids(const std::string& line) {
  std::istringstream in(line);
  std::vector<int> ids;
  long long v = 0;
  while (in >> v) {
    DEPTHKV_CHECK(v >= 0 && v < (1LL << 31), "token id " << v << " is out of range");
    ids.push_back(static_cast<int>(v));
  }
  DEPTHKV_CHECK(!in.bad() && in.eof(), "'" << line.substr(0, 40) << "' is not a list of token ids");
  return ids;
}

void write_logits(const LlamaEngine& engine, const std::string& ids_file, const std::string& out, int chunk, int threads) {
  std::ifstream f(ids_file);
  DEPTHKV_CHECK(f.good(), "cannot read " << ids_file);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<int> ids = parse_ids(ss.str());
  DEPTHKV_CHECK(!ids.empty(), ids_file << " holds no token ids");
  auto cache = engine.make_cache();
  ForwardOptions opt;
  opt.chunk_size = chunk;
  opt.n_threads = threads;
  const RowMatrix logits = engine.prefill(ids, 0, cache, opt);
  std::ofstream o(out, std::ios::binary);
  DEPTHKV_CHECK(o.good(), "cannot write " << out);
  o.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  DEPTHKV_CHECK(o.good(), "writing " << out << " failed");
  std::printf("%zu positions x %d logits written to %s\n", ids.size(), engine.config().vocab_size, out.c_str());
}

void greedy(const LlamaEngine& engine, const std::string& prompts, int steps, int threads) {
  std::ifstream f(prompts);
  DEPTHKV_CHECK(f.good(), "cannot read " << prompts);
  std::string line;
  while (std::getline(f, line)) {
    const std::vector<int> ids = parse_ids(line);
    if (ids.empty()) continue;
    auto cache = engine.make_cache();
    ForwardOptions opt;
    opt.n_threads = threads;
    opt.all_logits = false;
    RowMatrix l = engine.prefill(ids, 0, cache, opt);
    Eigen::VectorXf row = l.row(0).transpose();
    nlohmann::json out = {{"prompt", ids}, {"tokens", nlohmann::json::array()}, {"gap", nlohmann::json::array()},
                            {"top5", nlohmann::json::array()}};
    for (int s = 0; s < steps; ++s) {
      std::vector<int> order(static_cast<std::size_t>(row.size()));
      for (int i = 0; i < static_cast<int>(order.size()); ++i) order[static_cast<std::size_t>(i)] = i;
      std::partial_sort(order.begin(), order.begin() + 5, order.end(), [&](int x, int y) {
        return row(x) > row(y) || (row(x) == row(y) && x < y);
      });
      const int best = order[0];
      nlohmann::json top = nlohmann::json::array();
      for (int i = 0; i < 5; ++i) top.push_back({order[static_cast<std::size_t>(i)], row(order[static_cast<std::size_t>(i)])});
      out["tokens"].push_back(best);
      out["gap"].push_back(row(order[0]) - row(order[1]));
      out["top5"].push_back(top);
      if (s + 1 < steps) {
        depthkv::CpuOptions cpu;
        cpu.n_threads = threads;
        row = engine.decode(best, static_cast<std::int32_t>(ids.size()) + s, cache, nullptr, cpu);
      }
    }
    std::printf("%s\n", out.dump().c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the engine's full-cache logits or greedy tokens on given token ids"};
  std::string model, ids, out, prompts;
  int chunk = 512, threads = 0, steps = 0;
  app.add_option("--model", model, "GGUF or llama2.c model file")->required();
  app.add_option("--ids", ids, "file of whitespace-separated token ids (with --logits-out)");
  app.add_option("--logits-out", out, "float32 [n x vocab] logits of every position of --ids");
  app.add_option("--prompts", prompts, "file of prompts, one per line as token ids (with --greedy)");
  app.add_option("--greedy", steps, "greedy steps per prompt")->check(CLI::Range(1, 1 << 20));
  app.add_option("--chunk", chunk, "prefill chunk size")->check(CLI::Range(1, 1 << 20));
  app.add_option("--threads", threads, "threads (0: OpenMP default)")->check(CLI::Range(0, depthkv::kMaxCpuThreads));
  CLI11_PARSE(app, argc, argv);
  try {
    DEPTHKV_CHECK(ids.empty() == out.empty() && prompts.empty() == (steps == 0) && ids.empty() != prompts.empty(),
                  "give --ids with --logits-out, or --prompts with --greedy");
    const depthkv::llama::OpenedModel m = depthkv::llama::open_model(model);
    const LlamaEngine engine(m.model);
    if (!ids.empty()) write_logits(engine, ids, out, chunk, threads);
    else greedy(engine, prompts, steps, threads);
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "reference_logits: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
