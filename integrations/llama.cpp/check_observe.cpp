// Feasibility check: observing llama.cpp's prefill attention through cb_eval and scoring the cached positions with
// depthkv's scorers, then removing the lowest-scored positions from one tier of the tiered KV cache (patches/).
//   1. llama.cpp (patched, flash attention off, 3 tiers = 3 contiguous blocks of layers, each tier sized for the whole
//      prompt): the prompt is prefilled in ubatches of 128; cb_eval captures "kq_soft_max-<il>" (ne0 = n_kv cells,
//      ne1 = tokens of the ubatch, ne2 = query heads) for the rows of the last W = 16 prompt positions; the columns
//      are mapped to positions with llama_memory_tier_cell_pos (new in patch 0005) and each head's rows, gathered
//      over the held positions in position order, feed one depthkv::TokenScorer (SnapKV, window 16) per layer
//      exactly as depthkv's engine feeds its AttentionObserver.
//   2. depthkv's own engine (LlamaEngine on the same GGUF, F16 cache, the same token ids, observe_from = n - 16)
//      scores the same way; per layer: max |a - b| / max |b| over each KV head's scores, and the Jaccard index of
//      the kept sets at keep 0.2 (select_keep, sinks 4 / recent 16).
//   3. per tier: the scores of the tier's layers are aggregated (mean over layers and KV heads of each position's
//      rank fraction), select_keep picks the positions to keep at keep 0.2, the rest is removed from that tier only
//      (llama_memory_seq_rm_positions); 32 greedy tokens are decoded and compared with the full cache's, beside a
//      strided choice of the same size (protected + evenly spaced) as a baseline.
// usage: check_observe MODEL.gguf [n_prompt=600] [keep=0.2] [text=/usr/share/common-licenses/GPL-3]
// Exits 1 when anything errors, 0 otherwise (the agreement is reported, not asserted).
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <depthkv/eviction_schedule.hpp>
#include <depthkv/evictor.hpp>
#include <depthkv/llama/engine.hpp>
#include <depthkv/llama/gguf.hpp>
#include <depthkv/token_scorer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

static constexpr int N_GEN    = 32;
static constexpr int N_CTX    = 2048;
static constexpr int N_UBATCH = 128;
static constexpr int W        = 16;  // SnapKV observation window
static constexpr int N_TIERS  = 3;
static const depthkv::Protection PROT{4, 16};

static void log_cb(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || getenv("CHECK_OBSERVE_VERBOSE")) {
        fputs(text, stderr);
    }
}

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// rows of kq_soft_max-<il> captured during one llama_decode (one ubatch)
struct captured {
    bool    have = false;
    int     n_kv = 0, n_rows = 0, n_head = 0;
    int     t0 = 0;            // first captured row (token index in the ubatch)
    std::vector<float> data;   // [n_head][n_rows][n_kv]
};

struct observe_state {
    int n_layer = 0;
    int ub_p0 = 0;             // position of the ubatch's first token
    int obs_from = 0;          // first observed position
    int n_names = 0;           // kq_soft_max tensors seen in the data phase
    std::vector<captured> cap; // [n_layer]
    std::string error;
};

static int layer_of(const char * name) {
    static const char prefix[] = "kq_soft_max-";
    if (strncmp(name, prefix, sizeof(prefix) - 1) != 0) {
        return -1;
    }
    return atoi(name + sizeof(prefix) - 1);
}

