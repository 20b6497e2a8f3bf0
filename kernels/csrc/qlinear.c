/* y = x W^T for compressed weights read in their stored format, on the CPU: no dense copy of W.

   int8: W [N, K] int8, one float32 scale per output row.
   int4: W [N, K/2] uint8, two codes a byte (low nibble first, offset 8), one bfloat16 scale per
         group of 32 along K (kernels/packing.py's layout, used as stored: no repack at load).
   f32 / bf16: W [N, K] dense (the fused ops of kernels/csrc/ops.cpp take every format through
         edge_linear, declared in edge_kernels.h).

   One row of x (a decode step at batch 1, bandwidth-bound): each row of W is decoded in registers
   straight into its dot product, the int8 row scale applied once to the sum and each int4 group's
   scale to that group's partial sum. Several rows of x: four output rows at a time are decoded
   (scaled) into a float tile that stays in L1/L2, and a register-blocked micro-kernel dots MR rows of
   x (4 on AVX-512, 3 on AVX2) with the tile's four rows at once (MR x 4 accumulators), so each weight is decoded once per call
   whatever the batch and each load feeds several FMAs. Output rows are split over threads with
   OpenMP (torch's thread count). Three paths, chosen at run time by CPUID (qlinear_isa says which):
   AVX-512 (F, BW, VL), AVX2 + FMA, and the same loops in portable scalar C; qlinear_set_max_isa caps
   the choice (the tests run every path the CPU has). Accumulation is float32 throughout. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "edge_kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EDGE_X86 1
#endif

#define ROWS 4   /* output rows decoded per tile */
#define GROUP 32 /* int4 scale group */
#define PAD 16   /* tile rows and padded x rows are a multiple of this many floats */

enum { ISA_SCALAR = 0, ISA_AVX2 = 1, ISA_AVX512 = 2 };

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* --- portable path ---------------------------------------------------------------------------- */

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

static void decode_bf16_row(const uint16_t *w, int64_t k, float *out) {
    for (int64_t i = 0; i < k; i++) out[i] = bf16_to_f32(w[i]);
}

static float dot_bf16_scalar(const float *x, const uint16_t *w, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += x[i] * bf16_to_f32(w[i]);
    return acc;
}

static float dot_scalar(const float *a, const float *b, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += a[i] * b[i];
    return acc;
}

static float dot_int8_scalar(const float *x, const int8_t *w, float scale, int64_t k) {
    float acc = 0.0f;
    for (int64_t i = 0; i < k; i++) acc += x[i] * (float)w[i];
    return acc * scale;
}

static float dot_int4_scalar(const float *x, const uint8_t *w, const uint16_t *scales, int64_t k) {
    float acc = 0.0f;
    for (int64_t g = 0; g < k / GROUP; g++) {
        const uint8_t *b = w + g * (GROUP / 2);
        const float *xg = x + g * GROUP;
        float sum = 0.0f;
        for (int i = 0; i < GROUP / 2; i++)
            sum += xg[2 * i] * (float)((int)(b[i] & 0x0F) - 8) + xg[2 * i + 1] * (float)((int)(b[i] >> 4) - 8);
        acc += sum * bf16_to_f32(scales[g]);
    }
    return acc;
}

#ifdef EDGE_X86
/* --- AVX2 + FMA ------------------------------------------------------------------------------- */
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the four sums of a, b, c, d in one vector */
AVX2 static inline __m128 hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* 16 int4 codes (bytes b) -> codes 0..15 and 16..31 as signed bytes, in order */
AVX2 static inline void int4_codes(const uint8_t *w, __m128i *first, __m128i *second) {
    const __m128i low_mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
    __m128i b = _mm_loadu_si128((const __m128i *)w);
    __m128i lo = _mm_and_si128(b, low_mask);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), low_mask);
    *first = _mm_sub_epi8(_mm_unpacklo_epi8(lo, hi), eight);
    *second = _mm_sub_epi8(_mm_unpackhi_epi8(lo, hi), eight);
}

