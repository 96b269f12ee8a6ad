/* pretok.c — the Qwen pre-tokenizer split, hand-written over Unicode classes.
 *
 * The patterns (tokenizer.ggml.pre "qwen2", and "qwen35" where M marks join letters):
 *
 *   qwen2:  (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}
 *         | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *   qwen35: the same with [\p{L}\p{M}]+ for \p{L}+ and [^\s\p{L}\p{M}\p{N}] in the 4th branch.
 *
 * A regex engine tries the branches in order at a position and keeps the first that
 * matches (leftmost-first). Every character starts some branch, so successive matches tile
 * the text and matching "at position i" is all we need. What each branch matches, with
 * backtracking worked out:
 *   1. an ASCII apostrophe and s/t/m/d or re/ve/ll, ASCII case-insensitive (tiktoken does
 *      not fold U+017F to s here; checked against it in the tests);
 *   2. one optional prefix char that is not \r, \n, L, N (a space, punctuation, a mark...)
 *      followed by a run of letters (letters or marks for qwen35);
 *   3. one number char;
 *   4. an optional ASCII space, a run of "other" chars (not space, L, N; not M for qwen35),
 *      then any run of \r / \n;
 *   5. (\s*[\r\n]+) in a whitespace run that holds \r or \n: up to and including its last
 *      \r or \n (the greedy \s* gives back only what [\r\n]+ needs);
 *   6. (\s+(?!\S)) the whole run at the end of the text; else the run minus its last char,
 *      when that leaves at least one (the last space then prefixes the next word);
 *   7. (\s+) the single whitespace char left over.
 * \s is Unicode White_Space, as in tiktoken's and Oniguruma's engines.
 */
#include "tokenizer_internal.h"

#include "unicode_tables.h"

enum { OTHER = 0 };

/* Flags of the char at s[i] and its length in bytes. Malformed UTF-8 counts as one
 * "other" byte: strata_tokenizer_encode refuses such text before it gets here, but the
 * matcher stays total so that it can never read past the end. */
static inline unsigned char_at(const uint8_t *s, size_t n, size_t i, size_t *len) {
    uint32_t c = s[i];
    if (c < 0x80) {
        *len = 1;
        return strata_uc_stage2[((uint32_t)strata_uc_stage1[0] << 8) | c];
    }
    uint32_t cp;
    size_t l;
    if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; l = 2; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; l = 3; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; l = 4; }
    else { *len = 1; return OTHER; }
    if (i + l > n) { *len = 1; return OTHER; }
    for (size_t k = 1; k < l; k++) {
        uint32_t b = s[i + k];
        if ((b & 0xC0) != 0x80) { *len = 1; return OTHER; }
        cp = (cp << 6) | (b & 0x3F);
    }
    if (cp > 0x10FFFF) { *len = 1; return OTHER; }
    *len = l;
    return strata_uc_stage2[((uint32_t)strata_uc_stage1[cp >> 8] << 8) | (cp & 0xFF)];
}

static inline int is_crlf(uint8_t b) { return b == '\r' || b == '\n'; }

static inline int lower_ascii(uint8_t b) { return (b >= 'A' && b <= 'Z') ? b + 32 : b; }

/* End of the run of chars whose flags intersect `want`, starting at j. */
static inline size_t run_of(const uint8_t *s, size_t n, size_t j, unsigned want) {
    size_t l;
    while (j < n && (char_at(s, n, j, &l) & want)) j += l;
    return j;
}

/* End of the run of chars whose flags miss all of `avoid` (the "other" class). */
static inline size_t run_without(const uint8_t *s, size_t n, size_t j, unsigned avoid) {
    size_t l;
    while (j < n && !(char_at(s, n, j, &l) & avoid)) j += l;
    return j;
}

size_t strata_pretok_next(const uint8_t *s, size_t n, size_t i, int with_marks) {
    const unsigned letter = STRATA_UC_L | (with_marks ? STRATA_UC_M : 0);
    const unsigned not_other = STRATA_UC_S | STRATA_UC_L | STRATA_UC_N | (with_marks ? STRATA_UC_M : 0);
    size_t l0;
    unsigned c0 = char_at(s, n, i, &l0);

    /* 1. contractions */
    if (s[i] == '\'' && i + 1 < n) {
        int a = lower_ascii(s[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
        if (i + 2 < n) {
            int b = lower_ascii(s[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
        }
    }
    /* 2. optional prefix, then letters */
    if (!(c0 & (STRATA_UC_L | STRATA_UC_N)) && !is_crlf(s[i]) && i + l0 < n) {
        size_t l1;
        if (char_at(s, n, i + l0, &l1) & letter) return run_of(s, n, i + l0 + l1, letter);
    }
    if (c0 & letter) return run_of(s, n, i + l0, letter);
    /* 3. one number */
    if (c0 & STRATA_UC_N) return i + l0;
    /* 4. optional space, "other" run, trailing newlines */
    {
        size_t j = i;
        if (s[i] == ' ' && i + 1 < n) {
            size_t l1;
            if (!(char_at(s, n, i + 1, &l1) & not_other)) j = i + 1;
        }
        size_t lj;
        if (j < n && !(char_at(s, n, j, &lj) & not_other)) {
            j = run_without(s, n, j + lj, not_other);
            while (j < n && is_crlf(s[j])) j++;
            return j;
        }
    }
    /* 5-7. whitespace runs */
    if (c0 & STRATA_UC_S) {
        size_t j = i, last_start = i, after_nl = 0, l;
        while (j < n && (char_at(s, n, j, &l) & STRATA_UC_S)) {
            if (is_crlf(s[j])) after_nl = j + 1;
            last_start = j;
            j += l;
        }
        if (after_nl) return after_nl;          /* 5 */
        if (j == n) return j;                    /* 6 at the end of the text */
        if (last_start > i) return last_start;   /* 6 before a non-space */
        return j;                                /* 7 */
    }
    return i + l0;  /* unreachable for well-formed classes; keeps progress guaranteed */
}