static bool cb_eval(ggml_tensor * t, bool ask, void * ud) {
    auto * st = (observe_state *) ud;
    const int il = layer_of(t->name);
    if (ask) {
        return il >= 0; // ask for the data of these tensors only
    }
    if (il < 0) {
        return true;
    }
    st->n_names++;
    if (il >= st->n_layer) {
        st->error = std::string("unexpected tensor ") + t->name;
        return true;
    }
    // layout: ne0 = n_kv (cells), ne1 = tokens of the ubatch, ne2 = query heads, ne3 = streams (1 here)
    if (t->type != GGML_TYPE_F32 || t->ne[3] != 1 || t->nb[0] != sizeof(float) || t->nb[1] != t->ne[0] * sizeof(float) ||
        t->nb[2] != t->nb[1] * t->ne[1]) {
        st->error = std::string("unexpected layout of ") + t->name;
        return true;
    }
    const int n_kv = t->ne[0], n_tok = t->ne[1], n_head = t->ne[2];
    const int t0 = std::max(0, st->obs_from - st->ub_p0);
    captured & c = st->cap[il];
    c.have = false;
    if (t0 >= n_tok) {
        return true; // no observed row in this ubatch
    }
    c.have = true;
    c.n_kv = n_kv;
    c.n_rows = n_tok - t0;
    c.n_head = n_head;
    c.t0 = t0;
    c.data.resize((size_t) n_head * c.n_rows * n_kv);
    for (int h = 0; h < n_head; ++h) {
        ggml_backend_tensor_get(t, c.data.data() + (size_t) h * c.n_rows * n_kv, h * t->nb[2] + t0 * t->nb[1],
                                (size_t) c.n_rows * n_kv * sizeof(float));
    }
    return true;
}

static void fail(const std::string & msg) {
    fprintf(stderr, "check_observe: %s\n", msg.c_str());
    exit(1);
}

// rank fraction of each slot (0 = lowest score, 1 = highest; equal scores: the earlier slot ranks lower)
static std::vector<double> rank_fraction(const std::vector<float> & s) {
    const int n = s.size();
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return s[a] < s[b]; });
    std::vector<double> r(n);
    for (int i = 0; i < n; ++i) {
        r[idx[i]] = n > 1 ? (double) i / (n - 1) : 1.0;
    }
    return r;
}

static double jaccard(const std::vector<int32_t> & a, const std::vector<int32_t> & b) {
    std::set<int32_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
    int inter = 0;
    for (int32_t x : sa) {
        inter += sb.count(x);
    }
    const int uni = sa.size() + sb.size() - inter;
    return uni ? (double) inter / uni : 1.0;
}

struct gen_result {
    std::vector<llama_token> tokens;
    std::vector<uint32_t> used, total;
    std::vector<size_t> bytes;
};

static llama_context * make_ctx(llama_model * model, const std::vector<uint32_t> & tier_of_layer,
                                const std::vector<uint32_t> & tier_cells, observe_state * st) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx            = N_CTX;
    cp.n_batch          = N_UBATCH; // one ubatch per llama_decode: the ubatch's positions are known
    cp.n_ubatch         = N_UBATCH;
    cp.n_seq_max        = 1;
    cp.n_threads        = 2;
    cp.n_threads_batch  = 2;
    cp.flash_attn_type  = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.n_kv_tiers       = tier_cells.size();
    cp.kv_tier_of_layer = tier_of_layer.data();
    cp.kv_tier_cells    = tier_cells.data();
    if (st) {
        cp.cb_eval           = cb_eval;
        cp.cb_eval_user_data = st;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fail("llama_init_from_model failed");
    }
    return ctx;
}

static void prefill(llama_context * ctx, std::vector<llama_token> prompt, observe_state * st,
                    const std::function<void()> & after_ubatch = nullptr) {
    for (size_t i = 0; i < prompt.size(); i += N_UBATCH) {
        const int n = std::min<int>(N_UBATCH, prompt.size() - i);
        if (st) {
            st->ub_p0 = i;
            for (auto & c : st->cap) {
                c.have = false;
            }
        }
        if (llama_decode(ctx, llama_batch_get_one(prompt.data() + i, n)) != 0) {
            fail("prefill failed");
        }
        if (st && !st->error.empty()) {
            fail(st->error);
        }
        if (after_ubatch) {
            after_ubatch();
        }
    }
}

static gen_result generate(llama_context * ctx, const llama_vocab * vocab) {
    gen_result r;
    llama_memory_t mem = llama_get_memory(ctx);
    for (int t = 0; t < N_TIERS; ++t) {
        uint32_t u = 0, tot = 0;
        size_t b = 0;
        llama_memory_tier_info(mem, t, &u, &tot, &b);
        r.used.push_back(u);
        r.total.push_back(tot);
        r.bytes.push_back(b);
    }
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (int i = 0; i < N_GEN; ++i) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        llama_token tok = (llama_token) (std::max_element(lg, lg + n_vocab) - lg);
        r.tokens.push_back(tok);
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            fail("decode failed");
        }
    }
    return r;
}

