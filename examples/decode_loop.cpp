// decode_loop: the depthkv integration every engine copies, on the real stories260K model.
//
//   1. prefill the context, feeding each layer's attention probabilities to a TokenScorer;
//   2. split a global KV budget across layers with the BudgetAllocator;
//   3. evict each layer to its budget (physically: every layer holds only its budget);
//   4. teacher-force a continuation (or decode) on the pruned cache, positions continuing.
//
// Usage: decode_loop [--keep 0.3] [--policy pyramid] [--scorer snapkv] [--data DIR]
// (DIR holds models/stories260K and text/; default: the DEPTHKV_DATA_DIR environment variable,
// else the folder configured at build time.)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "depthkv/budget_allocator.hpp"
#include "depthkv/llama.hpp"
#include "depthkv/token_scorer.hpp"

#ifndef DEPTHKV_DEFAULT_DATA_DIR
#define DEPTHKV_DEFAULT_DATA_DIR "../shared"
#endif

int main(int argc, char** argv) {
  using namespace depthkv;
  using namespace depthkv::llama;
  double keep = 0.3;
  std::string policy_name = "pyramid", scorer_name = "snapkv";
  std::string data = std::getenv("DEPTHKV_DATA_DIR") ? std::getenv("DEPTHKV_DATA_DIR") : DEPTHKV_DEFAULT_DATA_DIR;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--keep")) keep = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--policy")) policy_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--scorer")) scorer_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--data")) data = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: decode_loop [--keep R] [--policy NAME] [--scorer NAME] [--data DIR]\n");
      return 2;
    }
  }
  try {
    const LlamaModel model = load_llama2c(data + "/models/stories260K/stories260K.bin");
    const Tokenizer tok(data + "/models/stories260K/tok512.bin", model.config.vocab_size);
    const LlamaEngine engine(model);

    // A 384-token context and a 128-token continuation from the story corpus.
    const auto ids = encode_stories(tok, split_stories(read_text_file(data + "/text/tinystories_valid.txt")));
    const std::vector<int> context(ids.begin() + 512, ids.begin() + 512 + 384);
    const std::vector<int> continuation(ids.begin() + 512 + 384, ids.begin() + 1024);
    const int n_ctx = static_cast<int>(context.size());

    // Reference: the full cache.
    HostCache full = engine.make_cache();
    engine.prefill(context, 0, full);
    const RowMatrix full_logits = engine.teacher_force(continuation, n_ctx, full);

    // 1. Prefill with one scorer per layer observing the attention.
    ScorerConfig sc;
    sc.kind = parse_scorer_kind(scorer_name);
    std::vector<TokenScorer> scorers = make_scorers(model.config, sc);
    HostCache cache = engine.make_cache();
    ForwardOptions opt;
    opt.observer = observe_into(scorers);
    engine.prefill(context, 0, cache, opt);

    // 2 + 3. Per-layer budgets from the allocator, then eviction (keep 4 sink tokens).
    PruneRequest req;
    req.policy = parse_allocation_policy(policy_name);
    req.budget.keep_ratio = keep;
    req.protection = Protection{4, 0};
    const PruneReport rep = score_and_evict(cache, scorers, req);

    std::printf("stories260K, context %d tokens, %s scorer, %s policy, global keep %.2f\n", n_ctx, scorer_name.c_str(),
                policy_name.c_str(), keep);
    std::printf("layer  kept/held  bytes\n");
    for (int l = 0; l < cache.n_layers(); ++l)
      std::printf("%5d  %4d/%-4d  %zu\n", l, rep.budgets[static_cast<std::size_t>(l)], rep.lengths[static_cast<std::size_t>(l)],
                  cache.bytes(l));
    std::printf("KV bytes: %zu of %zu (%.1f%% saved)\n", rep.bytes_after, rep.bytes_before,
                100.0 * (1.0 - static_cast<double>(rep.bytes_after) / static_cast<double>(rep.bytes_before)));

    // 4a. Teacher-force the continuation on the pruned cache and compare with the full cache.
    HostCache tf = cache;  // keep `cache` for the decoding below
    const RowMatrix pruned_logits = engine.teacher_force(continuation, n_ctx, tf);
    const ContinuationMetrics m = compare_logits(full_logits, pruned_logits, continuation_targets(continuation));
    std::printf("continuation (%d tokens): KL(full||pruned) %.4f, NLL %.4f -> %.4f (%+.4f), top-1 agreement %.1f%%\n",
                m.n_positions, m.loss.kl, m.nll_full, m.nll_pruned, m.loss.dnll, 100.0 * (1.0 - m.loss.top1_disagree));

    // 4b. Greedy decoding on the pruned cache (the cache stays fixed; new tokens are appended).
    int token = continuation.front();
    std::string text = Tokenizer::safe_piece(tok.decode(context.back(), token));
    Eigen::VectorXf logits = engine.decode(token, n_ctx, cache);
    for (int pos = n_ctx + 1; pos < n_ctx + 40; ++pos) {
      Eigen::Index next = 0;
      logits.maxCoeff(&next);
      text += Tokenizer::safe_piece(tok.decode(token, static_cast<int>(next)));
      token = static_cast<int>(next);
      logits = engine.decode(token, pos, cache);
    }
    std::printf("greedy on the pruned cache: ...%s\n", text.c_str());
  } catch (const depthkv::Error& e) {
    std::fprintf(stderr, "decode_loop: %s\n", e.what());
    return 1;
  }
  return 0;
}
