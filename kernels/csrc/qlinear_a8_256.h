/* The 256-bit kernels of qlinear_a8.c, written once and included once per instruction set: plain
   AVX2 (maddubs + madd), AVX-VNNI (vpdpbusd, VEX) and AVX-512 VNNI at 256 bits (vpdpbusd, EVEX with VL),
   so the three cannot drift apart. The includer defines:

     A8_TARGET            the function attribute naming the instruction set
     A8_FN(name)          the function's name with the path's suffix
     A8_DOT(acc, u, s)    acc + the sums of four adjacent u8 x s8 products per int32 lane
     A8_DOT2(acc, u1, s1, u2, s2)  the same for two pairs (int4's low and high nibbles)

   Lane layout (qlinear_a8.c packs the activations to match): int8 takes one 32-wide block a vector,
   natural order; int4 two blocks a vector, each pair of activation blocks stored as the pair's even
   elements then its odd ones, so a byte's low nibble meets an even element and its high nibble the
   next odd one without shuffling the weights. */

/* the four sums of a, b, c, d in one vector */
A8_TARGET static inline __m128 A8_FN(hsum4)(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* int8 W, four rows: |x| (u8) against w with x's sign (s8), so the pairs maddubs forms stay within
   int16 (2 x 127 x 127; an offset of 128 on either side would saturate it). Codes are in [-127, 127]
   (int8_encode clamps): a stored -128 would keep its sign. */
A8_TARGET static void A8_FN(int8_rows)(const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw,
                                       float *out) {
    const int8_t *q = a->q + i * a->kp;
    const float *d = a->d + i * a->nb;
    int64_t k = a->k, full = k / A8_BLOCK;
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    const __m256i zero = _mm256_setzero_si256();
    const int64_t ahead = a8_ahead(k);
#define A8_ROW(wv, f) f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A8_DOT(zero, ax, _mm256_sign_epi8(wv, xv))), db, f)
    for (int64_t b = 0; b < full; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(q + b * A8_BLOCK));
        __m256i ax = _mm256_sign_epi8(xv, xv);
        __m256 db = _mm256_set1_ps(d[b]);
        for (int r = 0; r < 4; r++) __builtin_prefetch(w[r] + b * A8_BLOCK + ahead, 0, 2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[0] + b * A8_BLOCK)), f0);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[1] + b * A8_BLOCK)), f1);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[2] + b * A8_BLOCK)), f2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[3] + b * A8_BLOCK)), f3);
    }
    if (full * A8_BLOCK < k) { /* the last, partial block: each row's tail copied beside zeros (no read past it) */
        int64_t b = full, left = k - full * A8_BLOCK;
        int8_t t[4][A8_BLOCK];
        memset(t, 0, sizeof t);
        for (int r = 0; r < 4; r++) memcpy(t[r], w[r] + b * A8_BLOCK, (size_t)left);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(q + b * A8_BLOCK)); /* zero past k */
        __m256i ax = _mm256_sign_epi8(xv, xv);
        __m256 db = _mm256_set1_ps(d[b]);
        A8_ROW(_mm256_loadu_si256((const __m256i *)t[0]), f0);
        A8_ROW(_mm256_loadu_si256((const __m256i *)t[1]), f1);
        A8_ROW(_mm256_loadu_si256((const __m256i *)t[2]), f2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)t[3]), f3);
    }
#undef A8_ROW
    __m128 sums = _mm_mul_ps(A8_FN(hsum4)(f0, f1, f2, f3), _mm_loadu_ps(sw));
    _mm_storeu_ps(out, sums);
}

/* int4 W, four rows: the codes (0..15, u8) against x (s8); each lane starts at -2 x its block's sum
   of x (four lanes a block: -8 x the sum, int4's offset of 8), so a block's lanes add up to the
   signed codes' dot product exactly in int32 before any rounding. */
A8_TARGET static void A8_FN(int4_rows)(const A8Rows *a, int64_t i, const uint8_t *const *w,
                                       const uint16_t *const *s, float *out) {
    const int8_t *q = a->q + i * a->kp;
    const float *dl = a->dl + i * a->nb * 4;
    const int32_t *o = a->o + i * a->nb * 4;
    int64_t blocks = a->k / A8_BLOCK, pairs = blocks / 2;
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1); /* scale j to block j's four lanes */
    __m256 f0 = _mm256_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    const int64_t ahead = a8_ahead(a->k / 2);
#define A8_ROW(wv, sc, f)                                                                                 \
    do {                                                                                                  \
        __m256i lo = _mm256_and_si256(wv, nib), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);    \
        __m256i acc = A8_DOT2(ol, lo, xe, hi, xo);                                                        \
        __m128 s2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi32_si128(sc)), 16));     \
        __m256 sl = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s2), spread);                         \
        f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sl, dlv), f);                          \
    } while (0)
    for (int64_t p = 0; p < pairs; p++) {
        __m256i xe = _mm256_loadu_si256((const __m256i *)(q + p * 64));
        __m256i xo = _mm256_loadu_si256((const __m256i *)(q + p * 64 + 32));
        __m256i ol = _mm256_loadu_si256((const __m256i *)(o + p * 8));
        __m256 dlv = _mm256_loadu_ps(dl + p * 8);
        int32_t sc[4];
        for (int r = 0; r < 4; r++) {
            memcpy(&sc[r], s[r] + 2 * p, 4); /* two bf16 scales */
            __builtin_prefetch(w[r] + p * 32 + ahead, 0, 2);
        }
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[0] + p * 32)), sc[0], f0);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[1] + p * 32)), sc[1], f1);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[2] + p * 32)), sc[2], f2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)(w[3] + p * 32)), sc[3], f3);
    }
    if (pairs * 2 < blocks) { /* an odd block out: its 16 bytes and one scale, the pair's other half zero */
        int64_t p = pairs;
        __m256i xe = _mm256_loadu_si256((const __m256i *)(q + p * 64));
        __m256i xo = _mm256_loadu_si256((const __m256i *)(q + p * 64 + 32));
        __m256i ol = _mm256_loadu_si256((const __m256i *)(o + p * 8));
        __m256 dlv = _mm256_loadu_ps(dl + p * 8);
        const __m128i z = _mm_setzero_si128();
#define A8_HALF(r) _mm256_set_m128i(z, _mm_loadu_si128((const __m128i *)(w[r] + p * 32)))
        A8_ROW(A8_HALF(0), s[0][2 * p], f0);
        A8_ROW(A8_HALF(1), s[1][2 * p], f1);
        A8_ROW(A8_HALF(2), s[2][2 * p], f2);
        A8_ROW(A8_HALF(3), s[3][2 * p], f3);
#undef A8_HALF
    }
#undef A8_ROW
    _mm_storeu_ps(out, A8_FN(hsum4)(f0, f1, f2, f3));
}