static int n_equal(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    int k = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        k += a[i] == b[i];
    }
    return k;
}

static int n_prefix(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) {
        ++i;
    }
    return i;
}

// what the steps of main share
struct check_setup {
    llama_model * model = nullptr;
    const llama_vocab * vocab = nullptr;
    std::vector<llama_token> prompt;
    int n = 0; // prompt tokens
    int n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0;
    double keep = 0.0;
    int k_keep = 0;
    std::vector<uint32_t> tier_of_layer, tier_cells;
    depthkv::ScorerConfig scfg;
    const depthkv::llama::LlamaEngine * engine = nullptr;
};

// Observes the prefill in llama.cpp and in depthkv's engine and compares the scores. With `hole`, positions
// [HOLE0, HOLE1) are removed from every cache after the first ubatch (llama_memory_seq_rm; depthkv:
// drop_positions), so the next ubatch's tokens land in the freed cells and the cell order is no longer the
// position order: the cell -> position mapping is then really exercised. `naive` scorers read the columns in
// cell order instead (what one gets without the mapping).
static constexpr int HOLE0 = 8, HOLE1 = 72;
struct observed {
    std::vector<depthkv::LayerScores> s_ll, s_dk, s_naive;
    std::vector<std::vector<int32_t>> tier_positions; // [tier] held positions, ascending
    bool cells_permuted = false;
};

// llama.cpp's side of one observation: the scorers fed from cb_eval's captures, and what is reported of it
struct ll_observation {
    std::vector<depthkv::TokenScorer> sc_ll, sc_naive;
    observe_state st;
    std::vector<llama_pos> cell_pos;
    std::vector<float> rows, rows_naive;
    int max_n_kv = 0, n_observed_blocks = 0;
    std::vector<float> last_ll; // logits of the last prompt token
    double t_ll = 0.0;
};

// feeds layer il's captured rows to its scorers, the columns gathered in position order (sc_ll) and in cell order
// (sc_naive)
static void observe_layer(const check_setup & cs, llama_memory_t mem, int il, ll_observation & lo, observed & o) {
    const captured & c = lo.st.cap[il];
    const int32_t n_cells = llama_memory_tier_cell_pos(mem, 0, cs.tier_of_layer[il], nullptr, 0);
    if (n_cells < c.n_kv) {
        fail("llama_memory_tier_cell_pos returned fewer cells than kq_soft_max has columns");
    }
    lo.cell_pos.assign(n_cells, -1);
    llama_memory_tier_cell_pos(mem, 0, cs.tier_of_layer[il], lo.cell_pos.data(), n_cells);
    // held (position, cell) in cell order, then in position order
    std::vector<std::pair<llama_pos, int>> held, by_cell;
    for (int i = 0; i < n_cells; ++i) {
        if (lo.cell_pos[i] >= 0) {
            by_cell.push_back({lo.cell_pos[i], i});
        }
    }
    held = by_cell;
    std::sort(held.begin(), held.end());
    o.cells_permuted |= held != by_cell;
    const int n_slots = held.size();
    lo.max_n_kv = std::max(lo.max_n_kv, c.n_kv);
    lo.rows.assign((size_t) c.n_rows * n_slots, 0.0f);
    lo.rows_naive.assign((size_t) c.n_rows * n_slots, 0.0f);
    for (int h = 0; h < c.n_head; ++h) {
        for (int r = 0; r < c.n_rows; ++r) {
            const float * src = c.data.data() + ((size_t) h * c.n_rows + r) * c.n_kv;
            float * dst = lo.rows.data() + (size_t) r * n_slots;
            float * dst_naive = lo.rows_naive.data() + (size_t) r * n_slots;
            for (int j = 0; j < n_slots; ++j) {
                dst[j] = held[j].second < c.n_kv ? src[held[j].second] : 0.0f; // past n_kv: masked
                dst_naive[j] = by_cell[j].second < c.n_kv ? src[by_cell[j].second] : 0.0f;
            }
        }
        // the AttentionObserver contract: (layer, q_head, p0, n_rows, probs, ld, n_slots)
        lo.sc_ll[il].observe_block(h, lo.st.ub_p0 + c.t0, c.n_rows, lo.rows.data(), n_slots, n_slots);
        lo.sc_naive[il].observe_block(h, lo.st.ub_p0 + c.t0, c.n_rows, lo.rows_naive.data(), n_slots, n_slots);
        lo.n_observed_blocks++;
    }
}

