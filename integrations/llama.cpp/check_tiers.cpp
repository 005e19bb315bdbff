// Checks the tiered KV cache of the patched llama.cpp (patches/ in this folder) on a real GGUF model.
//   (a) stock memory vs. tiered memory (3 tiers covering all non-SWA layers, every tier holding the whole
//       sequence): prefill the prompt, decode greedily; the tokens must be equal and the logits close
//   (b) tiered: after the prefill, remove every second position older than the last 64 from tier 1 only;
//       only tier 1's used cells may drop, and decoding must still run
//   (c) bytes of each tier against the stock cache's bytes
//   (b') the same positions removed from every cache must give what stock llama_memory_seq_rm of them gives
//   (d) tiers 1 and 2 with budgets smaller than the sequence, evicting while prefilling and decoding
//   (e) two sequences in separate streams: tiered equals stock, and a removal from one sequence spares the other
// Exits 1 when (a), (b'), (d) or (e) fails (or anything errors), 0 otherwise.
// usage: check_tiers MODEL.gguf [n_prompt=600] [fa=both|on|off] [text=/usr/share/common-licenses/GPL-3]
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static constexpr int N_GEN     = 32;
static constexpr int N_CTX     = 2048;
static constexpr int N_BATCH   = 512;
static constexpr int N_UBATCH  = 128;
static constexpr int N_RECENT  = 64;
static constexpr uint32_t N_TIERS = 3;

static double g_kv_mib = 0.0; // sum of the "KV buffer size" log lines since the last reset

static void log_cb(ggml_log_level level, const char * text, void *) {
    const char * p = strstr(text, "KV buffer size = ");
    if (p) {
        g_kv_mib += atof(p + strlen("KV buffer size = "));
    }
    if (level == GGML_LOG_LEVEL_ERROR || getenv("CHECK_TIERS_VERBOSE")) {
        fputs(text, stderr);
    }
}

struct tier_info {
    uint32_t used = 0, total = 0;
    size_t bytes = 0;
};

struct run_result {
    bool ok = false;
    std::vector<llama_token> tokens;
    std::vector<std::vector<float>> logits; // one row per generated token
    double stock_kv_mib = 0.0;
    std::vector<tier_info> info_prefill, info_removed; // tiers, then the SWA cache if any
};

static std::vector<tier_info> get_info(llama_memory_t mem) {
    std::vector<tier_info> res;
    for (uint32_t t = 0; ; ++t) {
        tier_info ti;
        if (!llama_memory_tier_info(mem, t, &ti.used, &ti.total, &ti.bytes)) {
            break;
        }
        res.push_back(ti);
    }
    return res;
}

enum rm_mode { RM_NONE, RM_TIER1, RM_ALL };

// positions removed by (b): every second one older than the last N_RECENT
static std::vector<llama_pos> rm_positions(int n_prompt) {
    std::vector<llama_pos> pos;
    for (llama_pos p = 1; p < n_prompt - N_RECENT; p += 2) {
        pos.push_back(p);
    }
    return pos;
}