AVX2 static inline __m256 cvt8(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

AVX2 static void decode_int8_row_avx2(const int8_t *w, float scale, int64_t k, float *out) {
    __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(cvt8(_mm_loadl_epi64((const __m128i *)(w + i))), s));
    for (; i < k; i++) out[i] = (float)w[i] * scale;
}

AVX2 static void decode_int4_row_avx2(const uint8_t *w, const uint16_t *scales, int64_t k, float *out) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m256 s = _mm256_set1_ps(bf16_to_f32(scales[g]));
        __m128i first, second;
        int4_codes(w + g * (GROUP / 2), &first, &second);
        float *o = out + g * GROUP;
        _mm256_storeu_ps(o, _mm256_mul_ps(cvt8(first), s));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(cvt8(_mm_srli_si128(first, 8)), s));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(cvt8(second), s));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(cvt8(_mm_srli_si128(second, 8)), s));
    }
}

AVX2 static float dot_int8_avx2(const float *x, const int8_t *w, float scale, int64_t k) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(w + i));
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), cvt8(b), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), cvt8(_mm_srli_si128(b, 8)), acc1);
    }
    float rest = 0.0f;
    for (; i < k; i++) rest += x[i] * (float)w[i];
    return (hsum256(_mm256_add_ps(acc0, acc1)) + rest) * scale;
}

AVX2 static float dot_int4_avx2(const float *x, const uint8_t *w, const uint16_t *scales, int64_t k) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m128i first, second;
        int4_codes(w + g * (GROUP / 2), &first, &second);
        const float *xg = x + g * GROUP;
        __m256 sum = _mm256_mul_ps(_mm256_loadu_ps(xg), cvt8(first));
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 8), cvt8(_mm_srli_si128(first, 8)), sum);
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 16), cvt8(second), sum);
        sum = _mm256_fmadd_ps(_mm256_loadu_ps(xg + 24), cvt8(_mm_srli_si128(second, 8)), sum);
        acc = _mm256_fmadd_ps(sum, _mm256_set1_ps(bf16_to_f32(scales[g])), acc);
    }
    return hsum256(acc);
}

AVX2 static inline __m256 bf16x8(const uint16_t *w) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)w)), 16));
}

AVX2 static float dot_f32_avx2(const float *x, const float *w, int64_t k) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), acc1);
    }
    float rest = 0.0f;
    for (; i < k; i++) rest += x[i] * w[i];
    return hsum256(_mm256_add_ps(acc0, acc1)) + rest;
}

AVX2 static float dot_bf16_avx2(const float *x, const uint16_t *w, int64_t k) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), bf16x8(w + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), bf16x8(w + i + 8), acc1);
    }
    float rest = 0.0f;
    for (; i < k; i++) rest += x[i] * bf16_to_f32(w[i]);
    return hsum256(_mm256_add_ps(acc0, acc1)) + rest;
}

AVX2 static void decode_bf16_row_avx2(const uint16_t *w, int64_t k, float *out) {
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(out + i, bf16x8(w + i));
    for (; i < k; i++) out[i] = bf16_to_f32(w[i]);
}

/* y[i, n0 .. n0 + rows) = x[i] . tile[0 .. rows) for every row i of x; kp a multiple of 8 and
   the tile's four rows all written (zeros past `rows`): 3 rows of x x 4 of the tile per pass (12
   accumulators, 3 rows of x and one of the tile in registers: all 16 of AVX2's) */
