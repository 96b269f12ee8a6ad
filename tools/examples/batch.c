/*
 * batch.c — several sequences in one forward from C (strata_batch_eval, as llama_batch /
 * llama_decode): each prompt gets a session; every step evaluates, in ONE call, the prompts still
 * to be read and one token of every sequence still generating, each at its own position and state.
 * Greedy output equals each prompt run alone (the call is bit-identical per sequence).
 *
 *   cc -O2 tools/examples/batch.c $(strata config --cflags --libs) -o batch
 *   ./batch MODEL.gguf "first prompt" "second prompt" ... [-n 32]
 *
 * Prints, per sequence, "sequence I: <text>" and "tokens: id id ...", then "steps: N" (forward calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

enum { MAX_SEQS = 64 };

static int fail(const char *what) {
    fprintf(stderr, "error: %s: %s\n", what, strata_last_error());
    return 1;
}

static int argmax(const float *x, int64_t n) {
    int best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = (int)i;
    return best;
}

int main(int argc, char **argv) {
    int n_gen = 16, n = 0;
    const char *prompts[MAX_SEQS];
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT... [-n N]\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) n_gen = atoi(argv[++i]);
        else if (n < MAX_SEQS) prompts[n++] = argv[i];
        else { fprintf(stderr, "at most %d prompts\n", MAX_SEQS); return 2; }
    }
    if (n < 1 || n_gen < 1) { fprintf(stderr, "give at least one prompt and -n >= 1\n"); return 2; }

    strata_model_params mp = strata_model_default_params();
    mp.n_ctx = 4096;
    strata_model *model;
    if (strata_model_load(argv[1], &mp, &model)) return fail(argv[1]);
    strata_model_info info;
    if (strata_model_get_info(model, &info)) return fail("info");
    strata_tokenizer *tok;
    if (strata_model_tokenizer(model, &tok)) return fail("tokenizer");
    int32_t eos = -1;
    const strata_gguf *g = strata_model_gguf(model);
    int64_t ki;
    if (strata_gguf_find_kv(g, "tokenizer.ggml.eos_token_id", &ki) == STRATA_OK) {
        const char *k; uint64_t kl; strata_gguf_value v;
        if (strata_gguf_kv(g, ki, &k, &kl, &v) == STRATA_OK && v.type == STRATA_GGUF_UINT32) memcpy(&eos, v.data, 4);
    }

    const int64_t V = info.n_vocab;
    strata_session *sess[MAX_SEQS];
    int32_t *ids[MAX_SEQS], *out[MAX_SEQS];
    int64_t n_ids[MAX_SEQS];
    int n_out[MAX_SEQS], live[MAX_SEQS];
    float *logits = malloc((size_t)n * (size_t)V * sizeof(float));
    strata_batch_seq *b = calloc((size_t)n, sizeof *b);
    if (!logits || !b) { fprintf(stderr, "error: no memory\n"); return 1; }
    for (int i = 0; i < n; i++) {
        uint64_t cap = strlen(prompts[i]) + 1, got = 0;
        ids[i] = malloc(cap * sizeof(int32_t));
        out[i] = malloc((size_t)n_gen * sizeof(int32_t));
        if (!ids[i] || !out[i]) { fprintf(stderr, "error: no memory\n"); return 1; }
        if (strata_tokenizer_encode(tok, prompts[i], strlen(prompts[i]), 1, ids[i], cap, &got)) return fail("tokenize");
        if (got == 0) { fprintf(stderr, "error: prompt %d has no tokens\n", i); return 1; }
        n_ids[i] = (int64_t)got;
        n_out[i] = 0;
        live[i] = 1;
        if (strata_session_init(model, &sess[i])) return fail("session");
    }
    int steps = 0;
    for (;;) {
        /* one entry per live sequence: its prompt (first step) or its last token */
        int nb = 0, who[MAX_SEQS];
        for (int i = 0; i < n; i++) {
            if (!live[i]) continue;
            b[nb] = (strata_batch_seq){.session = sess[i], .ids = ids[i], .n_ids = n_ids[i], .flags = 0,
                                       .logits = logits + (size_t)nb * (size_t)V, .logits_capacity = (uint64_t)V};
            who[nb++] = i;
        }
        if (!nb) break;
        if (strata_batch_eval(b, nb)) return fail("strata_batch_eval");
        steps++;
        for (int k = 0; k < nb; k++) {
            const int i = who[k];
            const int32_t t = argmax(logits + (size_t)k * (size_t)V, V);
            out[i][n_out[i]++] = t;
            ids[i][0] = t;       /* the next step evaluates it */
            n_ids[i] = 1;
            if (t == eos || n_out[i] == n_gen) live[i] = 0;
        }
    }
    for (int i = 0; i < n; i++) {
        printf("sequence %d: ", i);
        for (int k = 0; k < n_out[i]; k++) {
            const char *p; uint64_t len;
            if (strata_tokenizer_token_bytes(tok, out[i][k], &p, &len)) continue;
            for (uint64_t c = 0; c < len; c++) {
                const unsigned char ch = (unsigned char)p[c];
                if (ch >= 0x20 && ch != '\\' && ch != 0x7f) putchar(ch);
                else printf("\\x%02x", ch);
            }
        }
        printf("\ntokens:");
        for (int k = 0; k < n_out[i]; k++) printf(" %d", out[i][k]);
        printf("\n");
        strata_session_free(sess[i]);
        free(ids[i]);
        free(out[i]);
    }
    printf("steps: %d\n", steps);
    free(logits);
    free(b);
    strata_tokenizer_free(tok);
    strata_model_free(model);
    return 0;
}