// after each ubatch of the prefill: the hole (after the first one), then the captured rows of every layer
static void observe_ubatch(const check_setup & cs, llama_memory_t mem, bool hole, ll_observation & lo, observed & o) {
    if (hole && lo.st.ub_p0 == 0 && !llama_memory_seq_rm(mem, 0, HOLE0, HOLE1)) {
        fail("llama_memory_seq_rm failed");
    }
    for (int il = 0; il < cs.n_layer; ++il) {
        if (!lo.st.cap[il].have) {
            continue;
        }
        observe_layer(cs, mem, il, lo, o);
    }
}

// the held positions of each tier, ascending
static void read_tier_positions(llama_memory_t mem, std::vector<llama_pos> & cell_pos, observed & o) {
    o.tier_positions.resize(N_TIERS);
    for (int t = 0; t < N_TIERS; ++t) {
        const int32_t nc = llama_memory_tier_cell_pos(mem, 0, t, nullptr, 0);
        cell_pos.assign(nc, -1);
        llama_memory_tier_cell_pos(mem, 0, t, cell_pos.data(), nc);
        for (llama_pos p : cell_pos) {
            if (p >= 0) {
                o.tier_positions[t].push_back(p);
            }
        }
        std::sort(o.tier_positions[t].begin(), o.tier_positions[t].end());
    }
}

// the llama.cpp prefill with observation: fills lo's scorers, last_ll and t_ll, and o.tier_positions
static void observe_llama(const check_setup & cs, bool hole, ll_observation & lo, observed & o) {
    lo.sc_ll = depthkv::make_scorers(cs.n_layer, cs.scfg, cs.n_head, cs.n_head_kv);
    lo.sc_naive = depthkv::make_scorers(cs.n_layer, cs.scfg, cs.n_head, cs.n_head_kv);
    lo.st.n_layer = cs.n_layer;
    lo.st.obs_from = cs.n - W;
    lo.st.cap.resize(cs.n_layer);
    lo.t_ll = now_s();
    llama_context * ctx = make_ctx(cs.model, cs.tier_of_layer, cs.tier_cells, &lo.st);
    llama_memory_t mem = llama_get_memory(ctx);
    prefill(ctx, cs.prompt, &lo.st, [&]() { observe_ubatch(cs, mem, hole, lo, o); });
    lo.t_ll = now_s() - lo.t_ll;
    const float * lg_ll = llama_get_logits_ith(ctx, -1);
    lo.last_ll.assign(lg_ll, lg_ll + cs.n_vocab);
    read_tier_positions(mem, lo.cell_pos, o);
    // the new call's argument checks
    if (llama_memory_tier_cell_pos(mem, 0, 99, nullptr, 0) != -1 || llama_memory_tier_cell_pos(mem, 5, 0, nullptr, 0) != -1 ||
        llama_memory_tier_cell_pos(mem, 0, 0, nullptr, 4) != -1) {
        fail("llama_memory_tier_cell_pos accepted bad arguments");
    }
    llama_free(ctx);
    printf("\n[%s] llama.cpp prefill with observation: %.1f s, %d kq_soft_max tensors seen, %d head blocks observed, "
           "largest n_kv %d, %zu positions held, cell order %s position order\n",
           hole ? "hole" : "plain", lo.t_ll, lo.st.n_names, lo.n_observed_blocks, lo.max_n_kv, o.tier_positions[0].size(),
           o.cells_permuted ? "differs from" : "equals");
}

