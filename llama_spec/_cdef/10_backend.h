/* ggml-backend.h / ggml-rpc.h: devices as llama.cpp sees them (`--list-devices`), RPC servers. */
enum ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_CPU, GGML_BACKEND_DEVICE_TYPE_GPU,
    GGML_BACKEND_DEVICE_TYPE_IGPU, GGML_BACKEND_DEVICE_TYPE_ACCEL, ...
};
size_t             ggml_backend_dev_count(void);
ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_t ggml_backend_dev_by_name(const char * name);
const char *       ggml_backend_dev_name(ggml_backend_dev_t device);
const char *       ggml_backend_dev_description(ggml_backend_dev_t device);
void               ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);
const char *       ggml_backend_reg_name(ggml_backend_reg_t reg);
void               ggml_backend_load_all(void);

/* Registers the devices of an RPC server ("host:port"); NULL when it cannot be reached. */
ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
void               ggml_backend_register(ggml_backend_reg_t reg);
size_t             ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
