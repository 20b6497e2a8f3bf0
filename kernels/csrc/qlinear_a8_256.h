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
A8_TARGET static inline __attribute__((always_inline)) void A8_FN(int8_body)(
    const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw, float *out, const int packed) {
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
        if (!packed) /* one stream when repacked: the hardware prefetcher's (w8at) */
            for (int r = 0; r < 4; r++) __builtin_prefetch(w[r] + b * A8_BLOCK + ahead, 0, 2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)w8at(w[0], b * A8_BLOCK, packed)), f0);
        A8_ROW(_mm256_loadu_si256((const __m256i *)w8at(w[1], b * A8_BLOCK, packed)), f1);
        A8_ROW(_mm256_loadu_si256((const __m256i *)w8at(w[2], b * A8_BLOCK, packed)), f2);
        A8_ROW(_mm256_loadu_si256((const __m256i *)w8at(w[3], b * A8_BLOCK, packed)), f3);
    }
    if (full * A8_BLOCK < k) { /* the last, partial block: each row's tail copied beside zeros (no read past it) */
        int64_t b = full, left = k - full * A8_BLOCK;
        int8_t t[4][A8_BLOCK];
        memset(t, 0, sizeof t);
        for (int r = 0; r < 4; r++) memcpy(t[r], w8at(w[r], b * A8_BLOCK, packed), (size_t)left);
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

/* the two copies (rows as stored, repacked at load), so neither tests the layout in its loop */
A8_TARGET static void A8_FN(int8_rows)(const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw,
                                       float *out) {
    if (a->wpacked) A8_FN(int8_body)(a, i, w, sw, out, 1);
    else A8_FN(int8_body)(a, i, w, sw, out, 0);
}

/* int4 W, four rows against nx (1 or 2) rows of x at once: the codes (0..15, u8) against x (s8);
   each lane starts at -2 x its block's sum of x (four lanes a block: -8 x the sum, int4's offset of
   8), so a block's lanes add up to the signed codes' dot product exactly in int32 before any
   rounding. Two rows of x share each weight load, nibble split and scale spread; a row's own
   arithmetic is the same either way, so its result is the same bits whatever the batch. */
A8_TARGET static inline __attribute__((always_inline)) void A8_FN(int4_body)(
    const A8Rows *a, const int64_t *ix, const int nx, const uint8_t *const *w, const uint16_t *const *s,
    float *out) {
    int64_t blocks = a->k / A8_BLOCK, steps = (blocks + 1) / 2;
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1); /* scale j to block j's four lanes */
    const __m128i z = _mm_setzero_si128();
    const int64_t ahead = a8_ahead(a->k / 2);
    __m256 f[2][4];
    for (int x = 0; x < nx; x++)
        for (int r = 0; r < 4; r++) f[x][r] = _mm256_setzero_ps();
    for (int64_t p = 0; p < steps; p++) {
        int whole = 2 * p + 2 <= blocks; /* else an odd block out: its 16 bytes, one scale, the rest zero */
        __m256i xe[2], xo[2], ol[2];
        __m256 dlv[2];
        for (int x = 0; x < nx; x++) {
            const int8_t *q = a->q + ix[x] * a->kp + p * 64;
            xe[x] = _mm256_loadu_si256((const __m256i *)q);
            xo[x] = _mm256_loadu_si256((const __m256i *)(q + 32));
            ol[x] = _mm256_loadu_si256((const __m256i *)(a->o + ix[x] * a->nb * 4 + p * 8));
            dlv[x] = _mm256_loadu_ps(a->dl + ix[x] * a->nb * 4 + p * 8);
        }
        for (int r = 0; r < 4; r++) {
            __builtin_prefetch(w[r] + p * 32 + ahead, 0, 2);
            __m256i wv;
            int32_t sc;
            if (whole) {
                wv = _mm256_loadu_si256((const __m256i *)(w[r] + p * 32));
                memcpy(&sc, s[r] + 2 * p, 4); /* two bf16 scales */
            } else {
                wv = _mm256_set_m128i(z, _mm_loadu_si128((const __m128i *)(w[r] + p * 32)));
                sc = s[r][2 * p];
            }
            __m256i lo = _mm256_and_si256(wv, nib), hi = _mm256_and_si256(_mm256_srli_epi16(wv, 4), nib);
            __m128 s2 = _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_cvtsi32_si128(sc)), 16));
            __m256 sl = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(s2), spread);
            for (int x = 0; x < nx; x++) {
                __m256i acc = A8_DOT2(ol[x], lo, xe[x], hi, xo[x]);
                f[x][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sl, dlv[x]), f[x][r]);
            }
        }
    }
    for (int x = 0; x < nx; x++) _mm_storeu_ps(out + 4 * x, A8_FN(hsum4)(f[x][0], f[x][1], f[x][2], f[x][3]));
}

A8_TARGET static void A8_FN(int4_rows)(const A8Rows *a, const int64_t *ix, int nx, const uint8_t *const *w,
                                       const uint16_t *const *s, float *out) {
    if (nx == 2) A8_FN(int4_body)(a, ix, 2, w, s, out);
    else A8_FN(int4_body)(a, ix, 1, w, s, out);
}