// depthkv's engine on the same prompt (with the same hole): compares its logits with llama.cpp's, checks the held
// positions and computes the three sets of layer scores of o
static void observe_depthkv(const check_setup & cs, bool hole, const ll_observation & lo, observed & o) {
    double t_dk = now_s();
    auto dk_cache = cs.engine->make_cache<Eigen::half>();
    std::vector<depthkv::TokenScorer> sc_dk = depthkv::make_scorers(cs.n_layer, cs.scfg, cs.n_head, cs.n_head_kv);
    depthkv::llama::ForwardOptions fo;
    fo.n_threads = 2;
    fo.all_logits = false;
    fo.chunk_size = N_UBATCH;
    fo.observer = depthkv::observe_into(sc_dk);
    fo.observe_from = cs.n - W;
    if (hole) {
        fo.after_chunk = [&](int done, int32_t) {
            if (done != N_UBATCH) return;
            std::vector<int32_t> kept;
            for (int l = 0; l < dk_cache.n_layers(); ++l)
                for (int h = 0; h < cs.n_head_kv; ++h) depthkv::drop_positions(dk_cache.layer(l), h, HOLE0, HOLE1 - 1, kept);
        };
    }
    std::vector<int> ids(cs.prompt.begin(), cs.prompt.end());
    depthkv::llama::RowMatrix lg_dk = cs.engine->prefill(ids, 0, dk_cache, fo);
    t_dk = now_s() - t_dk;
    const std::vector<float> & last_ll = lo.last_ll;
    double max_dlogit = 0.0;
    for (int v = 0; v < cs.n_vocab && v < lg_dk.cols(); ++v) {
        max_dlogit = std::max(max_dlogit, (double) std::fabs(lg_dk(0, v) - last_ll[v]));
    }
    int am_dk = 0;
    lg_dk.row(0).maxCoeff(&am_dk);
    const int am_ll = std::max_element(last_ll.begin(), last_ll.end()) - last_ll.begin();
    printf("[%s] depthkv engine prefill (F16 cache, chunks of %d): %.1f s; last-token logits: max |dlogit| %.3f, "
           "argmax %s (%d vs %d)\n", hole ? "hole" : "plain", N_UBATCH, t_dk, max_dlogit,
           am_dk == am_ll ? "equal" : "differs", am_ll, am_dk);
    for (int t = 0; t < N_TIERS; ++t) {
        const int32_t * p = dk_cache.layer(0).positions(0);
        if (std::vector<int32_t>(p, p + dk_cache.layer(0).size(0)) != o.tier_positions[t]) {
            fail("llama.cpp and depthkv hold different positions");
        }
    }

    o.s_dk = depthkv::layer_scores(sc_dk, dk_cache);
    o.s_ll = depthkv::layer_scores(lo.sc_ll, dk_cache); // SnapKV reads the slot count only
    o.s_naive = depthkv::layer_scores(lo.sc_naive, dk_cache);
}

// agreement of one layer's scores a (llama.cpp) with b (depthkv) over its KV heads: the largest max|a-b|/max|b|,
// and the min and sum of the Jaccard indices of the kept sets (keep kk)
struct layer_agreement {
    double rel = 0.0, jmin = 1.0, jsum = 0.0;
};

static layer_agreement compare_layer(const check_setup & cs, const depthkv::LayerScores & sa,
                                     const depthkv::LayerScores & sb, int kk) {
    layer_agreement la;
    for (int h = 0; h < cs.n_head_kv; ++h) {
        const auto & a = sa[h];
        const auto & b = sb[h];
        if (a.size() != b.size()) {
            fail("score rows of different lengths");
        }
        double md = 0.0, mb = 0.0;
        for (size_t j = 0; j < a.size(); ++j) {
            md = std::max(md, (double) std::fabs(a[j] - b[j]));
            mb = std::max(mb, (double) std::fabs(b[j]));
        }
        la.rel = std::max(la.rel, mb > 0 ? md / mb : md);
        const auto ka = depthkv::select_keep(a.data(), nullptr, a.size(), kk, PROT);
        const auto kb = depthkv::select_keep(b.data(), nullptr, b.size(), kk, PROT);
        const double jac = jaccard(ka, kb);
        la.jmin = std::min(la.jmin, jac);
        la.jsum += jac;
    }
    return la;
}