AVX2 static void tile_dots_avx2(const float *x, int64_t m, int64_t kp, const float *tile, int rows,
                                float *y, int64_t n, int64_t n0) {
    const float *t0 = tile, *t1 = tile + kp, *t2 = tile + 2 * kp, *t3 = tile + 3 * kp;
    int64_t i = 0;
    for (; i + 3 <= m; i += 3) {
        const float *xa = x + i * kp, *xb = xa + kp, *xc = xb + kp;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
        for (int64_t j = 0; j < kp; j += 8) {
            __m256 va = _mm256_loadu_ps(xa + j), vb = _mm256_loadu_ps(xb + j), vc = _mm256_loadu_ps(xc + j);
            __m256 w = _mm256_loadu_ps(t0 + j);
            a0 = _mm256_fmadd_ps(va, w, a0); b0 = _mm256_fmadd_ps(vb, w, b0); c0 = _mm256_fmadd_ps(vc, w, c0);
            w = _mm256_loadu_ps(t1 + j);
            a1 = _mm256_fmadd_ps(va, w, a1); b1 = _mm256_fmadd_ps(vb, w, b1); c1 = _mm256_fmadd_ps(vc, w, c1);
            w = _mm256_loadu_ps(t2 + j);
            a2 = _mm256_fmadd_ps(va, w, a2); b2 = _mm256_fmadd_ps(vb, w, b2); c2 = _mm256_fmadd_ps(vc, w, c2);
            w = _mm256_loadu_ps(t3 + j);
            a3 = _mm256_fmadd_ps(va, w, a3); b3 = _mm256_fmadd_ps(vb, w, b3); c3 = _mm256_fmadd_ps(vc, w, c3);
        }
        float ra[4], rb[4], rc[4];
        _mm_storeu_ps(ra, hsum4_256(a0, a1, a2, a3));
        _mm_storeu_ps(rb, hsum4_256(b0, b1, b2, b3));
        _mm_storeu_ps(rc, hsum4_256(c0, c1, c2, c3));
        memcpy(y + i * n + n0, ra, sizeof(float) * rows);
        memcpy(y + (i + 1) * n + n0, rb, sizeof(float) * rows);
        memcpy(y + (i + 2) * n + n0, rc, sizeof(float) * rows);
    }
    for (; i < m; i++) {
        const float *xa = x + i * kp;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < kp; j += 8) {
            __m256 xv = _mm256_loadu_ps(xa + j);
            a0 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(t0 + j), a0);
            a1 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(t1 + j), a1);
            a2 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(t2 + j), a2);
            a3 = _mm256_fmadd_ps(xv, _mm256_loadu_ps(t3 + j), a3);
        }
        float ra[4];
        _mm_storeu_ps(ra, hsum4_256(a0, a1, a2, a3));
        memcpy(y + i * n + n0, ra, sizeof(float) * rows);
    }
}

