/* gguf.c — GGUF reader (not yet written). */
#include "strata.h"
#include "../util/error.h"

strata_status strata_gguf_open(const char *path, strata_gguf **out) {
    (void)path; (void)out;
    return strata_fail(STRATA_ERR_UNSUPPORTED, "GGUF reader not yet built");
}
strata_status strata_gguf_open_memory(const void *data, uint64_t size, const char *name, strata_gguf **out) {
    (void)data; (void)size; (void)name; (void)out;
    return strata_fail(STRATA_ERR_UNSUPPORTED, "GGUF reader not yet built");
}
void strata_gguf_close(strata_gguf *g) { (void)g; }
uint32_t strata_gguf_version(const strata_gguf *g) { (void)g; return 0; }
int32_t strata_gguf_n_splits(const strata_gguf *g) { (void)g; return 0; }
uint64_t strata_gguf_alignment(const strata_gguf *g) { (void)g; return 0; }
uint64_t strata_gguf_data_offset(const strata_gguf *g, int32_t split) { (void)g; (void)split; return 0; }
int64_t strata_gguf_n_kv(const strata_gguf *g) { (void)g; return 0; }
strata_status strata_gguf_kv(const strata_gguf *g, int64_t i, const char **key, uint64_t *key_len, strata_gguf_value *value) {
    (void)g; (void)i; (void)key; (void)key_len; (void)value; return STRATA_ERR_UNSUPPORTED;
}
strata_status strata_gguf_find_kv(const strata_gguf *g, const char *key, int64_t *index) {
    (void)g; (void)key; (void)index; return STRATA_ERR_UNSUPPORTED;
}
strata_status strata_gguf_array_get(const strata_gguf *g, const strata_gguf_value *array, uint64_t i, strata_gguf_value *element) {
    (void)g; (void)array; (void)i; (void)element; return STRATA_ERR_UNSUPPORTED;
}
int64_t strata_gguf_n_tensors(const strata_gguf *g) { (void)g; return 0; }
strata_status strata_gguf_tensor_info(const strata_gguf *g, int64_t i, strata_gguf_tensor *out) {
    (void)g; (void)i; (void)out; return STRATA_ERR_UNSUPPORTED;
}
strata_status strata_gguf_find_tensor(const strata_gguf *g, const char *name, int64_t *index) {
    (void)g; (void)name; (void)index; return STRATA_ERR_UNSUPPORTED;
}
