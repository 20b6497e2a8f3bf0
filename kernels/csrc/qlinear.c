/* y = x W^T for compressed weights read in their stored format, on the CPU: no dense copy of W.

   int8: W [N, K] int8, one float32 scale per output row.
   int4: W [N, K/2] uint8, two codes a byte (low nibble first, offset 8), one bfloat16 scale per
         group of 32 along K (kernels/packing.py's layout).

   Four output rows at a time are decoded (scaled) into a small float tile that stays in L1, and
   every row of x is dotted with the four rows of the tile: each weight is decoded once per call
   whatever the batch, and the only memory traffic of W is its compressed bytes. Rows of blocks are
   split over threads with OpenMP. A single row of x (a decode step at batch 1) skips the tile: each
   row of W is decoded in registers straight into its dot product. An AVX2 + FMA path is chosen at run time where the CPU has it
   (qlinear_isa says which); the portable path is the same loops in scalar C. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EDGE_X86 1
#endif

#define ROWS 4   /* output rows decoded per tile */
#define GROUP 32 /* int4 scale group */

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* --- decoding one row of W into floats ------------------------------------------------------- */

static void decode_int8_row(const int8_t *w, float scale, int64_t k, float *out) {
    for (int64_t i = 0; i < k; i++) out[i] = (float)w[i] * scale;
}

static void decode_int4_row(const uint8_t *w, const uint16_t *scales, int64_t k, float *out) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        float s = bf16_to_f32(scales[g]);
        const uint8_t *b = w + g * (GROUP / 2);
        float *o = out + g * GROUP;
        for (int i = 0; i < GROUP / 2; i++) {
            o[2 * i] = (float)((int)(b[i] & 0x0F) - 8) * s;
            o[2 * i + 1] = (float)((int)(b[i] >> 4) - 8) * s;
        }
    }
}

static float dot_scalar(const float *a, const float *b, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += a[i] * b[i];
    return acc;
}

#ifdef EDGE_X86
__attribute__((target("avx2,fma"))) static void decode_int8_row_avx2(const int8_t *w, float scale,
                                                                       int64_t k, float *out) {
    __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(w + i));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s));
    }
    for (; i < k; i++) out[i] = (float)w[i] * scale;
}

__attribute__((target("avx2,fma"))) static void decode_int4_row_avx2(const uint8_t *w,
                                                                       const uint16_t *scales,
                                                                       int64_t k, float *out) {
    const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m256 s = _mm256_set1_ps(bf16_to_f32(scales[g]));
        __m128i b = _mm_loadu_si128((const __m128i *)(w + g * (GROUP / 2)));
        __m128i lo = _mm_and_si128(b, low_mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_mask);
        /* codes in order: byte i gives elements 2i (low) and 2i + 1 (high) */
        __m128i first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
        __m128i second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
        float *o = out + g * GROUP;
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)), s));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8))), s));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)), s));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8))), s));
    }
}


__attribute__((target("avx2,fma"))) static inline float hsum_avx(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One row of x against one row of W, decoded in registers (m == 1: nothing to share a tile with).
   int8: the codes summed against x, the row's scale applied once; int4: each group's sum scaled. */
__attribute__((target("avx2,fma"))) static float dot_int8_avx2(const float *x, const int8_t *w,
                                                                 float scale, int64_t k) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + i));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8),
                               _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), acc1);
    }
    float rest = 0.0f;
    for (; i < k; i++) rest += x[i] * (float)w[i];
    return (hsum_avx(_mm256_add_ps(acc0, acc1)) + rest) * scale;
}

__attribute__((target("avx2,fma"))) static float dot_int4_avx2(const float *x, const uint8_t *w,
                                                                 const uint16_t *scales, int64_t k) {
    const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + g * (GROUP / 2)));
        __m128i lo = _mm_and_si128(b, low_mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_mask);
        __m128i first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
        __m128i second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
        const float *xg = x + g * GROUP;
        __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(xg), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(first)));
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8),
                              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(first, 8))), sum);
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(second)), sum);
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24),
                              _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(second, 8))), sum);
        acc = _mm256_fmadd_ps(sum, _mm256_set1_ps(bf16_to_f32(scales[g])), acc);
    }
    return hsum_avx(acc);
}