// tier_cells == nullptr: stock memory
// RM_TIER1: remove from tier 1 only; RM_ALL: remove from every cache (stock: llama_memory_seq_rm per position)
static run_result run(llama_model * model, const std::vector<llama_token> & prompt, bool fa,
                      const std::vector<uint32_t> * tier_of_layer, const std::vector<uint32_t> * tier_cells, rm_mode remove) {
    run_result r;

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = N_CTX;
    cp.n_batch         = N_BATCH;
    cp.n_ubatch        = N_UBATCH;
    cp.n_seq_max       = 1;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    cp.swa_full        = false; // window-sized SWA cache, as llama_kv_cache_iswa without swa_full
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    if (tier_cells) {
        cp.n_kv_tiers       = tier_cells->size();
        cp.kv_tier_of_layer = tier_of_layer->data();
        cp.kv_tier_cells    = tier_cells->data();
    }

    g_kv_mib = 0.0;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "check_tiers: llama_init_from_model failed\n");
        return r;
    }
    r.stock_kv_mib = g_kv_mib;

    llama_memory_t mem = llama_get_memory(ctx);
    if ((llama_memory_n_tiers(mem) != (tier_cells ? tier_cells->size() : 0))) {
        fprintf(stderr, "check_tiers: llama_memory_n_tiers = %u\n", llama_memory_n_tiers(mem));
        llama_free(ctx);
        return r;
    }

    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> tmp(prompt);
    for (size_t i = 0; i < tmp.size(); i += N_BATCH) {
        const int n = std::min<int>(N_BATCH, tmp.size() - i);
        if (llama_decode(ctx, llama_batch_get_one(tmp.data() + i, n)) != 0) {
            fprintf(stderr, "check_tiers: prefill failed\n");
            llama_free(ctx);
            return r;
        }
    }

    if (tier_cells) {
        r.info_prefill = get_info(mem);
    }

    const std::vector<llama_pos> pos = rm_positions(prompt.size());
    if (remove == RM_ALL) {
        bool res = true;
        if (!tier_cells) {
            for (llama_pos p : pos) {
                res = res && llama_memory_seq_rm(mem, 0, p, p + 1);
            }
        } else {
            for (size_t t = 0; t < r.info_prefill.size(); ++t) {
                res = res && llama_memory_seq_rm_positions(mem, 0, t, pos.data(), pos.size());
            }
        }
        if (!res) {
            fprintf(stderr, "check_tiers: removing from every cache failed\n");
            llama_free(ctx);
            return r;
        }
    }
    if (remove == RM_TIER1) {
        if (!llama_memory_seq_rm_positions(mem, 0, 1, pos.data(), pos.size())) {
            fprintf(stderr, "check_tiers: llama_memory_seq_rm_positions failed\n");
            llama_free(ctx);
            return r;
        }
        // bad arguments must be refused
        if (llama_memory_seq_rm_positions(mem, 0, 99, pos.data(), 1) ||
            llama_memory_seq_rm_positions(mem, 7, 1, pos.data(), 1)) {
            fprintf(stderr, "check_tiers: llama_memory_seq_rm_positions accepted bad arguments\n");
            llama_free(ctx);
            return r;
        }
        r.info_removed = get_info(mem);
    }

    for (int i = 0; i < N_GEN; ++i) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        r.logits.emplace_back(lg, lg + n_vocab);
        llama_token tok = (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
        r.tokens.push_back(tok);
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            fprintf(stderr, "check_tiers: decode failed at step %d\n", i);
            llama_free(ctx);
            return r;
        }
    }

    llama_free(ctx);
    r.ok = true;
    return r;
}

// (d) real budgets: tier 0 holds everything, tier 1 at most 384 cells, tier 2 at most 128 cells (llama.cpp adds
// one ubatch to each). The prompt goes in ubatch-sized chunks; after every llama_decode, every position older than
// the last N_RECENT is removed from tier 1 unless even, and from tier 2 unless a multiple of 16
static const std::vector<uint32_t> BUDGET_CELLS = { 0, 384, 128 };

static bool budget_keep(uint32_t tier, llama_pos p) {
    return tier == 1 ? p % 2 == 0 : p % 16 == 0;
}

static run_result run_budget(llama_model * model, const std::vector<llama_token> & prompt, bool fa,
                             const std::vector<uint32_t> & tier_of_layer) {
    run_result r;

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = N_CTX;
    cp.n_batch         = N_BATCH;
    cp.n_ubatch        = N_UBATCH;
    cp.n_seq_max       = 1;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    cp.swa_full        = false;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_kv_tiers       = BUDGET_CELLS.size();
    cp.kv_tier_of_layer = tier_of_layer.data();
    cp.kv_tier_cells    = BUDGET_CELLS.data();

    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "check_tiers: llama_init_from_model failed (budget)\n");
        return r;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_pos n_past = 0;
    std::vector<llama_pos> done(BUDGET_CELLS.size(), 0); // positions below this were already handled
    auto evict = [&]() {
        for (uint32_t t = 1; t < BUDGET_CELLS.size(); ++t) {
            std::vector<llama_pos> pos;
            for (; done[t] < n_past - N_RECENT; ++done[t]) {
                if (!budget_keep(t, done[t])) {
                    pos.push_back(done[t]);
                }
            }
            if (!llama_memory_seq_rm_positions(mem, 0, t, pos.data(), pos.size())) {
                return false;
            }
        }
        return true;
    };

    std::vector<llama_token> tmp(prompt);
    for (size_t i = 0; i < tmp.size(); i += N_UBATCH) {
        const int n = std::min<int>(N_UBATCH, tmp.size() - i);
        if (llama_decode(ctx, llama_batch_get_one(tmp.data() + i, n)) != 0) {
            fprintf(stderr, "check_tiers: budget prefill failed at token %zu\n", i);
            llama_free(ctx);
            return r;
        }
        n_past += n;
        if (!evict()) {
            llama_free(ctx);
            return r;
        }
    }
    r.info_prefill = get_info(mem);

    for (int i = 0; i < N_GEN; ++i) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        llama_token tok = (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
        r.tokens.push_back(tok);
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            fprintf(stderr, "check_tiers: budget decode failed at step %d\n", i);
            llama_free(ctx);
            return r;
        }
        n_past += 1;
        if (!evict()) {
            llama_free(ctx);
            return r;
        }
    }
    r.info_removed = get_info(mem);

    llama_free(ctx);
    r.ok = true;
    return r;
}

