/*
 * generate.c — using libstrata from C: load a qwen4exp GGUF, tokenize a prompt with the model's
 * tokenizer, run it, and generate with a sampler; optionally the same request in several
 * sessions on several threads at once (sessions of one model are independent).
 *
 *   cc -O2 tools/examples/generate.c $(strata config --cflags --libs) -o generate
 *   ./generate MODEL.gguf "Once upon a time" [-n 32] [--temp 0] [--seed 1] [--parallel 2]
 *
 * `strata config` (or `PKG_CONFIG_PATH=DIR pkg-config --cflags --libs strata` after
 * `strata config --pkg-config-dir DIR`) gives the flags of the installed Strata: the folder that
 * holds strata.h and libstrata.so, and an rpath to it. Without an install, from a source checkout:
 *   cc -O2 tools/examples/generate.c -I native/include -L pyrunner -lstrata -lpthread \
 *      -Wl,-rpath,$PWD/pyrunner -o generate
 *
 * Prints, per session, one line "session I: <generated text>" (the text bytes as the tokens
 * stand for them, non-printable bytes escaped), then "tokens: id id ...". Exit status 1 with the
 * library's message on any error.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

typedef struct {
    strata_model *model;
    const strata_tokenizer *tok;
    const int32_t *prompt;
    uint64_t n_prompt;
    int n_gen;
    strata_sampler_params sp;
    int32_t eos;
    int32_t *out;         /* generated ids */
    int n_out;
    strata_status rc;
    char err[512];
} job;

static void *run(void *arg) {
    job *j = arg;
    strata_model_info info;
    strata_session *s = NULL;
    strata_sampler *smp = NULL;
    float *logits = NULL;
    if ((j->rc = strata_model_get_info(j->model, &info))) goto fail;
    if ((j->rc = strata_session_init(j->model, &s))) goto fail;
    if ((j->rc = strata_sampler_init(&j->sp, &smp))) goto fail;
    logits = malloc((size_t)info.n_vocab * sizeof(float));
    if (!logits) { j->rc = STRATA_ERR_NOMEM; snprintf(j->err, sizeof j->err, "no memory"); goto done; }
    if ((j->rc = strata_session_eval(s, j->prompt, (int64_t)j->n_prompt, 0, logits, (uint64_t)info.n_vocab))) goto fail;
    for (int i = 0; i < j->n_gen; i++) {
        int32_t t;
        if ((j->rc = strata_sampler_sample(smp, logits, info.n_vocab, &t))) goto fail;
        j->out[j->n_out++] = t;
        if (t == j->eos) break;
        if ((j->rc = strata_session_eval(s, &t, 1, 0, logits, (uint64_t)info.n_vocab))) goto fail;
    }
    goto done;
fail:
    snprintf(j->err, sizeof j->err, "%s", strata_last_error());
done:
    free(logits);
    strata_sampler_free(smp);
    strata_session_free(s);
    return NULL;
}

static int fail(const char *what) {
    fprintf(stderr, "error: %s: %s\n", what, strata_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT [-n N] [--temp T] [--seed S] [--parallel P]\n", argv[0]);
        return 2;
    }
    int n_gen = 16, parallel = 1;
    strata_sampler_params sp = strata_sampler_default_params();
    sp.temperature = 0.0f;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-n")) n_gen = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--temp")) sp.temperature = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) sp.seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--parallel")) parallel = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (parallel < 1 || parallel > 16 || n_gen < 1) { fprintf(stderr, "bad -n or --parallel\n"); return 2; }

    strata_model_params mp = strata_model_default_params();
    mp.n_ctx = 4096;
    strata_model *model;
    if (strata_model_load(argv[1], &mp, &model)) return fail(argv[1]);
    strata_tokenizer *tok;
    if (strata_model_tokenizer(model, &tok)) return fail("tokenizer");

    /* eos: tokenizer.ggml.eos_token_id, if the file has one */
    int32_t eos = -1;
    const strata_gguf *g = strata_model_gguf(model);
    int64_t ki;
    if (strata_gguf_find_kv(g, "tokenizer.ggml.eos_token_id", &ki) == STRATA_OK) {
        const char *k; uint64_t kl; strata_gguf_value v;
        if (strata_gguf_kv(g, ki, &k, &kl, &v) == STRATA_OK && v.type == STRATA_GGUF_UINT32) memcpy(&eos, v.data, 4);
    }

    const char *text = argv[2];
    uint64_t n_prompt = 0, cap = strlen(text) + 1;
    int32_t *prompt = malloc(cap * sizeof(int32_t));
    if (!prompt || strata_tokenizer_encode(tok, text, strlen(text), 1, prompt, cap, &n_prompt)) return fail("tokenize");
    if (n_prompt == 0) { fprintf(stderr, "error: the prompt has no tokens\n"); return 1; }

    job jobs[16];
    pthread_t th[16];
    for (int p = 0; p < parallel; p++) {
        memset(&jobs[p], 0, sizeof jobs[p]);
        jobs[p] = (job){.model = model, .tok = tok, .prompt = prompt, .n_prompt = n_prompt, .n_gen = n_gen,
                        .sp = sp, .eos = eos, .out = malloc((size_t)n_gen * sizeof(int32_t))};
        if (!jobs[p].out) { fprintf(stderr, "error: no memory\n"); return 1; }
        if (pthread_create(&th[p], NULL, run, &jobs[p])) { fprintf(stderr, "error: pthread_create\n"); return 1; }
    }
    int status = 0;
    for (int p = 0; p < parallel; p++) {
        pthread_join(th[p], NULL);
        job *j = &jobs[p];
        if (j->rc) { fprintf(stderr, "error: session %d: %s\n", p, j->err); status = 1; continue; }
        printf("session %d: ", p);
        for (int i = 0; i < j->n_out; i++) {
            const char *b; uint64_t n;
            if (strata_tokenizer_token_bytes(tok, j->out[i], &b, &n)) continue;
            for (uint64_t c = 0; c < n; c++) {
                const unsigned char ch = (unsigned char)b[c];
                if (ch >= 0x20 && ch != '\\' && ch != 0x7f) putchar(ch);
                else printf("\\x%02x", ch);
            }
        }
        printf("\ntokens:");
        for (int i = 0; i < j->n_out; i++) printf(" %d", j->out[i]);
        printf("\n");
        free(j->out);
    }
    free(prompt);
    strata_tokenizer_free(tok);
    strata_model_free(model);
    return status;
}
