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

static llama_context_params base_cparams(bool fa) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx           = N_CTX;
    cp.n_batch         = N_BATCH;
    cp.n_ubatch        = N_UBATCH;
    cp.n_seq_max       = 1;
    cp.n_threads       = 2;
    cp.n_threads_batch = 2;
    cp.swa_full        = false; // window-sized SWA cache, as llama_kv_cache_iswa without swa_full
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    return cp;
}

static void set_tiers(llama_context_params & cp, const std::vector<uint32_t> & tier_of_layer,
                      const std::vector<uint32_t> & tier_cells) {
    cp.n_kv_tiers       = tier_cells.size();
    cp.kv_tier_of_layer = tier_of_layer.data();
    cp.kv_tier_cells    = tier_cells.data();
}

static llama_token argmax_token(const float * lg, int n_vocab) {
    return (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
}

// one greedy step: picks the argmax of the last logits (kept in `logits` when given) and decodes it
static bool greedy_step(llama_context * ctx, int n_vocab, std::vector<llama_token> & tokens,
                        std::vector<std::vector<float>> * logits) {
    const float * lg = llama_get_logits_ith(ctx, -1);
    if (logits) {
        logits->emplace_back(lg, lg + n_vocab);
    }
    llama_token tok = argmax_token(lg, n_vocab);
    tokens.push_back(tok);
    return llama_decode(ctx, llama_batch_get_one(&tok, 1)) == 0;
}

static bool prefill(llama_context * ctx, const std::vector<llama_token> & prompt) {
    std::vector<llama_token> tmp(prompt);
    for (size_t i = 0; i < tmp.size(); i += N_BATCH) {
        const int n = std::min<int>(N_BATCH, tmp.size() - i);
        if (llama_decode(ctx, llama_batch_get_one(tmp.data() + i, n)) != 0) {
            fprintf(stderr, "check_tiers: prefill failed\n");
            return false;
        }
    }
    return true;
}

// RM_ALL: the positions of (b) from every cache (stock memory, tiered == false: llama_memory_seq_rm per position)
static bool remove_from_all(llama_memory_t mem, bool tiered, size_t n_caches, const std::vector<llama_pos> & pos) {
    bool res = true;
    if (!tiered) {
        for (llama_pos p : pos) {
            res = res && llama_memory_seq_rm(mem, 0, p, p + 1);
        }
    } else {
        for (size_t t = 0; t < n_caches; ++t) {
            res = res && llama_memory_seq_rm_positions(mem, 0, t, pos.data(), pos.size());
        }
    }
    if (!res) {
        fprintf(stderr, "check_tiers: removing from every cache failed\n");
    }
    return res;
}

// RM_TIER1: the positions of (b) from tier 1 only; bad arguments must be refused
static bool remove_from_tier1(llama_memory_t mem, const std::vector<llama_pos> & pos) {
    if (!llama_memory_seq_rm_positions(mem, 0, 1, pos.data(), pos.size())) {
        fprintf(stderr, "check_tiers: llama_memory_seq_rm_positions failed\n");
        return false;
    }
    // bad arguments must be refused
    if (llama_memory_seq_rm_positions(mem, 0, 99, pos.data(), 1) ||
        llama_memory_seq_rm_positions(mem, 7, 1, pos.data(), 1)) {
        fprintf(stderr, "check_tiers: llama_memory_seq_rm_positions accepted bad arguments\n");
        return false;
    }
    return true;
}

// what run does on its context: prefill, the removal, N_GEN greedy tokens
static bool run_steps(llama_context * ctx, const llama_model * model, const std::vector<llama_token> & prompt,
                      const std::vector<uint32_t> * tier_cells, rm_mode remove, run_result & r) {
    llama_memory_t mem = llama_get_memory(ctx);
    if ((llama_memory_n_tiers(mem) != (tier_cells ? tier_cells->size() : 0))) {
        fprintf(stderr, "check_tiers: llama_memory_n_tiers = %u\n", llama_memory_n_tiers(mem));
        return false;
    }

    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    if (!prefill(ctx, prompt)) {
        return false;
    }
    if (tier_cells) {
        r.info_prefill = get_info(mem);
    }

    const std::vector<llama_pos> pos = rm_positions(prompt.size());
    if (remove == RM_ALL && !remove_from_all(mem, tier_cells != nullptr, r.info_prefill.size(), pos)) {
        return false;
    }
    if (remove == RM_TIER1) {
        if (!remove_from_tier1(mem, pos)) {
            return false;
        }
        r.info_removed = get_info(mem);
    }

    for (int i = 0; i < N_GEN; ++i) {
        if (!greedy_step(ctx, n_vocab, r.tokens, &r.logits)) {
            fprintf(stderr, "check_tiers: decode failed at step %d\n", i);
            return false;
        }
    }
    return true;
}

// tier_cells == nullptr: stock memory
// RM_TIER1: remove from tier 1 only; RM_ALL: remove from every cache (stock: llama_memory_seq_rm per position)
static run_result run(llama_model * model, const std::vector<llama_token> & prompt, bool fa,
                      const std::vector<uint32_t> * tier_of_layer, const std::vector<uint32_t> * tier_cells, rm_mode remove) {
    run_result r;

    llama_context_params cp = base_cparams(fa);
    if (tier_cells) {
        set_tiers(cp, *tier_of_layer, *tier_cells);
    }

    g_kv_mib = 0.0;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "check_tiers: llama_init_from_model failed\n");
        return r;
    }
    r.stock_kv_mib = g_kv_mib;

    r.ok = run_steps(ctx, model, prompt, tier_cells, remove, r);
    llama_free(ctx);
    return r;
}