// (e) two sequences in separate streams (kv_unified = false), 2 tiers: stock vs tiered logits, then positions of
// sequence 1 removed from tier 1 must leave sequence 0's logits unchanged. Returns {stock vs tiered, seq 0, seq 1} diffs
static std::vector<double> run_two_seqs(llama_model * model, bool fa, const std::vector<uint32_t> & tier_of_layer3) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    // tiers 0 and 1 of the 3-tier split are kept, tier 2 goes to tier 1
    std::vector<uint32_t> tol(tier_of_layer3);
    for (auto & t : tol) {
        t = std::min<uint32_t>(t, 1);
    }
    const std::vector<uint32_t> cells = { 200, 200 };
    auto run2 = [&](bool tiers, bool rm, std::vector<float> & out) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024; cp.n_batch = 256; cp.n_ubatch = N_UBATCH; cp.n_seq_max = 2; cp.kv_unified = false;
        cp.n_threads = 2; cp.n_threads_batch = 2; cp.swa_full = false;
        cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
        if (tiers) {
            cp.n_kv_tiers = cells.size(); cp.kv_tier_of_layer = tol.data(); cp.kv_tier_cells = cells.data();
        }
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            return false;
        }
        llama_batch b = llama_batch_init(256, 0, 1);
        for (int s = 0; s < 2; ++s) {
            for (int i = 0; i < 100; ++i) {
                const int k = b.n_tokens++;
                b.token[k] = 1000 + (i*7 + s*13) % 500; b.pos[k] = i; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = false;
            }
        }
        bool ok = llama_decode(ctx, b) == 0;
        if (ok && rm) {
            std::vector<llama_pos> pos;
            for (llama_pos p = 1; p < 50; p += 2) {
                pos.push_back(p);
            }
            ok = llama_memory_seq_rm_positions(llama_get_memory(ctx), 1, 1, pos.data(), pos.size());
        }
        b.n_tokens = 0;
        for (int s = 0; s < 2; ++s) {
            const int k = b.n_tokens++;
            b.token[k] = 42; b.pos[k] = 100; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = true;
        }
        ok = ok && llama_decode(ctx, b) == 0;
        if (ok) {
            for (int s = 0; s < 2; ++s) {
                const float * lg = llama_get_logits_ith(ctx, s);
                out.insert(out.end(), lg, lg + n_vocab);
            }
        }
        llama_batch_free(b);
        llama_free(ctx);
        return ok;
    };
    std::vector<float> a, t, r;
    if (!run2(false, false, a) || !run2(true, false, t) || !run2(true, true, r)) {
        return {};
    }
    std::vector<double> d(3, 0.0);
    for (int i = 0; i < 2*n_vocab; ++i) {
        d[0] = std::max(d[0], (double) std::fabs(a[i] - t[i]));
        d[i < n_vocab ? 1 : 2] = std::max(d[i < n_vocab ? 1 : 2], (double) std::fabs(r[i] - t[i]));
    }
    return d;
}

static double max_abs_diff(const run_result & a, const run_result & b) {
    double res = 0.0;
    for (size_t i = 0; i < a.logits.size(); ++i) {
        for (size_t j = 0; j < a.logits[i].size(); ++j) {
            res = std::max(res, (double) std::fabs(a.logits[i][j] - b.logits[i][j]));
        }
    }
    return res;
}

