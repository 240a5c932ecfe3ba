/* llama.h: the sampler chain and its members; the candidate array they work on. */
typedef struct llama_token_data {
    llama_token id;
    float logit;
    float p;
} llama_token_data;

typedef struct llama_token_data_array {
    llama_token_data * data;
    size_t size;
    int64_t selected;
    bool sorted;
} llama_token_data_array;

typedef struct llama_logit_bias {
    llama_token token;
    float bias;
} llama_logit_bias;

struct llama_sampler_chain_params { bool no_perf; ...; };
struct llama_sampler_chain_params llama_sampler_chain_default_params(void);

const char *           llama_sampler_name  (const struct llama_sampler * smpl);
void                   llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
void                   llama_sampler_apply (struct llama_sampler * smpl, llama_token_data_array * cur_p);
void                   llama_sampler_reset (struct llama_sampler * smpl);
struct llama_sampler * llama_sampler_clone (const struct llama_sampler * smpl);
void                   llama_sampler_free  (struct llama_sampler * smpl);

struct llama_sampler * llama_sampler_chain_init(struct llama_sampler_chain_params params);
void                   llama_sampler_chain_add(struct llama_sampler * chain, struct llama_sampler * smpl);
int32_t                llama_sampler_chain_n  (const struct llama_sampler * chain);
struct llama_sampler * llama_sampler_chain_get(struct llama_sampler * chain, int32_t i);

struct llama_sampler * llama_sampler_init_greedy(void);
struct llama_sampler * llama_sampler_init_dist(uint32_t seed);
struct llama_sampler * llama_sampler_init_top_k(int32_t k);
struct llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_typical(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_temp(float t);
struct llama_sampler * llama_sampler_init_temp_ext(float t, float delta, float exponent);
struct llama_sampler * llama_sampler_init_xtc(float p, float t, size_t min_keep, uint32_t seed);
struct llama_sampler * llama_sampler_init_top_n_sigma(float n);
struct llama_sampler * llama_sampler_init_grammar(const struct llama_vocab * vocab, const char * grammar_str, const char * grammar_root);
struct llama_sampler * llama_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n, float penalty_repeat, float penalty_freq, float penalty_present);
struct llama_sampler * llama_sampler_init_dry(const struct llama_vocab * vocab, float dry_multiplier,
                                              float dry_base, int32_t dry_allowed_length, int32_t dry_penalty_last_n,
                                              const char ** seq_breakers, size_t num_breakers);
struct llama_sampler * llama_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias, const llama_logit_bias * logit_bias);