// variant 0: the mapped llama.cpp scores, 1: the naive ones (cell order), against depthkv's
static void compare_variant(const check_setup & cs, const observed & o, bool hole, int variant, bool per_layer) {
    const auto & sa = variant ? o.s_naive : o.s_ll;
    double worst_rel = 0.0, sum_j = 0.0, min_j = 1.0;
    const int n_held = o.tier_positions[0].size();
    const int kk = depthkv::keep_tokens(cs.keep, n_held, PROT);
    for (int il = 0; il < cs.n_layer; ++il) {
        const layer_agreement la = compare_layer(cs, sa[il], o.s_dk[il], kk);
        worst_rel = std::max(worst_rel, la.rel);
        sum_j += la.jsum / cs.n_head_kv;
        min_j = std::min(min_j, la.jmin);
        if (per_layer && variant == 0) {
            printf("  layer %2d (tier %u): rel %.2e  Jaccard min %.3f mean %.3f\n", il, cs.tier_of_layer[il], la.rel,
                   la.jmin, la.jsum / cs.n_head_kv);
        }
    }
    printf("[%s]%s all layers: worst rel %.2e, Jaccard (keep %d of %d) min %.3f, mean %.3f\n", hole ? "hole" : "plain",
           variant ? " cell order, no mapping (wrong on purpose):" : "", worst_rel, kk, n_held, min_j,
           sum_j / cs.n_layer);
}

static observed observe_and_compare(const check_setup & cs, bool hole, bool per_layer) {
    observed o;
    ll_observation lo;
    observe_llama(cs, hole, lo, o);
    observe_depthkv(cs, hole, lo, o);
    if (per_layer) {
        printf("per layer: max|a-b|/max|b| over each KV head's SnapKV scores (a = llama.cpp, b = depthkv), and the "
               "Jaccard index of the kept sets at keep %.2f (%d of %d, sinks %d, recent %d), min/mean over KV heads\n",
               cs.keep, cs.k_keep, cs.n, PROT.n_sink, PROT.n_recent);
    }
    for (int variant = 0; variant < (hole ? 2 : 1); ++variant) {
        compare_variant(cs, o, hole, variant, per_layer);
    }
    return o;
}

// the positions kept in each tier by the observed scores, by depthkv's and by the strided baseline
struct tier_selection {
    std::vector<std::vector<int32_t>> keep = std::vector<std::vector<int32_t>>(N_TIERS);
    std::vector<std::vector<int32_t>> keep_dk = std::vector<std::vector<int32_t>>(N_TIERS);
    std::vector<std::vector<int32_t>> strided = std::vector<std::vector<int32_t>>(N_TIERS);
};

// aggregation: the mean over the tier's layers and KV heads of each position's rank fraction
static std::vector<float> aggregate_tier(const check_setup & cs, const std::vector<depthkv::LayerScores> & s, int t) {
    std::vector<double> agg(cs.n, 0.0);
    int cnt = 0;
    for (int il = 0; il < cs.n_layer; ++il) {
        if ((int) cs.tier_of_layer[il] != t) {
            continue;
        }
        for (int h = 0; h < cs.n_head_kv; ++h) {
            const auto r = rank_fraction(s[il][h]);
            for (int j = 0; j < cs.n; ++j) {
                agg[j] += r[j];
            }
            cnt++;
        }
    }
    std::vector<float> a(cs.n);
    for (int j = 0; j < cs.n; ++j) {
        a[j] = agg[j] / cnt;
    }
    return a;
}

// baseline: the protected positions and evenly spaced ones in between, as many
static std::vector<int32_t> strided_positions(int n, int k_keep) {
    std::vector<int32_t> res;
    const int lo = PROT.n_sink, hi = n - PROT.n_recent, m = k_keep - lo - (n - hi);
    for (int j = 0; j < lo; ++j) res.push_back(j);
    for (int i = 0; i < m; ++i) res.push_back(lo + (int) ((double) (i + 0.5) * (hi - lo) / m));
    for (int j = hi; j < n; ++j) res.push_back(j);
    return res;
}