/* --- AVX-512 (F, BW, VL) ---------------------------------------------------------------------- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

AVX512 static inline __m512 cvt16(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }

AVX512 static inline __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

AVX512 static inline __m128 hsum4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 a8 = fold512(a), b8 = fold512(b), c8 = fold512(c), d8 = fold512(d);
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

AVX512 static void decode_int8_row_avx512(const int8_t *w, float scale, int64_t k, float *out) {
    __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(cvt16(_mm_loadu_si128((const __m128i *)(w + i))), s));
    if (i < k) {
        __mmask16 mask = (__mmask16)((1u << (k - i)) - 1);
        _mm512_mask_storeu_ps(out + i, mask, _mm512_mul_ps(cvt16(_mm_maskz_loadu_epi8(mask, w + i)), s));
    }
}

AVX512 static void decode_int4_row_avx512(const uint8_t *w, const uint16_t *scales, int64_t k, float *out) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        __m512 s = _mm512_set1_ps(bf16_to_f32(scales[g]));
        __m128i first, second;
        int4_codes(w + g * (GROUP / 2), &first, &second);
        _mm512_storeu_ps(out + g * GROUP, _mm512_mul_ps(cvt16(first), s));
        _mm512_storeu_ps(out + g * GROUP + 16, _mm512_mul_ps(cvt16(second), s));
    }
}

AVX512 static float dot_int8_avx512(const float *x, const int8_t *w, float scale, int64_t k) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), cvt16(_mm_loadu_si128((const __m128i *)(w + i))), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), cvt16(_mm_loadu_si128((const __m128i *)(w + i + 16))), acc1);
    }
    for (; i < k; i += 16) {
        int64_t left = k - i < 16 ? k - i : 16;
        __mmask16 mask = (__mmask16)((1u << left) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), cvt16(_mm_maskz_loadu_epi8(mask, w + i)), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) * scale;
}

AVX512 static float dot_int4_avx512(const float *x, const uint8_t *w, const uint16_t *scales, int64_t k) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t groups = k / GROUP, g = 0;
    for (; g + 2 <= groups; g += 2) {
        __m128i f0, s0, f1, s1;
        int4_codes(w + g * (GROUP / 2), &f0, &s0);
        int4_codes(w + (g + 1) * (GROUP / 2), &f1, &s1);
        const float *xg = x + g * GROUP;
        __m512 sum0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), cvt16(s0), _mm512_mul_ps(_mm512_loadu_ps(xg), cvt16(f0)));
        __m512 sum1 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 48), cvt16(s1), _mm512_mul_ps(_mm512_loadu_ps(xg + 32), cvt16(f1)));
        acc0 = _mm512_fmadd_ps(sum0, _mm512_set1_ps(bf16_to_f32(scales[g])), acc0);
        acc1 = _mm512_fmadd_ps(sum1, _mm512_set1_ps(bf16_to_f32(scales[g + 1])), acc1);
    }
    if (g < groups) {
        __m128i f0, s0;
        int4_codes(w + g * (GROUP / 2), &f0, &s0);
        const float *xg = x + g * GROUP;
        __m512 sum0 = _mm512_fmadd_ps(_mm512_loadu_ps(xg + 16), cvt16(s0), _mm512_mul_ps(_mm512_loadu_ps(xg), cvt16(f0)));
        acc0 = _mm512_fmadd_ps(sum0, _mm512_set1_ps(bf16_to_f32(scales[g])), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

AVX512 static inline __m512 bf16x16(__m256i b) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)); }

AVX512 static float dot_f32_avx512(const float *x, const float *w, int64_t k) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), acc1);
    }
    for (; i < k; i += 16) {
        int64_t left = k - i < 16 ? k - i : 16;
        __mmask16 mask = (__mmask16)((1u << left) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), _mm512_maskz_loadu_ps(mask, w + i), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

AVX512 static float dot_bf16_avx512(const float *x, const uint16_t *w, int64_t k) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), bf16x16(_mm256_loadu_si256((const __m256i *)(w + i))), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), bf16x16(_mm256_loadu_si256((const __m256i *)(w + i + 16))), acc1);
    }
    for (; i < k; i += 16) {
        int64_t left = k - i < 16 ? k - i : 16;
        __mmask16 mask = (__mmask16)((1u << left) - 1);
        acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x + i), bf16x16(_mm256_maskz_loadu_epi16(mask, w + i)), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* as tile_dots_avx2 with kp a multiple of 16: 4 rows of x x 4 of the tile per pass (16 accumulators) */
AVX512 static void tile_dots_avx512(const float *x, int64_t m, int64_t kp, const float *tile, int rows,
                                    float *y, int64_t n, int64_t n0) {
    const float *t0 = tile, *t1 = tile + kp, *t2 = tile + 2 * kp, *t3 = tile + 3 * kp;
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
        const float *xa = x + i * kp;
        __m512 acc[4][4];
        for (int r = 0; r < 4; r++)
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
        for (int64_t j = 0; j < kp; j += 16) {
            __m512 w0 = _mm512_loadu_ps(t0 + j), w1 = _mm512_loadu_ps(t1 + j);
            __m512 w2 = _mm512_loadu_ps(t2 + j), w3 = _mm512_loadu_ps(t3 + j);
            for (int r = 0; r < 4; r++) {
                __m512 xv = _mm512_loadu_ps(xa + r * kp + j);
                acc[r][0] = _mm512_fmadd_ps(xv, w0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(xv, w1, acc[r][1]);
                acc[r][2] = _mm512_fmadd_ps(xv, w2, acc[r][2]);
                acc[r][3] = _mm512_fmadd_ps(xv, w3, acc[r][3]);
            }
        }
        for (int r = 0; r < 4; r++) {
            float out[4];
            _mm_storeu_ps(out, hsum4_512(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            memcpy(y + (i + r) * n + n0, out, sizeof(float) * rows);
        }
    }
    for (; i < m; i++) {
        const float *xa = x + i * kp;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < kp; j += 16) {
            __m512 xv = _mm512_loadu_ps(xa + j);
            a0 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(t0 + j), a0);
            a1 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(t1 + j), a1);
            a2 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(t2 + j), a2);
            a3 = _mm512_fmadd_ps(xv, _mm512_loadu_ps(t3 + j), a3);
        }
        float out[4];
        _mm_storeu_ps(out, hsum4_512(a0, a1, a2, a3));
        memcpy(y + i * n + n0, out, sizeof(float) * rows);
    }
}
#endif