// (d) real budgets: tier 0 holds everything, tier 1 at most 384 cells, tier 2 at most 128 cells (llama.cpp adds
// one ubatch to each). The prompt goes in ubatch-sized chunks; after every llama_decode, every position older than
// the last N_RECENT is removed from tier 1 unless even, and from tier 2 unless a multiple of 16
static const std::vector<uint32_t> BUDGET_CELLS = { 0, 384, 128 };

static bool budget_keep(uint32_t tier, llama_pos p) {
    return tier == 1 ? p % 2 == 0 : p % 16 == 0;
}

// the eviction of (d): what the last llama_decode made older than the last N_RECENT
struct budget_evictor {
    llama_memory_t mem;
    llama_pos n_past = 0;
    std::vector<llama_pos> done = std::vector<llama_pos>(BUDGET_CELLS.size(), 0); // positions below this were already handled

    bool evict() {
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
    }
};

// what run_budget does on its context: prefill in ubatches and N_GEN greedy tokens, evicting after each llama_decode
static bool budget_steps(llama_context * ctx, const llama_model * model, const std::vector<llama_token> & prompt,
                         run_result & r) {
    llama_memory_t mem = llama_get_memory(ctx);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    budget_evictor ev{mem};

    std::vector<llama_token> tmp(prompt);
    for (size_t i = 0; i < tmp.size(); i += N_UBATCH) {
        const int n = std::min<int>(N_UBATCH, tmp.size() - i);
        if (llama_decode(ctx, llama_batch_get_one(tmp.data() + i, n)) != 0) {
            fprintf(stderr, "check_tiers: budget prefill failed at token %zu\n", i);
            return false;
        }
        ev.n_past += n;
        if (!ev.evict()) {
            return false;
        }
    }
    r.info_prefill = get_info(mem);

    for (int i = 0; i < N_GEN; ++i) {
        if (!greedy_step(ctx, n_vocab, r.tokens, nullptr)) {
            fprintf(stderr, "check_tiers: budget decode failed at step %d\n", i);
            return false;
        }
        ev.n_past += 1;
        if (!ev.evict()) {
            return false;
        }
    }
    r.info_removed = get_info(mem);
    return true;
}

