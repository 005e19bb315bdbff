// own_engine: the library's driver (PrunedGeneration, llama/pruned_generation.hpp) on an engine of
// your own. The driver needs two calls of the engine: config() and forward(tokens, n, pos0, cache,
// opt), which appends the tokens' keys and values to a depthkv KVCache and passes every layer's
// attention rows to opt.observer. ToyEngine below is such an engine: random weights, one attention
// per layer (no MLP, no RoPE), so that the loop is visible; yours is your model's forward pass.
// It keeps the cache within a budget of 256 KV tokens while it reads a 600-token prompt and
// decodes 200 more, and prints the tokens each layer holds.
//
// Usage: own_engine

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "depthkv/kv_cache.hpp"
#include "depthkv/llama/pruned_generation.hpp"

using namespace depthkv;
using llama::ForwardOptions;
using llama::RowMatrix;

struct ToyConfig {  // the fields the driver reads
  int n_layers = 4, n_heads = 2, n_kv_heads = 2, vocab_size = 256, seq_len = 4096, head_dim = 16;
  std::vector<int> layer_window;  // no sliding-window layers
};

class ToyEngine {
 public:
  explicit ToyEngine(const ToyConfig& c) : c_(c), d_(c.n_heads * c.head_dim) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f / std::sqrt(static_cast<float>(d_)));
    auto random = [&](int r, int k) {
      RowMatrix m(r, k);
      for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = nd(rng);
      return m;
    };
    embed_ = random(c.vocab_size, d_) * std::sqrt(static_cast<float>(d_));
    for (int l = 0; l < c.n_layers; ++l) w_.push_back({random(d_, d_), random(d_, d_), random(d_, d_)});
  }
  const ToyConfig& config() const { return c_; }
  KVCache<HostLayer<float>> make_cache() const {
    KVCache<HostLayer<float>> cache;
    for (int l = 0; l < c_.n_layers; ++l) cache.add_layer(HostLayer<float>(c_.n_kv_heads, c_.head_dim));
    return cache;
  }

  // One token at a time: append K and V, attend over what the (pruned) cache holds, observe.
  RowMatrix forward(const int* tokens, int n, std::int32_t pos0, KVCache<HostLayer<float>>& cache,
                    const ForwardOptions& opt) const {
    Eigen::RowVectorXf x;
    for (int i = 0; i < n; ++i) {
      DEPTHKV_CHECK(tokens[i] >= 0 && tokens[i] < c_.vocab_size, "token " << tokens[i] << " outside the vocabulary");
      const std::int32_t pos = pos0 + i;
      x = embed_.row(tokens[i]);
      for (int l = 0; l < c_.n_layers; ++l) x += attend(l, x, pos, cache.layer(l), opt);
    }
    if (opt.after_chunk) opt.after_chunk(n, pos0 + n);
    return x * embed_.transpose();  // [1 x vocab]
  }

 private:
  struct Weights { RowMatrix q, k, v; };

  Eigen::RowVectorXf attend(int l, const Eigen::RowVectorXf& x, std::int32_t pos, HostLayer<float>& layer,
                            const ForwardOptions& opt) const {
    const Eigen::RowVectorXf q = x * w_[l].q, k = x * w_[l].k, v = x * w_[l].v;
    layer.append(k.data(), v.data(), pos);  // [n_kv_heads][head_dim] each
    Eigen::RowVectorXf out = Eigen::RowVectorXf::Zero(d_);
    for (int h = 0; h < c_.n_heads; ++h) {  // query head h reads KV head h (n_heads == n_kv_heads)
      const int m = layer.size(h), hd = c_.head_dim;
      std::vector<float> p(static_cast<std::size_t>(m));
      for (int j = 0; j < m; ++j)
        p[j] = Eigen::Map<const Eigen::RowVectorXf>(layer.key(h, j), hd).dot(q.segment(h * hd, hd)) / std::sqrt(float(hd));
      const float mx = *std::max_element(p.begin(), p.end());
      float sum = 0;
      for (float& e : p) sum += (e = std::exp(e - mx));
      for (int j = 0; j < m; ++j) {
        p[j] /= sum;
        out.segment(h * hd, hd) += p[j] * Eigen::Map<const Eigen::RowVectorXf>(layer.value(h, j), hd);
      }
      if (opt.observer && pos >= opt.observe_from) opt.observer(l, h, pos, 1, p.data(), m, m);
    }
    return out;
  }

  ToyConfig c_;
  int d_;
  RowMatrix embed_;
  std::vector<Weights> w_;
};

int main() {
  try {
    const ToyEngine engine{ToyConfig{}};
    PruneSpec spec;  // SnapKV scores, 4 sinks + 16 recent kept, 256 KV tokens over the 4 layers
    spec.scorer = scorer_config("snapkv");
    spec.budget = Budget::tokens(256);
    spec.schedule = {ScheduleMode::kChunked, /*chunk=*/64, /*interval=*/16};
    ForwardOptions run;
    run.chunk_size = 64;
    llama::PrunedGeneration<KVCache<HostLayer<float>>, ToyEngine> gen(engine, engine.make_cache(), spec, {}, nullptr, run);

    std::vector<int> prompt(600);
    for (int i = 0; i < 600; ++i) prompt[i] = (i * 37 + 11) % 256;
    int token = llama::last_argmax(gen.prefill(prompt));
    for (int i = 0; i < 200; ++i) token = llama::last_argmax(gen.step(token));

    std::printf("own_engine: %d tokens seen, %d evictions; layers hold", static_cast<int>(gen.report().tokens_seen),
                gen.report().evictions);
    for (int n : gen.cache().lengths()) std::printf(" %d", n);
    std::printf(" tokens (budget 256 plus one interval per layer); peak %zu bytes\n", gen.report().peak_bytes);
  } catch (const Error& e) {
    std::fprintf(stderr, "own_engine: %s\n", e.what());
    return 1;
  }
  return 0;
}
