// Tests of depthkv/llama/perplexity.hpp: llama-perplexity's protocol (second half of each window
// scored, BOS replacing the first token) against a token-by-token reference on random models, and
// its errors.

#include "depthkv/llama/perplexity.hpp"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "support/random_model.hpp"

using namespace depthkv;
using namespace depthkv::llama;

namespace {

// Mean NLL of the protocol computed one decode step at a time, in long double.
double reference_nll(const LlamaEngine& engine, const std::vector<int>& ids, int context, int windows, int bos,
                     long long& scored) {
  long double sum = 0;
  scored = 0;
  for (int w = 0; w < windows; ++w) {
    std::vector<int> t(ids.begin() + w * context, ids.begin() + (w + 1) * context);
    if (bos >= 0) t[0] = bos;
    HostCache cache = engine.make_cache();
    for (int j = 0; j < context - 1; ++j) {
      const Eigen::VectorXf lg = engine.decode(t[static_cast<std::size_t>(j)], j, cache);
      if (j < context / 2) continue;
      long double z = 0;
      for (Eigen::Index v = 0; v < lg.size(); ++v) z += std::exp(static_cast<long double>(lg(v)));
      sum += std::log(z) - lg(t[static_cast<std::size_t>(j + 1)]);
      ++scored;
    }
  }
  return static_cast<double>(sum / scored);
}

}  // namespace

TEST_CASE("perplexity: llama-perplexity's protocol against a token-by-token reference", "[perplexity]") {
  depthkv_test::RandomSpec spec;
  spec.seed = 5;
  spec.seq_len = 64;
  const LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const std::vector<int> ids = depthkv_test::random_tokens(200, spec.vocab, 9);
  for (int context : {4, 17, 64}) {
    for (int bos : {-1, 3}) {
      CAPTURE(context, bos);
      const int windows = std::min(3, 200 / context);
      long long scored = 0;
      const double want = reference_nll(engine, ids, context, windows, bos, scored);
      for (int threads : {1, 2}) {
        const PerplexityResult r = perplexity(engine, ids, context, windows, bos, /*chunk_size=*/7, threads);
        REQUIRE(r.n_windows == windows);
        REQUIRE(r.n_scored == scored);
        REQUIRE(r.n_scored == static_cast<long long>(windows) * (context - 1 - context / 2));
        REQUIRE(r.nll == Approx(want).epsilon(1e-5));
        REQUIRE(r.ppl == Approx(std::exp(want)).epsilon(1e-5));
        REQUIRE(r.window_nll.size() == static_cast<std::size_t>(windows));
        REQUIRE(r.nll_stderr > 0);
      }
    }
  }
  // 0 windows = every whole window
  REQUIRE(perplexity(engine, ids, 64, 0).n_windows == 3);
}

TEST_CASE("perplexity: bad input is a clear error", "[perplexity]") {
  depthkv_test::RandomSpec spec;
  spec.seq_len = 64;
  const LlamaModel model = depthkv_test::random_model(spec);
  const LlamaEngine engine(model);
  const std::vector<int> ids = depthkv_test::random_tokens(100, spec.vocab, 1);
  auto msg = [&](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  CHECK(msg([&] { perplexity(engine, ids, 65); }).find("context 65 is outside [4, 64]") != std::string::npos);
  CHECK(msg([&] { perplexity(engine, ids, 3); }).find("context 3 is outside") != std::string::npos);
  CHECK(msg([&] { perplexity(engine, ids, 40, 3); }).find("100 tokens hold 2 windows of 40; asked for 3") !=
        std::string::npos);
  CHECK(msg([&] { perplexity(engine, std::vector<int>(10, 1), 16); }).find("fewer than one window of 16") !=
        std::string::npos);
  std::vector<int> bad = ids;
  bad[5] = spec.vocab;
  CHECK(msg([&] { perplexity(engine, bad, 16, 1); }).find("token 50 at 5 is outside the vocabulary") !=
        std::string::npos);
  CHECK(msg([&] { perplexity(engine, ids, 16, 1, spec.vocab); }).find("BOS id 50") != std::string::npos);
  // the argument checks speak for perplexity (the function called), as its own checks do
  CHECK(msg([&] { perplexity(engine, ids, 65); }).rfind("depthkv: perplexity: perplexity: context 65", 0) ==
        0);
  CHECK(msg([&] { perplexity(engine, bad, 16, 1); }).rfind("depthkv: perplexity: perplexity: token 50", 0) ==
        0);
}

TEST_CASE("perplexity: weights so large that the logits overflow are an error, not a NaN perplexity", "[perplexity]") {
  depthkv_test::RandomSpec spec;
  spec.seq_len = 64;
  LlamaModel model = depthkv_test::random_model(spec);
  model.final_norm.setConstant(1e3f);   // finite weights, but every logit overflows float
  model.classifier.setConstant(3e38f);
  const LlamaEngine engine(model);
  const std::vector<int> ids = depthkv_test::random_tokens(64, spec.vocab, 1);
  REQUIRE_THROWS_WITH(perplexity(engine, ids, 16, 2),
                      Catch::Contains("the logits at position 0: inf or NaN"));
  REQUIRE_THROWS_WITH(perplexity(engine, ids, 16, 1, -1, 1024, -1), Catch::Contains("n_threads must be in [0, 1024] (0: OpenMP's default), got -1"));
  // a thread count beyond kMaxThreads is an error, not a stack overflow or "Out of memory" in libgomp
  REQUIRE_THROWS_WITH(perplexity(engine, ids, 16, 1, -1, 1024, 100000),
                      Catch::Contains("perplexity: n_threads must be in [0, 1024] (0: OpenMP's default), got 100000"));
  REQUIRE_THROWS_WITH(depthkv::llama::check_thread_count(2147483647, "--threads"),
                      Catch::Contains("--threads must be in [0, 1024]"));
  REQUIRE_NOTHROW(depthkv::llama::check_thread_count(depthkv::llama::kMaxThreads));
}
