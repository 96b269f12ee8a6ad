/*
 * fuzz_model.c — libFuzzer target for the qwen4exp model loader and forward pass.
 *
 * Each input is parsed as a GGUF (strata_gguf_open_memory) and, if that succeeds, loaded as a
 * qwen4exp model: every hyperparameter and tensor shape check runs on mutated metadata and
 * tensor tables. A model that loads is run: a session of a small context evaluates a few token
 * ids taken from the input (in and out of the vocabulary), with all logits, twice (prefill, then
 * a continuation), then reset and once more; then a verify window (per-token states, hidden rows), a
 * rollback into it, the MTP head when the file has one, and a checkpoint restored; then a prompt in
 * pieces (STRATA_EVAL_CONTINUED: a GDN chunk left open, a checkpoint refused while it is, then closed). A rejected input must fail with a message; nothing
 * may crash, leak or touch memory outside what the model owns (ASan + UBSan).
 * Seeds: tiny models from tests/test_fuzz.py (a micro preset of tools/make_model.py).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"
#include "model/model.h"

static void require(int cond) {
    if (!cond) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    strata_gguf *g;
    if (strata_gguf_open_memory(data, size, "fuzz.gguf", &g) != STRATA_OK) return 0;
    strata_model_params p = strata_model_default_params();
    p.n_threads = 1;
    p.n_ctx = 24;
    p.n_ubatch = size % 4 == 3 ? 64 : 5;   /* 64: prompts in pieces (STRATA_EVAL_CONTINUED) are allowed */
    p.kv_type = (int32_t)(size % 3);
    strata_model *m;
    if (mdl_model_open(g, &p, &m) != STRATA_OK) {
        require(strata_last_error()[0] != 0);
        return 0;
    }
    strata_model_info info;
    require(strata_model_get_info(m, &info) == STRATA_OK);
    strata_session *s;
    if (strata_session_init(m, &s) == STRATA_OK) {
        int32_t ids[8];
        for (int i = 0; i < 8; i++) {
            const uint8_t b = size > (size_t)i ? data[size - 1 - i] : 0;
            ids[i] = (int32_t)(b % (info.n_vocab > 0 ? info.n_vocab : 1));
        }
        const uint64_t cap = (uint64_t)8 * (uint64_t)info.n_vocab;
        float *logits = malloc(cap * sizeof(float));
        if (logits) {
            (void)strata_session_eval(s, ids, 7, 1, logits, cap);
            (void)strata_session_eval(s, ids + 7, 1, 0, logits, cap);
            int32_t bad = (int32_t)info.n_vocab;
            require(strata_session_eval(s, &bad, 1, 0, logits, cap) == STRATA_ERR_INVALID_ARG);
            strata_session_reset(s);
            (void)strata_session_eval(s, ids, 3, 0, logits, cap);
            /* a verify window with per-token states and hidden rows, a rollback into it, a checkpoint
             * restored after more tokens, and the MTP head over the window's rows when the file has one */
            const uint64_t hcap = (uint64_t)4 * (uint64_t)(info.n_hidden > 0 ? info.n_hidden : 1);
            float *hidden = malloc(hcap * sizeof(float));
            strata_checkpoint *ck = NULL;
            if (hidden && strata_session_set_spec_max(s, 4) == STRATA_OK &&
                strata_session_checkpoint(s, &ck) == STRATA_OK) {
                const int64_t p0 = strata_session_n_past(s);
                if (strata_session_eval_ex(s, ids + 3, 4, STRATA_EVAL_ALL_LOGITS | STRATA_EVAL_KEEP_STATES, logits, cap,
                                           hidden, hcap) == STRATA_OK) {
                    require(strata_session_rollback(s, p0 + 1 + ids[0] % 4) == STRATA_OK);
                    require(strata_session_rollback(s, p0) == STRATA_ERR_INVALID_ARG);
                    if (info.n_mtp > 0)
                        (void)strata_session_mtp(s, hidden, ids + 4, 4, p0, STRATA_EVAL_ALL_LOGITS, logits, cap, hidden,
                                                 hcap);
                }
                (void)strata_session_eval(s, ids, 2, 0, logits, cap);
                require(strata_session_restore(s, ck) == STRATA_OK && strata_session_n_past(s) == p0);
                (void)strata_session_eval(s, ids + 5, 2, 0, logits, cap);
            }
            strata_checkpoint_free(ck);
            /* a prompt in two pieces: the flag is refused unless n_ubatch is whole GDN chunks */
            strata_session_reset(s);
            const strata_status rc = strata_session_eval_ex(s, ids, 3, STRATA_EVAL_CONTINUED, logits, cap, NULL, 0);
            if (p.n_ubatch % 64) {
                require(rc == STRATA_ERR_INVALID_ARG);
            } else if (rc == STRATA_OK) {
                strata_checkpoint *open = NULL;
                const strata_status crc = strata_session_checkpoint(s, &open);
                require(crc == STRATA_OK || crc == STRATA_ERR_INVALID_ARG);   /* refused when a GDN chunk is open */
                strata_checkpoint_free(open);
                (void)strata_session_eval_ex(s, ids + 3, 4, STRATA_EVAL_ALL_LOGITS, logits, cap, NULL, 0);
            }
            free(hidden);
            free(logits);
        }
        strata_session_free(s);
    }
    strata_model_free(m);
    return 0;
}