/* --- the path this CPU runs ------------------------------------------------------------------- */

static int cpu_level(void) {
#ifdef EDGE_X86
    static int known = -1;
    if (known < 0) {
        __builtin_cpu_init();  /* libgcc checks that the OS saves the AVX / AVX-512 state too */
        int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl");
        known = avx512 ? ISA_AVX512 : avx2 ? ISA_AVX2 : ISA_SCALAR;
    }
    return known;
#else
    return ISA_SCALAR;
#endif
}

static int max_level = ISA_AVX512; /* qlinear_set_max_isa: the tests run the lower paths too */

static int level(void) {
    int have = cpu_level();
    return have < max_level ? have : max_level;
}

int edge_isa_level(void) { return level(); }

int edge_cpu_isa_level(void) { return cpu_level(); }

static const char *NAMES[] = {"scalar", "avx2", "avx512"};

/* "avx512", "avx2" or "scalar": the path this CPU runs now */
const char *qlinear_isa(void) { return NAMES[level()]; }

/* the best path this CPU has, whatever the cap */
const char *qlinear_cpu_isa(void) { return NAMES[cpu_level()]; }

/* cap the path: 0 scalar, 1 AVX2, 2 AVX-512 (the CPU's own best still bounds it) */
void qlinear_set_max_isa(int isa) { max_level = isa < ISA_SCALAR ? ISA_SCALAR : isa > ISA_AVX512 ? ISA_AVX512 : isa; }

void qlinear_force_scalar(int on) { max_level = on ? ISA_SCALAR : ISA_AVX512; }

/* --- the two entry points --------------------------------------------------------------------- */

static float gemv_row(int isa, int fmt, const float *x, int64_t k, const void *w, const void *scales, int64_t row) {
    if (fmt == EDGE_F32) {
        const float *wr = (const float *)w + row * k;
#ifdef EDGE_X86
        if (isa == ISA_AVX512) return dot_f32_avx512(x, wr, k);
        if (isa == ISA_AVX2) return dot_f32_avx2(x, wr, k);
#endif
        return dot_scalar(x, wr, k);
    }
    if (fmt == EDGE_BF16) {
        const uint16_t *wr = (const uint16_t *)w + row * k;
#ifdef EDGE_X86
        if (isa == ISA_AVX512) return dot_bf16_avx512(x, wr, k);
        if (isa == ISA_AVX2) return dot_bf16_avx2(x, wr, k);
#endif
        return dot_bf16_scalar(x, wr, k);
    }
    if (fmt == EDGE_INT8) {
        const int8_t *wr = (const int8_t *)w + row * k;
        float s = ((const float *)scales)[row];
#ifdef EDGE_X86
        if (isa == ISA_AVX512) return dot_int8_avx512(x, wr, s, k);
        if (isa == ISA_AVX2) return dot_int8_avx2(x, wr, s, k);
#endif
        return dot_int8_scalar(x, wr, s, k);
    }
    const uint8_t *wr = (const uint8_t *)w + row * (k / 2);
    const uint16_t *sr = (const uint16_t *)scales + row * (k / GROUP);
#ifdef EDGE_X86
    if (isa == ISA_AVX512) return dot_int4_avx512(x, wr, sr, k);
    if (isa == ISA_AVX2) return dot_int4_avx2(x, wr, sr, k);
#endif
    return dot_int4_scalar(x, wr, sr, k);
}

