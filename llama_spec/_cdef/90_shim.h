/* llama-spec's shim (llama_spec/_shim.cpp): the few extern "C" entry points Python needs that
 * llama.h does not give. This file is the only place they are declared: cffi reads it as the
 * cdef of the shim (with the other files of _cdef/), and _shim.h includes it for the C++ side,
 * so the two cannot drift apart. Plain C declarations only (cffi's parser): no #include, no
 * macros; the types come from llama.h, which every includer has seen first.
 *
 *  - the MTP staging API (src/llama-ext.h has C++ linkage),
 *  - llama.cpp's reasoning-budget sampler (common/reasoning-budget.h, C++),
 *  - "one call instead of a hundred" helpers for the hot path: filling and decoding a batch,
 *    turning a logits row into the candidate array the sampler chain works on.
 *
 * Contracts: pointers must be valid for the stated lengths; nothing here takes ownership
 * unless it says so, and no function keeps a pointer to caller memory after it returns.
 */

/* ---- MTP staging API and model devices (forwarders) ---- */
void    lsp_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked);
float * lsp_get_embeddings_nextn(struct llama_context * ctx);
void    lsp_set_nextn_layer_offset(struct llama_context * ctx, int32_t offset);
int32_t lsp_model_n_devices(const struct llama_model * model);
ggml_backend_dev_t lsp_model_get_device(const struct llama_model * model, int32_t i);

/* ---- aborting a decode from any thread ----
 * A ggml abort callback (llama_set_abort_callback) that reads a flag: `data` points to an
 * int32_t that any thread may set to non-zero (Context.abort()); the decode then stops at the
 * next graph node with code 2. Runs no Python, so a decode off the main thread pays nothing. */
bool    lsp_abort_flag(void * data);

/* The main thread's callback: lsp_abort_flag, then at most once per `period_us` (per thread) the
 * `check` set by lsp_abort_set_python, which runs Python so that a pending SIGINT handler can
 * stop the decode. Python at every graph node cost ~0.9 us per node (ggml's threads wait at each
 * node for thread 0's callback): 0.47 ms of an 8.8-ms SmolLM2-135M decode (scripts/bench_abort_callback.py).
 * requires: lsp_abort_set_python called before a decode uses it (else it is lsp_abort_flag). */
void    lsp_abort_set_python(bool (*check)(void *), int32_t period_us);
bool    lsp_abort_main(void * data);

/* ---- batches ----
 * Fill `batch` (from llama_batch_ext_init) with n tokens of one sequence and decode it.
 * outputs[i] != 0 asks for logits (and embeddings) of row i; outputs may be NULL = last only.
 * embd, when not NULL, is n rows of n_embd floats paired with the tokens (MTP input rows).
 * Returns llama_process's code, or -100 - i when adding row i failed (batch full / bad token). */
int32_t lsp_process(struct llama_context * ctx, struct llama_batch_ext * batch,
                    const int32_t * tokens, const int32_t * pos, int32_t n, int32_t seq_id,
                    const int8_t * outputs, const float * embd, int32_t n_embd);

/* The same for a batch of many sequences (batched generation): row i belongs to seq_ids[i];
 * outputs[i] != 0 asks for the logits of row i (outputs must not be NULL). No embd rows. */
int32_t lsp_process_seqs(struct llama_context * ctx, struct llama_batch_ext * batch,
                         const int32_t * tokens, const int32_t * pos, int32_t n, const int32_t * seq_ids,
                         const int8_t * outputs);

/* A tree batch: row i belongs to the n_seq[i] sequences seq_ids[off_i .. off_i + n_seq[i] - 1]
 * (off_i = n_seq[0] + .. + n_seq[i - 1]; n_seq[i] >= 1): its KV cell is shared by all of them
 * (a unified KV cache is needed). outputs must not be NULL. No embd rows. */
int32_t lsp_process_seq_sets(struct llama_context * ctx, struct llama_batch_ext * batch,
                             const int32_t * tokens, const int32_t * pos, int32_t n,
                             const int32_t * seq_ids, const int32_t * n_seq, const int8_t * outputs);

/* ---- candidates ----
 * Write the full-vocabulary candidate array for one logits row into `buf` (n_vocab entries:
 * id = i, logit = logits[i], p = 0) and point `cur` at it (size n_vocab, unsorted, selected -1). */
void    lsp_candidates_init(const float * logits, int32_t n_vocab,
                            llama_token_data * buf, llama_token_data_array * cur);

/* The same array already cut to the k largest logits (what llama.cpp's top-k sampler would
 * leave), sorted by logit descending with ties broken by the lower id, sorted = true; one pass
 * over the row, no full-vocabulary write. Only valid when every sampler before top-k in the
 * chain is absent (logit bias, penalties, DRY, top-n-sigma, grammar, budget can all move a
 * token across the k-th place). k <= 0 or k >= n_vocab: same as lsp_candidates_init.
 * Returns the array's size. */
int32_t lsp_candidates_init_top_k(const float * logits, int32_t n_vocab, int32_t k,
                                  llama_token_data * buf, llama_token_data_array * cur);

/* Softmax over cur->data[0..size) (the chain already applied temperature), writing each
 * entry's p and copying (id, p) out to ids/probs in the array's order. Returns size.
 * Entries with logit == -INFINITY get p = 0. Double accumulation: p sums to 1 within 1e-6. */
int32_t lsp_candidates_probs(llama_token_data_array * cur, int32_t * ids, float * probs);

/* Top-n entries of a logits row by logit, descending (ties by id): ids and logits out.
 * Used by the draft statistics; one pass, O(n_vocab + n log n). Returns n (<= n_vocab). */
int32_t lsp_top_n(const float * logits, int32_t n_vocab, int32_t n, int32_t * ids, float * vals);

/* ---- reasoning budget (common/reasoning-budget.h) ----
 * Sequences are passed flattened: seqs[] holds all tokens, lens[] each sequence's length.
 * initial_state: 0 IDLE, 1 COUNTING, 2 FORCING, 3 WAITING_UTF8, 4 DONE.
 * Returns a sampler owned by the caller (llama_sampler_free), or NULL on bad input. */
struct llama_sampler * lsp_reasoning_budget_init(
        const struct llama_vocab * vocab,
        const int32_t * start_seqs, const int32_t * start_lens, int32_t n_start,
        const int32_t * end_seqs,   const int32_t * end_lens,   int32_t n_end,
        const int32_t * forced, int32_t n_forced,
        int32_t budget, int32_t initial_state);
int32_t lsp_reasoning_budget_get_state(const struct llama_sampler * smpl);
bool    lsp_reasoning_budget_force(struct llama_sampler * smpl);

/* ---- JSON schema -> GBNF (common/json-schema-to-grammar.h, llama.cpp's own converter) ----
 * Convert the JSON text `schema` (NUL-terminated) to a GBNF grammar. On success returns the
 * grammar's length n >= 0 and, when n < cap, writes it NUL-terminated into out (call again with
 * cap > n otherwise). On failure (invalid JSON, unsupported schema) returns -1 - m and writes
 * the m-byte error message, cut to cap - 1 bytes, into out. Never throws. */
int32_t lsp_json_schema_to_grammar(const char * schema, char * out, size_t cap);