// ---- 3. per tier: aggregate, select (removal and decoding: report_removals)
static tier_selection select_tiers(const check_setup & cs, const observed & plain) {
    const auto & tier_positions = plain.tier_positions;
    tier_selection sel;
    for (int t = 0; t < N_TIERS; ++t) {
        const std::vector<float> a = aggregate_tier(cs, plain.s_ll, t);
        const std::vector<float> b = aggregate_tier(cs, plain.s_dk, t);
        // slot j of the tier holds position tier_positions[t][j] (= j here)
        const auto kept = depthkv::select_keep(a.data(), tier_positions[t].data(), cs.n, cs.k_keep, PROT);
        const auto kept_dk = depthkv::select_keep(b.data(), tier_positions[t].data(), cs.n, cs.k_keep, PROT);
        for (int32_t s : kept) {
            sel.keep[t].push_back(tier_positions[t][s]);
        }
        for (int32_t s : kept_dk) {
            sel.keep_dk[t].push_back(tier_positions[t][s]);
        }
        sel.strided[t] = strided_positions(cs.n, cs.k_keep);
    }
    printf("\ntier-level selection (mean rank fraction over the tier's layers and KV heads), keep %d of %d:\n", cs.k_keep, cs.n);
    for (int t = 0; t < N_TIERS; ++t) {
        printf("  tier %d: Jaccard(llama.cpp-observed, depthkv-engine) of the kept positions %.3f\n", t,
               jaccard(sel.keep[t], sel.keep_dk[t]));
    }
    return sel;
}

static std::vector<llama_pos> removed_of(int n, const std::vector<int32_t> & kept_pos) {
    std::vector<char> k(n, 0);
    for (int32_t p : kept_pos) k[p] = 1;
    std::vector<llama_pos> rm;
    for (int p = 0; p < n; ++p) if (!k[p]) rm.push_back(p);
    return rm;
}

using tier_removals = std::vector<std::pair<int, std::vector<llama_pos>>>;

static gen_result run_removal(const check_setup & cs, const tier_removals & removals) {
    llama_context * c = make_ctx(cs.model, cs.tier_of_layer, cs.tier_cells, nullptr);
    prefill(c, cs.prompt, nullptr);
    llama_memory_t m = llama_get_memory(c);
    for (const auto & tr : removals) {
        if (!llama_memory_seq_rm_positions(m, 0, tr.first, tr.second.data(), tr.second.size())) {
            fail("llama_memory_seq_rm_positions failed");
        }
    }
    gen_result g = generate(c, cs.vocab);
    llama_free(c);
    return g;
}

static std::string piece(const llama_vocab * vocab, const std::vector<llama_token> & toks) {
    std::string s;
    char b[256];
    for (llama_token tk : toks) {
        const int k = llama_token_to_piece(vocab, tk, b, sizeof(b), 0, true);
        if (k > 0) s.append(b, k);
    }
    for (char & ch : s) if (ch == '\n') ch = ' ';
    return s;
}

static void describe(const check_setup & cs, const char * what, const gen_result & g, const gen_result & full) {
    printf("  %-34s cells used", what);
    for (int t = 0; t < N_TIERS; ++t) printf(" %u/%u", g.used[t], g.total[t]);
    printf(", tokens equal to the full cache %2d/%d (common prefix %2d)\n", n_equal(g.tokens, full.tokens), N_GEN,
           n_prefix(g.tokens, full.tokens));
    printf("      \"%s\"\n", piece(cs.vocab, g.tokens).c_str());
}

// removal from each tier only, then from all tiers, and N_GEN greedy tokens, against the full cache's
static void report_removals(const check_setup & cs, const tier_selection & sel) {
    const gen_result full = run_removal(cs, {});
    printf("\ndecoding %d greedy tokens after the removal (tier bytes: ", N_GEN);
    for (int t = 0; t < N_TIERS; ++t) printf("%s%.3f MiB", t ? ", " : "", full.bytes[t] / 1048576.0);
    printf("; the removal frees cells, not bytes: each tier's buffer keeps its size)\n");
    describe(cs, "full cache", full, full);
    for (int t = 0; t < N_TIERS; ++t) {
        char buf[64];
        snprintf(buf, sizeof(buf), "tier %d, SnapKV (observed)", t);
        describe(cs, buf, run_removal(cs, {{t, removed_of(cs.n, sel.keep[t])}}), full);
        snprintf(buf, sizeof(buf), "tier %d, strided baseline", t);
        describe(cs, buf, run_removal(cs, {{t, removed_of(cs.n, sel.strided[t])}}), full);
    }
    tier_removals all, all_s;
    for (int t = 0; t < N_TIERS; ++t) {
        all.push_back({t, removed_of(cs.n, sel.keep[t])});
        all_s.push_back({t, removed_of(cs.n, sel.strided[t])});
    }
    describe(cs, "all tiers, SnapKV (observed)", run_removal(cs, all), full);
    describe(cs, "all tiers, strided baseline", run_removal(cs, all_s), full);
}