static run_result run_budget(llama_model * model, const std::vector<llama_token> & prompt, bool fa,
                             const std::vector<uint32_t> & tier_of_layer) {
    run_result r;

    llama_context_params cp = base_cparams(fa);
    set_tiers(cp, tier_of_layer, BUDGET_CELLS);

    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "check_tiers: llama_init_from_model failed (budget)\n");
        return r;
    }
    r.ok = budget_steps(ctx, model, prompt, r);
    llama_free(ctx);
    return r;
}

// (e) the batch of 100 tokens of each of the 2 sequences
static void fill_two_seqs_prompt(llama_batch & b) {
    for (int s = 0; s < 2; ++s) {
        for (int i = 0; i < 100; ++i) {
            const int k = b.n_tokens++;
            b.token[k] = 1000 + (i*7 + s*13) % 500; b.pos[k] = i; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = false;
        }
    }
}

// (e) the batch of one more token of each sequence, with logits
static void fill_two_seqs_next(llama_batch & b) {
    b.n_tokens = 0;
    for (int s = 0; s < 2; ++s) {
        const int k = b.n_tokens++;
        b.token[k] = 42; b.pos[k] = 100; b.n_seq_id[k] = 1; b.seq_id[k][0] = s; b.logits[k] = true;
    }
}

