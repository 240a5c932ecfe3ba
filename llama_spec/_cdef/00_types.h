/* Basic types shared by every llama.cpp area (llama.h, ggml.h). */
typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

struct llama_vocab;
struct llama_model;
struct llama_context;
struct llama_sampler;
struct llama_batch_ext;
typedef struct llama_memory_i * llama_memory_t;

typedef struct ggml_backend_device * ggml_backend_dev_t;
typedef struct ggml_backend_reg * ggml_backend_reg_t;

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT, ...
};
/* ggml.h: the tensor types llama.cpp accepts for the KV cache (-ctk/-ctv); values from ggml.h. */
enum ggml_type {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_BF16, ...
};
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