static void decode_row(int isa, int fmt, int64_t k, const void *w, const void *scales, int64_t row, float *t) {
    if (fmt == EDGE_F32) {
        memcpy(t, (const float *)w + row * k, sizeof(float) * k);
        return;
    }
    if (fmt == EDGE_BF16) {
        const uint16_t *wr = (const uint16_t *)w + row * k;
#ifdef EDGE_X86
        if (isa == ISA_AVX2 || isa == ISA_AVX512) { decode_bf16_row_avx2(wr, k, t); return; }
#endif
        decode_bf16_row(wr, k, t);
        return;
    }
    if (fmt == EDGE_INT8) {
        const int8_t *wr = (const int8_t *)w + row * k;
        float s = ((const float *)scales)[row];
#ifdef EDGE_X86
        if (isa == ISA_AVX512) { decode_int8_row_avx512(wr, s, k, t); return; }
        if (isa == ISA_AVX2) { decode_int8_row_avx2(wr, s, k, t); return; }
#endif
        decode_int8_row(wr, s, k, t);
        return;
    }
    const uint8_t *wr = (const uint8_t *)w + row * (k / 2);
    const uint16_t *sr = (const uint16_t *)scales + row * (k / GROUP);
#ifdef EDGE_X86
    if (isa == ISA_AVX512) { decode_int4_row_avx512(wr, sr, k, t); return; }
    if (isa == ISA_AVX2) { decode_int4_row_avx2(wr, sr, k, t); return; }
#endif
    decode_int4_row(wr, sr, k, t);
}

void edge_linear(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads,
                 const void *w, const void *scales, int fmt) {
    int isa = level();
    /* a fork and join (a few us) costs more than a product this small */
    if (threads < 1 || n * k * (m < 8 ? 1 : m / 4) < 128 * 1024 || n < 2 * ROWS) threads = 1;
    /* one row of x against int8 / int4: each weight row decoded in registers straight into its dot
       product. Dense rows take the tile path at every m, so a row's result is the same bits whatever
       the batch (int8 / int4 sum one row in another order than several: the last bits may differ) */
    if (m == 1 && (fmt == EDGE_INT8 || fmt == EDGE_INT4)) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
        for (int64_t row = 0; row < n; row++) y[row] = gemv_row(isa, fmt, x, k, w, scales, row);
        return;
    }
    /* rows of x and of the tile padded with zeros to a multiple of PAD: the micro-kernels have no tail */
    int64_t kp = (k + PAD - 1) / PAD * PAD;
    const float *xs = x;
    float *padded = NULL;
    if (kp != k && isa != ISA_SCALAR) {
        padded = (float *)calloc((size_t)(m * kp), sizeof(float));
        if (padded == NULL) isa = ISA_SCALAR;
        else {
            for (int64_t i = 0; i < m; i++) memcpy(padded + i * kp, x + i * k, sizeof(float) * k);
            xs = padded;
        }
    }
    if (isa == ISA_SCALAR) kp = k;
    int64_t blocks = (n + ROWS - 1) / ROWS;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        float *tile = (float *)calloc((size_t)(ROWS * kp), sizeof(float));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t b = 0; b < blocks; b++) {
            int64_t n0 = b * ROWS;
            int rows = (int)(n - n0 < ROWS ? n - n0 : ROWS);
            if (rows < ROWS) memset(tile, 0, sizeof(float) * ROWS * kp);
            for (int r = 0; r < rows; r++) decode_row(isa, fmt, k, w, scales, n0 + r, tile + r * kp);
#ifdef EDGE_X86
            if (isa == ISA_AVX512) { tile_dots_avx512(xs, m, kp, tile, rows, y, n, n0); continue; }
            if (isa == ISA_AVX2) { tile_dots_avx2(xs, m, kp, tile, rows, y, n, n0); continue; }
#endif
            for (int64_t i = 0; i < m; i++)
                for (int r = 0; r < rows; r++) y[i * n + n0 + r] = dot_scalar(x + i * k, tile + r * k, k);
        }
        free(tile);
    }
    free(padded);
}

/* x [m, k] float32, w [n, k] int8, scales [n] float32 -> y [m, n] float32 */
void qlinear_int8(const float *x, int64_t m, int64_t k, const int8_t *w, const float *scales,
                  int64_t n, float *y, int threads) {
    edge_linear(x, m, k, n, y, threads, w, scales, EDGE_INT8);
}

/* x [m, k] float32, w [n, k/2] uint8, scales [n, k/32] bfloat16 -> y [m, n] float32; k % 32 == 0 */
void qlinear_int4(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint16_t *scales,
                  int64_t n, float *y, int threads) {
    edge_linear(x, m, k, n, y, threads, w, scales, EDGE_INT4);
}