// (e) one run: stock (tol == nullptr) or 2 tiers, `rm`: positions of sequence 1 removed from tier 1 after the
// prompt; appends the next token's logits of both sequences to `out`
static bool run_two_seqs_once(llama_model * model, bool fa, const std::vector<uint32_t> * tol, bool rm,
                              std::vector<float> & out) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    const std::vector<uint32_t> cells = { 200, 200 };
    llama_context_params cp = base_cparams(fa);
    cp.n_ctx = 1024; cp.n_batch = 256; cp.n_seq_max = 2; cp.kv_unified = false;
    if (tol) {
        set_tiers(cp, *tol, cells);
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        return false;
    }
    llama_batch b = llama_batch_init(256, 0, 1);
    fill_two_seqs_prompt(b);
    bool ok = llama_decode(ctx, b) == 0;
    if (ok && rm) {
        std::vector<llama_pos> pos;
        for (llama_pos p = 1; p < 50; p += 2) {
            pos.push_back(p);
        }
        ok = llama_memory_seq_rm_positions(llama_get_memory(ctx), 1, 1, pos.data(), pos.size());
    }
    fill_two_seqs_next(b);
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
    std::vector<float> a, t, r;
    if (!run_two_seqs_once(model, fa, nullptr, false, a) || !run_two_seqs_once(model, fa, &tol, false, t) ||
        !run_two_seqs_once(model, fa, &tol, true, r)) {
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

static int n_equal(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    int n_same = 0;
    for (int i = 0; i < N_GEN; ++i) {
        n_same += a[i] == b[i];
    }
    return n_same;
}

static const char * cache_kind(size_t t) {
    return t < N_TIERS ? "tier" : "SWA ";
}

// reads the first N tokens of a text file (exits via the return value: false after a message)
static bool load_prompt(const llama_model * model, const char * path_text, int n_prompt, std::vector<llama_token> & prompt) {
    std::ifstream f(path_text);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    if (text.empty()) {
        fprintf(stderr, "check_tiers: cannot read %s\n", path_text);
        return false;
    }

    const llama_vocab * vocab = llama_model_get_vocab(model);
    prompt.assign(text.size() + 16, 0);
    const int n_tok = llama_tokenize(vocab, text.data(), text.size(), prompt.data(), prompt.size(), true, false);
    if (n_tok < n_prompt) {
        fprintf(stderr, "check_tiers: only %d tokens in %s\n", n_tok, path_text);
        return false;
    }
    prompt.resize(n_prompt);
    return true;
}

// tiers: contiguous blocks of the non-SWA layers. llama.cpp exposes no per-layer SWA flag, so for a model with
// a sliding window this assumes the Gemma 3 pattern (every 6th layer global), as llama.cpp's gemma3 loader does
static std::vector<uint32_t> make_tier_of_layer(const llama_model * model) {
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
    return tier_of_layer;
}

static void print_layout(const char * path_model, const llama_model * model, int n_prompt,
                         const std::vector<uint32_t> & tier_of_layer, uint32_t n_seq) {
    const int n_layer = llama_model_n_layer(model);
    const bool has_swa = llama_model_n_swa(model) > 0;
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
}

// what the checks of one flash attention setting share
struct check_inputs {
    llama_model * model;
    const std::vector<llama_token> & prompt;
    int n_prompt;
    bool fa;
    const std::vector<uint32_t> & tier_of_layer;
    const std::vector<uint32_t> & tier_cells;
};

// (a)
static bool check_a(const run_result & stock, const run_result & tiered) {
    const double max_diff = max_abs_diff(stock, tiered);
    const bool same = stock.tokens == tiered.tokens;
    const bool pass_a = same && max_diff < 1e-2;
    printf("(a) stock vs tiered (keep 1): tokens %s, max |logit diff| = %.3g over %d steps -> %s\n",
           same ? "equal" : "DIFFER", max_diff, N_GEN, pass_a ? "PASS" : "FAIL");
    print_tokens("stock tokens:", stock.tokens);
    print_tokens("tiered tokens:", tiered.tokens);
    return pass_a;
}

// (b): reported, not asserted
static void check_b(int n_prompt, const run_result & stock, const run_result & rm) {
    bool pass_b = rm.info_prefill.size() == rm.info_removed.size();
    printf("(b) remove every 2nd position older than the last %d from tier 1 (%d positions):\n",
           N_RECENT, (n_prompt - N_RECENT) / 2);
    for (size_t t = 0; t < rm.info_prefill.size() && pass_b; ++t) {
        const auto & a = rm.info_prefill[t];
        const auto & b = rm.info_removed[t];
        const bool expect_drop = t == 1;
        const bool good = expect_drop ? b.used < a.used : b.used == a.used;
        pass_b = pass_b && good;
        printf("  %s %zu: used cells %u -> %u (of %u)%s\n", cache_kind(t), t, a.used, b.used, b.total, good ? "" : "  <- unexpected");
    }
    const int n_same = n_equal(rm.tokens, stock.tokens);
    print_tokens("tokens after removal:", rm.tokens);
    printf("  decoding ran; %d/%d tokens equal to stock -> %s\n", n_same, N_GEN, pass_b ? "PASS" : "FAIL");
}

// (b'): the same positions removed from every cache must match stock llama_memory_seq_rm of those positions
static bool check_b_all(const run_result & stock_all, const run_result & rm_all) {
    const double diff_all = max_abs_diff(stock_all, rm_all);
    const bool pass_all = stock_all.tokens == rm_all.tokens && diff_all < 1e-2;
    printf("(b) same positions removed from every cache vs stock llama_memory_seq_rm: tokens %s, max |logit diff| = %.3g -> %s\n",
           stock_all.tokens == rm_all.tokens ? "equal" : "DIFFER", diff_all, pass_all ? "PASS" : "FAIL");
    return pass_all;
}

// (c)
static void check_c(const run_result & stock, const run_result & tiered) {
    size_t sum = 0;
    for (size_t t = 0; t < tiered.info_prefill.size(); ++t) {
        sum += tiered.info_prefill[t].bytes;
        printf("(c) %s %zu: %8.3f MiB (%u cells)\n", cache_kind(t), t,
               tiered.info_prefill[t].bytes / 1048576.0, tiered.info_prefill[t].total);
    }
    printf("(c) tiered total %.3f MiB vs stock KV cache %.3f MiB (n_ctx %d; stock from llama.cpp's log, 0.01 MiB steps)\n",
           sum / 1048576.0, stock.stock_kv_mib, N_CTX);
}

// (d)
static bool check_d(const check_inputs & in, const run_result & stock) {
    const run_result bud = run_budget(in.model, in.prompt, in.fa, in.tier_of_layer);
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
            printf("  %s %zu: used cells %u of %u, %8.3f MiB%s\n", cache_kind(t), t, ti.used, ti.total,
                   ti.bytes / 1048576.0, good ? "" : "  <- over budget");
        }
        const int n_same = n_equal(bud.tokens, stock.tokens);
        print_tokens("tokens:", bud.tokens);
        printf("  total %.3f MiB vs stock %.3f MiB; %d/%d tokens equal to stock\n", sum_bud / 1048576.0, stock.stock_kv_mib, n_same, N_GEN);
    }
    printf("(d) %s\n", pass_d ? "PASS (decoding ran within the budgets)" : "FAIL");
    return pass_d;
}

