/* llama_spec/_shim.h: MTP staging API, reasoning budget, hot-path helpers (see that file). */
void    lsp_set_embeddings_nextn(struct llama_context * ctx, bool value, bool masked);
float * lsp_get_embeddings_nextn(struct llama_context * ctx);
float * lsp_get_embeddings_nextn_ith(struct llama_context * ctx, int32_t i);
void    lsp_set_nextn_layer_offset(struct llama_context * ctx, int32_t offset);
struct llama_context * lsp_get_ctx_other(struct llama_context * ctx);
int32_t lsp_model_n_devices(const struct llama_model * model);
ggml_backend_dev_t lsp_model_get_device(const struct llama_model * model, int32_t i);

int32_t lsp_process(struct llama_context * ctx, struct llama_batch_ext * batch,
                    const int32_t * tokens, const int32_t * pos, int32_t n, int32_t seq_id,
                    const int8_t * outputs, const float * embd, int32_t n_embd);
void    lsp_candidates_init(const float * logits, int32_t n_vocab, llama_token_data * buf, llama_token_data_array * cur);
int32_t lsp_candidates_init_top_k(const float * logits, int32_t n_vocab, int32_t k, llama_token_data * buf, llama_token_data_array * cur);
int32_t lsp_candidates_probs(llama_token_data_array * cur, int32_t * ids, float * probs);
int32_t lsp_top_n(const float * logits, int32_t n_vocab, int32_t n, int32_t * ids, float * vals);

struct llama_sampler * lsp_reasoning_budget_init(
        const struct llama_vocab * vocab,
        const int32_t * start_seqs, const int32_t * start_lens, int32_t n_start,
        const int32_t * end_seqs,   const int32_t * end_lens,   int32_t n_end,
        const int32_t * forced, int32_t n_forced,
        int32_t budget, int32_t initial_state);
int32_t lsp_reasoning_budget_get_state(const struct llama_sampler * smpl);
bool    lsp_reasoning_budget_force(struct llama_sampler * smpl);
