/* llama.h: contexts - decode, logits/embeddings, memory (KV cells + recurrent state), state. */
enum llama_context_type { LLAMA_CONTEXT_TYPE_DEFAULT, LLAMA_CONTEXT_TYPE_MTP, ... };
enum llama_flash_attn_type { LLAMA_FLASH_ATTN_TYPE_AUTO, LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED, ... };
typedef bool (*ggml_abort_callback)(void * data);

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    uint32_t n_rs_seq;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_context_type ctx_type;
    enum llama_flash_attn_type flash_attn_type;
    enum ggml_type type_k;
    enum ggml_type type_v;
    ggml_abort_callback abort_callback;
    void * abort_callback_data;
    bool embeddings;
    bool no_perf;
    bool kv_unified;
    struct llama_context * ctx_other;
    ...;
};

struct llama_context_params llama_context_default_params(void);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);

uint32_t llama_n_ctx    (const struct llama_context * ctx);
uint32_t llama_n_batch  (const struct llama_context * ctx);
uint32_t llama_n_ubatch (const struct llama_context * ctx);
uint32_t llama_n_seq_max(const struct llama_context * ctx);
uint32_t llama_n_rs_seq (const struct llama_context * ctx);
int32_t  llama_n_threads(struct llama_context * ctx);
void     llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
llama_memory_t llama_get_memory(const struct llama_context * ctx);
void     llama_synchronize(struct llama_context * ctx);
void     llama_set_abort_callback(struct llama_context * ctx, ggml_abort_callback abort_callback, void * abort_callback_data);

float * llama_get_logits(struct llama_context * ctx);
float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);
float * llama_get_embeddings_ith(struct llama_context * ctx, int32_t i);

void      llama_memory_clear(llama_memory_t mem, bool data);
bool      llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
void      llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst, llama_pos p0, llama_pos p1);
void      llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);

size_t llama_state_get_size(struct llama_context * ctx);
size_t llama_state_get_data(struct llama_context * ctx, uint8_t * dst, size_t size);
size_t llama_state_set_data(struct llama_context * ctx, const uint8_t * src, size_t size);
size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id);
size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id dest_seq_id);

/* extended batch API: tokens paired with embedding rows (MTP) */
struct llama_batch_ext * llama_batch_ext_init(struct llama_context * ctx);
void                     llama_batch_ext_free(struct llama_batch_ext * batch);

void llama_log_set(ggml_log_callback log_callback, void * user_data);
extern "Python" void _lsp_log_callback(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" bool _lsp_progress_callback(float progress, void * user_data);
