// llama-spec shim: the contract of each function is in _cdef/90_shim.h (its only declaration).
#include "_shim.h"

#include "llama-ext.h"
#include "reasoning-budget.h"
#include "json-schema-to-grammar.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <numeric>
#include <string>
#include <vector>

extern "C" {

void lsp_set_embeddings_nextn(llama_context * ctx, bool value, bool masked) {
    llama_set_embeddings_nextn(ctx, value, masked);
}
float * lsp_get_embeddings_nextn(llama_context * ctx) { return llama_get_embeddings_nextn(ctx); }
void lsp_set_nextn_layer_offset(llama_context * ctx, int32_t offset) { llama_set_nextn_layer_offset(ctx, offset); }
int32_t lsp_model_n_devices(const llama_model * model) { return llama_model_n_devices(model); }
ggml_backend_dev_t lsp_model_get_device(const llama_model * model, int32_t i) {
    return llama_model_get_device(model, i);
}

bool lsp_abort_flag(void * data) {
    return data != nullptr && __atomic_load_n(static_cast<const int32_t *>(data), __ATOMIC_RELAXED) != 0;
}

static bool (*g_abort_python)(void *) = nullptr;
static int64_t g_abort_period_ns = 0;
static thread_local int64_t t_abort_next_ns = 0;   // this thread's next call of g_abort_python

void lsp_abort_set_python(bool (*check)(void *), int32_t period_us) {
    g_abort_python = check;
    g_abort_period_ns = (int64_t) std::max(period_us, 0) * 1000;
}

bool lsp_abort_main(void * data) {
    if (lsp_abort_flag(data)) {
        return true;
    }
    if (g_abort_python == nullptr) {
        return false;
    }
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    if (now < t_abort_next_ns) {
        return false;
    }
    t_abort_next_ns = now + g_abort_period_ns;
    return g_abort_python(data);
}

int32_t lsp_process(llama_context * ctx, llama_batch_ext * batch,
                    const int32_t * tokens, const int32_t * pos, int32_t n, int32_t seq_id,
                    const int8_t * outputs, const float * embd, int32_t n_embd) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, seq_id, tokens[i]);
        if (idx < 0) {
            return -100 - i;
        }
        if (!llama_batch_ext_set_pos(batch, idx, &pos[i])) {
            return -100 - i;
        }
        if (embd != nullptr) {
            llama_embd row = { embd + (size_t) i * n_embd, 1, (size_t) n_embd };
            if (!llama_batch_ext_set_embd_token(batch, idx, row)) {
                return -100 - i;
            }
        }
        const bool out = outputs ? outputs[i] != 0 : i == n - 1;
        if (out) {
            llama_batch_ext_set_output_logits(batch, idx, true);
        }
    }
    return llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
}

int32_t lsp_process_seqs(llama_context * ctx, llama_batch_ext * batch,
                         const int32_t * tokens, const int32_t * pos, int32_t n, const int32_t * seq_ids,
                         const int8_t * outputs) {
    llama_batch_ext_clear(batch);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch, seq_ids[i], tokens[i]);
        if (idx < 0 || !llama_batch_ext_set_pos(batch, idx, &pos[i])) {
            return -100 - i;
        }
        if (outputs[i] != 0) {
            llama_batch_ext_set_output_logits(batch, idx, true);
        }
    }
    return llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
}

int32_t lsp_process_seq_sets(llama_context * ctx, llama_batch_ext * batch,
                             const int32_t * tokens, const int32_t * pos, int32_t n,
                             const int32_t * seq_ids, const int32_t * n_seq, const int8_t * outputs) {
    llama_batch_ext_clear(batch);
    int32_t off = 0;
    for (int32_t i = 0; i < n; ++i) {
        if (n_seq[i] < 1) {
            return -100 - i;
        }
        const int32_t idx = llama_batch_ext_add_token(batch, seq_ids[off], tokens[i]);
        if (idx < 0) {
            return -100 - i;
        }
        for (int32_t j = 1; j < n_seq[i]; ++j) {  // add_seq before the other setters (llama.h)
            if (!llama_batch_ext_add_seq(batch, idx, seq_ids[off + j])) {
                return -100 - i;
            }
        }
        off += n_seq[i];
        if (!llama_batch_ext_set_pos(batch, idx, &pos[i])) {
            return -100 - i;
        }
        if (outputs[i] != 0) {
            llama_batch_ext_set_output_logits(batch, idx, true);
        }
    }
    return llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch);
}

void lsp_candidates_init(const float * logits, int32_t n_vocab, llama_token_data * buf, llama_token_data_array * cur) {
    for (int32_t i = 0; i < n_vocab; ++i) {
        buf[i].id    = i;
        buf[i].logit = logits[i];
        buf[i].p     = 0.0f;
    }
    cur->data     = buf;
    cur->size     = (size_t) n_vocab;
    cur->selected = -1;
    cur->sorted   = false;
}