/* y[m, n0 + r] = x[m] . tile[r] for the `rows` (<= ROWS) rows of the tile; k a multiple of 8 */
__attribute__((target("avx2,fma"))) static void tile_dots_avx2(const float *x, int64_t m,
                                                                 int64_t k, const float *tile,
                                                                 int rows, float *y, int64_t n,
                                                                 int64_t n0) {
    for (int64_t row = 0; row < m; row++) {
        const float *xr = x + row * k;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
        for (int64_t i = 0; i < k; i += 8) {
            __m256 xv = _mm256_loadu_ps(xr + i);
            acc0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + i), acc0);
            if (rows > 1) acc1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + k + i), acc1);
            if (rows > 2) acc2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + 2 * k + i), acc2);
            if (rows > 3) acc3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(tile + 3 * k + i), acc3);
        }
        float *yr = y + row * n + n0;
        yr[0] = hsum_avx(acc0);
        if (rows > 1) yr[1] = hsum_avx(acc1);
        if (rows > 2) yr[2] = hsum_avx(acc2);
        if (rows > 3) yr[3] = hsum_avx(acc3);
    }
}
#endif

static int have_avx2(void) {
#ifdef EDGE_X86
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();
        known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
#else
    return 0;
#endif
}

/* "avx2" or "scalar": the path this CPU runs (and force_scalar, for the tests of the other) */
static int force_scalar = 0;

const char *qlinear_isa(void) { return have_avx2() && !force_scalar ? "avx2" : "scalar"; }

void qlinear_force_scalar(int on) { force_scalar = on; }

/* --- the two entry points ---------------------------------------------------------------------- */

static void run(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads,
                const void *w, const void *scales, int fmt) {
    int avx = have_avx2() && !force_scalar && k % 8 == 0;
    int64_t blocks = (n + ROWS - 1) / ROWS;
    if (threads < 1 || n * k < 128 * 1024) threads = 1; /* a fork and join costs more than these */
#ifdef EDGE_X86
    if (avx && m == 1) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
        for (int64_t row = 0; row < n; row++) {
            if (fmt == 8)
                y[row] = dot_int8_avx2(x, (const int8_t *)w + row * k, ((const float *)scales)[row], k);
            else
                y[row] = dot_int4_avx2(x, (const uint8_t *)w + row * (k / 2),
                                       (const uint16_t *)scales + row * (k / GROUP), k);
        }
        return;
    }
#endif
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        float *tile = (float *)malloc(sizeof(float) * ROWS * k);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t b = 0; b < blocks; b++) {
            int64_t n0 = b * ROWS;
            int rows = (int)(n - n0 < ROWS ? n - n0 : ROWS);
            for (int r = 0; r < rows; r++) {
                int64_t row = n0 + r;
                float *t = tile + r * k;
                if (fmt == 8) {
                    const int8_t *wr = (const int8_t *)w + row * k;
                    float s = ((const float *)scales)[row];
#ifdef EDGE_X86
                    if (avx) { decode_int8_row_avx2(wr, s, k, t); continue; }
#endif
                    decode_int8_row(wr, s, k, t);
                } else {
                    const uint8_t *wr = (const uint8_t *)w + row * (k / 2);
                    const uint16_t *sr = (const uint16_t *)scales + row * (k / GROUP);
#ifdef EDGE_X86
                    if (avx) { decode_int4_row_avx2(wr, sr, k, t); continue; }
#endif
                    decode_int4_row(wr, sr, k, t);
                }
            }
#ifdef EDGE_X86
            if (avx) { tile_dots_avx2(x, m, k, tile, rows, y, n, n0); continue; }
#endif
            for (int64_t i = 0; i < m; i++)
                for (int r = 0; r < rows; r++) y[i * n + n0 + r] = dot_scalar(x + i * k, tile + r * k, k);
        }
        free(tile);
    }
}

/* x [m, k] float32, w [n, k] int8, scales [n] float32 -> y [m, n] float32 */
void qlinear_int8(const float *x, int64_t m, int64_t k, const int8_t *w, const float *scales,
                  int64_t n, float *y, int threads) {
    run(x, m, k, n, y, threads, w, scales, 8);
}

/* x [m, k] float32, w [n, k/2] uint8, scales [n, k/32] bfloat16 -> y [m, n] float32; k % 32 == 0 */
void qlinear_int4(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint16_t *scales,
                  int64_t n, float *y, int threads) {
    run(x, m, k, n, y, threads, w, scales, 4);
}