static void print_tokens(const char * name, const std::vector<llama_token> & t) {
    printf("  %-22s", name);
    for (auto x : t) {
        printf(" %d", x);
    }
    printf("\n");
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_prompt=600] [fa=both|on|off] [text=/usr/share/common-licenses/GPL-3]\n", argv[0]);
        return 2;
    }
    const char * path_model = argv[1];
    const int    n_prompt   = argc > 2 ? atoi(argv[2]) : 600;
    const std::string fa_arg = argc > 3 ? argv[3] : "both";
    const char * path_text  = argc > 4 ? argv[4] : "/usr/share/common-licenses/GPL-3";

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(path_model, mp);
    if (!model) {
        fprintf(stderr, "check_tiers: cannot load %s\n", path_model);
        return 1;
    }

    std::ifstream f(path_text);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (text.empty()) {
        fprintf(stderr, "check_tiers: cannot read %s\n", path_text);
        return 1;
    }

    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> prompt(text.size() + 16);
    const int n_tok = llama_tokenize(vocab, text.data(), text.size(), prompt.data(), prompt.size(), true, false);
    if (n_tok < n_prompt) {
        fprintf(stderr, "check_tiers: only %d tokens in %s\n", n_tok, path_text);
        return 1;
    }
    prompt.resize(n_prompt);

    // tiers: contiguous blocks of the non-SWA layers. llama.cpp exposes no per-layer SWA flag, so for a model with
    // a sliding window this assumes the Gemma 3 pattern (every 6th layer global), as llama.cpp's gemma3 loader does
    const int n_layer = llama_model_n_layer(model);
    const bool has_swa = llama_model_n_swa(model) > 0;
    std::vector<int> global;
    for (int il = 0; il < n_layer; ++il) {
        if (!has_swa || il % 6 == 5) {
            global.push_back(il);
        }
    }
    std::vector<uint32_t> tier_of_layer(n_layer, 0);
    for (size_t j = 0; j < global.size(); ++j) {
        tier_of_layer[global[j]] = (uint32_t) (j * N_TIERS / global.size());
    }
    // every tier holds the whole sequence (= keep 1); llama.cpp adds one ubatch
    const uint32_t n_seq = n_prompt + N_GEN + 1;
    const std::vector<uint32_t> tier_cells(N_TIERS, n_seq);

    char desc[64];
    printf("model %s: %d layers, n_swa %d, prompt %d tokens, %d greedy tokens, n_ubatch %d\n",
           path_model, n_layer, llama_model_n_swa(model), n_prompt, N_GEN, N_UBATCH);
    printf("tier of each layer (S = SWA, own cache):");
    for (int il = 0; il < n_layer; ++il) {
        const bool swa = has_swa && il % 6 != 5;
        snprintf(desc, sizeof(desc), " %s", swa ? "S" : std::to_string(tier_of_layer[il]).c_str());
        printf("%s", desc);
    }
    printf("\ntier cells requested: %u each\n", n_seq);

    bool ok = true;
    std::vector<bool> fas;
    if (fa_arg == "both" || fa_arg == "off") fas.push_back(false);
    if (fa_arg == "both" || fa_arg == "on")  fas.push_back(true);

    for (bool fa : fas) {
        printf("\n== flash attention %s ==\n", fa ? "on" : "off");

        const run_result stock     = run(model, prompt, fa, nullptr, nullptr, RM_NONE);
        const run_result tiered    = run(model, prompt, fa, &tier_of_layer, &tier_cells, RM_NONE);
        const run_result rm        = run(model, prompt, fa, &tier_of_layer, &tier_cells, RM_TIER1);
        const run_result stock_all = run(model, prompt, fa, nullptr, nullptr, RM_ALL);
        const run_result rm_all    = run(model, prompt, fa, &tier_of_layer, &tier_cells, RM_ALL);
        if (!stock.ok || !tiered.ok || !rm.ok || !stock_all.ok || !rm_all.ok) {
            printf("(a) FAIL: a run did not complete\n");
            ok = false;
            continue;
        }

        // (a)
        const double max_diff = max_abs_diff(stock, tiered);
        const bool same = stock.tokens == tiered.tokens;
        const bool pass_a = same && max_diff < 1e-2;
        printf("(a) stock vs tiered (keep 1): tokens %s, max |logit diff| = %.3g over %d steps -> %s\n",
               same ? "equal" : "DIFFER", max_diff, N_GEN, pass_a ? "PASS" : "FAIL");
        print_tokens("stock tokens:", stock.tokens);
        print_tokens("tiered tokens:", tiered.tokens);
        ok = ok && pass_a;

        // (b)
        bool pass_b = rm.info_prefill.size() == rm.info_removed.size();
        printf("(b) remove every 2nd position older than the last %d from tier 1 (%d positions):\n",
               N_RECENT, (n_prompt - N_RECENT) / 2);
        for (size_t t = 0; t < rm.info_prefill.size() && pass_b; ++t) {
            const auto & a = rm.info_prefill[t];
            const auto & b = rm.info_removed[t];
            const bool expect_drop = t == 1;
            const bool good = expect_drop ? b.used < a.used : b.used == a.used;
            pass_b = pass_b && good;
            printf("  %s %zu: used cells %u -> %u (of %u)%s\n", t < N_TIERS ? "tier" : "SWA ", t, a.used, b.used, b.total, good ? "" : "  <- unexpected");
        }
        int n_same = 0;
        for (int i = 0; i < N_GEN; ++i) {
            n_same += rm.tokens[i] == stock.tokens[i];
        }
        print_tokens("tokens after removal:", rm.tokens);
        printf("  decoding ran; %d/%d tokens equal to stock -> %s\n", n_same, N_GEN, pass_b ? "PASS" : "FAIL");
        // the same positions removed from every cache must match stock llama_memory_seq_rm of those positions
        const double diff_all = max_abs_diff(stock_all, rm_all);
        const bool pass_all = stock_all.tokens == rm_all.tokens && diff_all < 1e-2;
        printf("(b) same positions removed from every cache vs stock llama_memory_seq_rm: tokens %s, max |logit diff| = %.3g -> %s\n",
               stock_all.tokens == rm_all.tokens ? "equal" : "DIFFER", diff_all, pass_all ? "PASS" : "FAIL");
        ok = ok && pass_all;

        // (c)
        size_t sum = 0;
        for (size_t t = 0; t < tiered.info_prefill.size(); ++t) {
            sum += tiered.info_prefill[t].bytes;
            printf("(c) %s %zu: %8.3f MiB (%u cells)\n", t < N_TIERS ? "tier" : "SWA ", t,
                   tiered.info_prefill[t].bytes / 1048576.0, tiered.info_prefill[t].total);
        }
        printf("(c) tiered total %.3f MiB vs stock KV cache %.3f MiB (n_ctx %d; stock from llama.cpp's log, 0.01 MiB steps)\n",
               sum / 1048576.0, stock.stock_kv_mib, N_CTX);

        // (d)
        const run_result bud = run_budget(model, prompt, fa, tier_of_layer);
        bool pass_d = bud.ok;
        printf("(d) budgets: tier cells %u (= n_ctx), %u, %u; prefill in chunks of %d, evicting after every llama_decode\n",
               BUDGET_CELLS[0], BUDGET_CELLS[1], BUDGET_CELLS[2], N_UBATCH);
        if (bud.ok) {
            size_t sum_bud = 0;
            for (size_t t = 0; t < bud.info_removed.size(); ++t) {
                const auto & ti = bud.info_removed[t];
                sum_bud += ti.bytes;
                const bool good = t == 0 || t >= N_TIERS || ti.used <= BUDGET_CELLS[t] + 1;
                pass_d = pass_d && good;
                printf("  %s %zu: used cells %u of %u, %8.3f MiB%s\n", t < N_TIERS ? "tier" : "SWA ", t, ti.used, ti.total,
                       ti.bytes / 1048576.0, good ? "" : "  <- over budget");
            }
            int n_same = 0;
            for (int i = 0; i < N_GEN; ++i) {
                n_same += bud.tokens[i] == stock.tokens[i];
            }
            print_tokens("tokens:", bud.tokens);
            printf("  total %.3f MiB vs stock %.3f MiB; %d/%d tokens equal to stock\n", sum_bud / 1048576.0, stock.stock_kv_mib, n_same, N_GEN);
        }
        printf("(d) %s\n", pass_d ? "PASS (decoding ran within the budgets)" : "FAIL");
        ok = ok && pass_d;

        // (e)
        const std::vector<double> d2 = run_two_seqs(model, fa, tier_of_layer);
        const bool pass_e = d2.size() == 3 && d2[0] < 1e-2 && d2[1] < 1e-2 && d2[2] > 0.0;
        if (d2.size() == 3) {
            printf("(e) 2 seqs, kv_unified off, 2 tiers: stock vs tiered max |logit diff| %.3g; after removing seq 1's positions from tier 1: seq 0 %.3g (want 0), seq 1 %.3g (want > 0) -> %s\n",
                   d2[0], d2[1], d2[2], pass_e ? "PASS" : "FAIL");
        } else {
            printf("(e) FAIL: a run did not complete\n");
        }
        ok = ok && pass_e;
    }

    llama_model_free(model);
    llama_backend_free();

    printf("\n%s\n", ok ? "check_tiers: PASS" : "check_tiers: FAIL");
    return ok ? 0 : 1;
}