// (e)
static bool check_e(const check_inputs & in) {
    const std::vector<double> d2 = run_two_seqs(in.model, in.fa, in.tier_of_layer);
    const bool pass_e = d2.size() == 3 && d2[0] < 1e-2 && d2[1] < 1e-2 && d2[2] > 0.0;
    if (d2.size() == 3) {
        printf("(e) 2 seqs, kv_unified off, 2 tiers: stock vs tiered max |logit diff| %.3g; after removing seq 1's positions from tier 1: seq 0 %.3g (want 0), seq 1 %.3g (want > 0) -> %s\n",
               d2[0], d2[1], d2[2], pass_e ? "PASS" : "FAIL");
    } else {
        printf("(e) FAIL: a run did not complete\n");
    }
    return pass_e;
}

// (a) to (e) with one flash attention setting; false when one of (a), (b'), (d), (e) fails
static bool check_fa(const check_inputs & in) {
    printf("\n== flash attention %s ==\n", in.fa ? "on" : "off");

    const run_result stock     = run(in.model, in.prompt, in.fa, nullptr, nullptr, RM_NONE);
    const run_result tiered    = run(in.model, in.prompt, in.fa, &in.tier_of_layer, &in.tier_cells, RM_NONE);
    const run_result rm        = run(in.model, in.prompt, in.fa, &in.tier_of_layer, &in.tier_cells, RM_TIER1);
    const run_result stock_all = run(in.model, in.prompt, in.fa, nullptr, nullptr, RM_ALL);
    const run_result rm_all    = run(in.model, in.prompt, in.fa, &in.tier_of_layer, &in.tier_cells, RM_ALL);
    if (!stock.ok || !tiered.ok || !rm.ok || !stock_all.ok || !rm_all.ok) {
        printf("(a) FAIL: a run did not complete\n");
        return false;
    }

    bool ok = check_a(stock, tiered);
    check_b(in.n_prompt, stock, rm);
    ok = check_b_all(stock_all, rm_all) && ok;
    check_c(stock, tiered);
    ok = check_d(in, stock) && ok;
    ok = check_e(in) && ok;
    return ok;
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

    std::vector<llama_token> prompt;
    if (!load_prompt(model, path_text, n_prompt, prompt)) {
        return 1;
    }

    const std::vector<uint32_t> tier_of_layer = make_tier_of_layer(model);
    // every tier holds the whole sequence (= keep 1); llama.cpp adds one ubatch
    const uint32_t n_seq = n_prompt + N_GEN + 1;
    const std::vector<uint32_t> tier_cells(N_TIERS, n_seq);
    print_layout(path_model, model, n_prompt, tier_of_layer, n_seq);

    bool ok = true;
    std::vector<bool> fas;
    if (fa_arg == "both" || fa_arg == "off") fas.push_back(false);
    if (fa_arg == "both" || fa_arg == "on")  fas.push_back(true);

    for (bool fa : fas) {
        ok = check_fa({ model, prompt, n_prompt, fa, tier_of_layer, tier_cells }) && ok;
    }

    llama_model_free(model);
    llama_backend_free();

    printf("\n%s\n", ok ? "check_tiers: PASS" : "check_tiers: FAIL");
    return ok ? 0 : 1;
}