int32_t lsp_candidates_probs(llama_token_data_array * cur, int32_t * ids, float * probs) {
    const size_t n = cur->size;
    if (n == 0) {
        return 0;
    }
    float max_l = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
        max_l = std::max(max_l, cur->data[i].logit);
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float l = cur->data[i].logit;
        const double e = (l == -INFINITY || max_l == -INFINITY) ? 0.0 : std::exp((double) l - (double) max_l);
        cur->data[i].p = (float) e;
        sum += e;
    }
    const double inv = sum > 0.0 ? 1.0 / sum : 0.0;
    for (size_t i = 0; i < n; ++i) {
        const float p = (float) ((double) cur->data[i].p * inv);
        cur->data[i].p = p;
        ids[i]   = cur->data[i].id;
        probs[i] = p;
    }
    return (int32_t) n;
}

// "a ranks before b": larger logit first, the lower id first among equal logits.
static inline bool ranks_before(const llama_token_data & a, const llama_token_data & b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The k best entries of a logits row, best first, in one pass: out[0..k) is a heap whose root
// is the worst entry kept, so almost every logit costs one comparison. O(n_vocab + k log k).
static void select_top_k(const float * logits, int32_t n_vocab, int32_t k, llama_token_data * out) {
    for (int32_t i = 0; i < k; ++i) {
        out[i] = { i, logits[i], 0.0f };
    }
    std::make_heap(out, out + k, ranks_before);
    for (int32_t i = k; i < n_vocab; ++i) {
        // ids grow, so an equal logit never displaces the (lower-id) entry kept
        if (logits[i] > out[0].logit) {
            std::pop_heap(out, out + k, ranks_before);
            out[k - 1] = { i, logits[i], 0.0f };
            std::push_heap(out, out + k, ranks_before);
        }
    }
    std::sort_heap(out, out + k, ranks_before);
}

int32_t lsp_candidates_init_top_k(const float * logits, int32_t n_vocab, int32_t k,
                                  llama_token_data * buf, llama_token_data_array * cur) {
    if (k <= 0 || k >= n_vocab) {
        lsp_candidates_init(logits, n_vocab, buf, cur);
        return n_vocab;
    }
    select_top_k(logits, n_vocab, k, buf);
    cur->data     = buf;
    cur->size     = (size_t) k;
    cur->selected = -1;
    cur->sorted   = true;
    return k;
}

int32_t lsp_top_n(const float * logits, int32_t n_vocab, int32_t n, int32_t * ids, float * vals) {
    n = std::max(0, std::min(n, n_vocab));
    if (n == 0) {
        return 0;
    }
    std::vector<llama_token_data> top((size_t) n);
    select_top_k(logits, n_vocab, n, top.data());
    for (int32_t i = 0; i < n; ++i) {
        ids[i]  = top[i].id;
        vals[i] = top[i].logit;
    }
    return n;
}

static std::vector<llama_tokens> unflatten(const int32_t * flat, const int32_t * lens, int32_t n) {
    std::vector<llama_tokens> out;
    size_t off = 0;
    for (int32_t i = 0; i < n; ++i) {
        out.emplace_back(flat + off, flat + off + lens[i]);
        off += (size_t) lens[i];
    }
    return out;
}

llama_sampler * lsp_reasoning_budget_init(
        const llama_vocab * vocab,
        const int32_t * start_seqs, const int32_t * start_lens, int32_t n_start,
        const int32_t * end_seqs,   const int32_t * end_lens,   int32_t n_end,
        const int32_t * forced, int32_t n_forced,
        int32_t budget, int32_t initial_state) {
    if (initial_state < REASONING_BUDGET_IDLE || initial_state > REASONING_BUDGET_DONE || n_start < 0 || n_end < 0 || n_forced < 0) {
        return nullptr;
    }
    return common_reasoning_budget_init(
            vocab, unflatten(start_seqs, start_lens, n_start), unflatten(end_seqs, end_lens, n_end),
            llama_tokens(forced, forced + n_forced), budget, (common_reasoning_budget_state) initial_state);
}

int32_t lsp_reasoning_budget_get_state(const llama_sampler * smpl) {
    return (int32_t) common_reasoning_budget_get_state(smpl);
}

bool lsp_reasoning_budget_force(llama_sampler * smpl) { return common_reasoning_budget_force(smpl); }

// Copy s (cut to cap - 1 bytes) NUL-terminated into out; out may be NULL when cap == 0.
static void copy_out(const std::string & s, char * out, size_t cap) {
    if (out == nullptr || cap == 0) {
        return;
    }
    const size_t n = std::min(s.size(), cap - 1);
    std::memcpy(out, s.data(), n);
    out[n] = '\0';
}

int32_t lsp_json_schema_to_grammar(const char * schema, char * out, size_t cap) {
    std::string err;
    try {
        const std::string grammar = json_schema_to_grammar(common_json::parse(schema ? schema : ""));
        if (grammar.size() < cap) {
            copy_out(grammar, out, cap);
        }
        return (int32_t) grammar.size();
    } catch (const std::exception & e) {  // common_json_error, std::invalid_argument, ...
        err = e.what();
    } catch (...) {
        err = "unknown error";
    }
    if (err.empty()) {
        err = "JSON schema conversion failed";
    }
    copy_out(err, out, cap);
    return -1 - (int32_t) err.size();
}

}  // extern "C"