// the first n_prompt tokens of the text into cs.prompt, cs.n
static void load_prompt(check_setup & cs, const char * path_text, int n_prompt) {
    std::ifstream f(path_text);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    cs.prompt.assign(text.size() + 16, 0);
    const int n_tok = llama_tokenize(cs.vocab, text.data(), text.size(), cs.prompt.data(), cs.prompt.size(), true, false);
    if (n_tok < n_prompt) {
        fail("too few tokens in " + std::string(path_text));
    }
    cs.prompt.resize(n_prompt);
    cs.n = n_prompt;
}

// 3 tiers = 3 contiguous blocks of layers, each tier sized for the whole prompt
static void make_tiers(check_setup & cs) {
    cs.n_layer = llama_model_n_layer(cs.model);
    cs.n_head = llama_model_n_head(cs.model);
    cs.n_head_kv = llama_model_n_head_kv(cs.model);
    cs.tier_of_layer.resize(cs.n_layer);
    for (int il = 0; il < cs.n_layer; ++il) {
        cs.tier_of_layer[il] = (uint32_t) (il * N_TIERS / cs.n_layer);
    }
    cs.tier_cells.assign(N_TIERS, cs.n + N_GEN + 1);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [n_prompt=600] [keep=0.2] [text=/usr/share/common-licenses/GPL-3]\n", argv[0]);
        return 2;
    }
    const char * path_model = argv[1];
    const int    n_prompt   = argc > 2 ? atoi(argv[2]) : 600;
    const double keep       = argc > 3 ? atof(argv[3]) : 0.2;
    const char * path_text  = argc > 4 ? argv[4] : "/usr/share/common-licenses/GPL-3";

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    check_setup cs;
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    cs.model = llama_model_load_from_file(path_model, mp);
    if (!cs.model) {
        fail(std::string("cannot load ") + path_model);
    }
    if (llama_model_n_swa(cs.model) > 0) {
        fail("this check handles models without sliding-window layers only (e.g. SmolLM2)");
    }

    cs.vocab = llama_model_get_vocab(cs.model);
    load_prompt(cs, path_text, n_prompt);
    const int n = cs.n;

    make_tiers(cs);
    printf("model %s: %d layers, %d heads, %d KV heads; prompt %d tokens, ubatch %d, FA off, window %d, keep %.2f\n",
           path_model, cs.n_layer, cs.n_head, cs.n_head_kv, n, N_UBATCH, W, keep);

    cs.scfg.kind = depthkv::ScorerKind::kSnapKV; // window 16, kernel 7, max pooling (the defaults)
    cs.scfg.window = W;

    cs.keep = keep;
    cs.k_keep = depthkv::keep_tokens(keep, n, PROT);
    depthkv::llama::LlamaModel dk_model = depthkv::llama::load_gguf(path_model);
    depthkv::llama::LlamaEngine engine(dk_model);
    cs.engine = &engine;
    cs.n_vocab = llama_vocab_n_tokens(cs.vocab);

    const observed plain = observe_and_compare(cs, false, true);
    observe_and_compare(cs, true, false);
    for (int t = 0; t < N_TIERS; ++t) {
        if ((int) plain.tier_positions[t].size() != n) {
            fail("tier " + std::to_string(t) + " does not hold every prompt position");
        }
    }

    const tier_selection sel = select_tiers(cs, plain);
    report_removals(cs, sel);

    llama_model_free(cs.model);
    return 0;
}
