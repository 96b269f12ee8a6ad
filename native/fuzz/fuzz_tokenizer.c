/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer: the encoder (any bytes, valid
 * UTF-8 or not, with and without special-token parsing, both pre-tokenizer patterns) and
 * the vocabulary parser (strata_tokenizer_init on arbitrary tokens and merges).
 *
 * Input byte 0 picks the mode:
 *   bits 0-1 = 0..2  encode the rest with a fixed byte-level vocabulary (bit 0: qwen35
 *                    pattern; bit 2: parse_special); decoding must give the input back
 *                    byte for byte, and every id must be in range; input that is not UTF-8
 *                    must be refused at a byte N such that the N bytes before it encode and
 *                    the rest is refused at its byte 0;
 *   bits 0-1 = 3     the rest is a vocabulary: NUL-separated segments, the first
 *                    (byte 1 % 32 + 1) are tokens (type from their first byte), the others
 *                    merges; init must either succeed (then encode a fixed
 *                    text containing bytes it may lack: a status, never a crash) or fail
 *                    with STRATA_ERR_FORMAT.
 * A broken invariant traps, which libFuzzer reports as a crash.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "strata.h"

static void require(int cond) {
    if (!cond) __builtin_trap();
}

/* GPT-2's byte -> char map, written as UTF-8 into out (1 or 2 bytes). */
static int byte_char(int b, char *out) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int k = 0; k < b; k++)
            if (!((k >= 33 && k <= 126) || (k >= 161 && k <= 172) || (k >= 174 && k <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

typedef struct {
    char data[8192];
    uint32_t lens[512];
    int32_t types[512];
    int64_t n;
    size_t used;
} strings;

static int add(strings *s, const char *str, size_t len, int32_t type) {
    if (s->n == 512 || len > sizeof s->data - s->used) return 0;
    memcpy(s->data + s->used, str, len);
    s->lens[s->n] = (uint32_t)len;
    s->types[s->n] = type;
    s->n++;
    s->used += len;
    return 1;
}

static strata_tokenizer *g_fixed[2];

static void build_fixed(void) {
    static const char *words[] = {"he", "ll", "llo", "hello", "\xc4\xa0w", "or", "\xc4\xa0wor", "ld", "\xc4\xa0world"};
    static const char *merges[] = {"h e", "l l", "ll o", "he llo", "\xc4\xa0 w", "o r", "\xc4\xa0w or", "l d", "\xc4\xa0wor ld"};
    strings t = {0}, m = {0};
    for (int b = 0; b < 256; b++) {
        char c[2];
        add(&t, c, (size_t)byte_char(b, c), STRATA_TOKEN_NORMAL);
    }
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) add(&t, words[i], strlen(words[i]), STRATA_TOKEN_NORMAL);
    add(&t, "<|im_start|>", 12, STRATA_TOKEN_CONTROL);
    add(&t, "<tool>", 6, STRATA_TOKEN_USER_DEFINED);
    add(&t, "<unused>", 8, STRATA_TOKEN_UNUSED);
    for (size_t i = 0; i < sizeof merges / sizeof *merges; i++) add(&m, merges[i], strlen(merges[i]), 0);
    for (int pre = 0; pre < 2; pre++) {
        strata_tokenizer_params p = strata_tokenizer_default_params();
        p.pre = pre;
        require(strata_tokenizer_init(t.data, t.lens, t.types, t.n, m.data, m.lens, m.n, &p, &g_fixed[pre]) == STRATA_OK);
    }
}

/* The N of "the prompt is not valid UTF-8 at byte N ..." after a refused encode. */
static uint64_t refused_at(void) {
    static const char head[] = "the prompt is not valid UTF-8 at byte ";
    const char *msg = strata_last_error();
    require(strncmp(msg, head, sizeof head - 1) == 0);
    return strtoull(msg + sizeof head - 1, NULL, 10);
}

/* Encodes and decodes; the bytes must come back unchanged. */
static void round_trip(const strata_tokenizer *tok, const uint8_t *text, size_t n, int parse_special) {
    uint64_t need = 0;
    int32_t *ids = malloc((n + 1) * sizeof *ids);
    require(ids != NULL);
    strata_status st = strata_tokenizer_encode(tok, (const char *)text, n, parse_special, ids, n + 1, &need);
    if (st == STRATA_ERR_INVALID_ARG) {
        free(ids);
        const uint64_t at = refused_at();
        require(at < n);
        round_trip(tok, text, (size_t)at, parse_special);   /* what comes before is valid */
        require(strata_tokenizer_encode(tok, (const char *)text + at, n - at, parse_special, NULL, 0, &need) ==
                STRATA_ERR_INVALID_ARG && refused_at() == 0);
        return;
    }
    require(st == STRATA_OK && need <= n + 1);
    const int64_t nt = strata_tokenizer_n_tokens(tok);
    for (uint64_t i = 0; i < need; i++) require(ids[i] >= 0 && ids[i] < nt);
    char *back = malloc(n + 1);
    require(back != NULL);
    uint64_t len = 0;
    st = strata_tokenizer_decode(tok, ids, need, back, n + 1, &len);
    require(st == STRATA_OK && len == n && memcmp(back, text, n) == 0);
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_fixed[0]) build_fixed();
    if (size == 0) return 0;
    const int mode = data[0] & 3;
    if (mode != 3) {
        round_trip(g_fixed[data[0] & 1], data + 1, size - 1, (data[0] >> 2) & 1);
        return 0;
    }
    if (size < 2) return 0;
    const int64_t n_tok = data[1] % 32 + 1;
    strings t = {0}, m = {0};
    size_t start = 2;
    int64_t seg = 0;
    for (size_t i = 2; i <= size; i++) {
        if (i < size && data[i] != 0) continue;
        const size_t len = i - start;
        const int ok = seg < n_tok ? add(&t, (const char *)data + start, len, len ? data[start] % 7 : 1)
                                   : add(&m, (const char *)data + start, len, 0);
        if (!ok) break;
        seg++;
        start = i + 1;
    }
    strata_tokenizer *tok = NULL;
    strata_tokenizer_params p = strata_tokenizer_default_params();
    p.pre = data[1] >> 7;
    const strata_status st = strata_tokenizer_init(t.data, t.lens, t.types, t.n, m.data, m.lens, m.n, &p, &tok);
    require(st == STRATA_OK || st == STRATA_ERR_FORMAT);
    if (st != STRATA_OK) return 0;
    /* A vocabulary that lacks some byte cannot encode every text: then encode may fail,
     * but only with a status, and must never write past the buffer. */
    int32_t ids[64];
    uint64_t need = 0;
    static const char text[] = "hello world\n\t 123 <|im_start|>";
    const strata_status es = strata_tokenizer_encode(tok, text, sizeof text - 1, 1, ids, 64, &need);
    require(es == STRATA_OK || es == STRATA_ERR_FORMAT || es == STRATA_ERR_INVALID_ARG ||
            es == STRATA_ERR_BUFFER_TOO_SMALL);
    strata_tokenizer_free(tok);
    return 0;
}
