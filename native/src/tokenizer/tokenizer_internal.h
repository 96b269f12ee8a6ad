/* tokenizer_internal.h — what the tokenizer's files share: the pre-tokenizer matcher.
 *
 * Pipeline of strata_tokenizer_encode (tokenizer.c):
 *   text --(added tokens matched literally)--> segments --(pretok_next)--> pieces
 *        --(whole piece a token? else BPE merges by rank)--> ids
 */
#ifndef STRATA_TOKENIZER_INTERNAL_H
#define STRATA_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* End (byte offset, exclusive) of the pre-token that starts at byte i of s[0..n), i < n,
 * under the Qwen split pattern; with_marks selects the Qwen 3.5/3.6 variant. Pieces found
 * from i = 0 onward tile the text exactly as the regex's successive matches do. */
size_t strata_pretok_next(const uint8_t *s, size_t n, size_t i, int with_marks);

#endif
