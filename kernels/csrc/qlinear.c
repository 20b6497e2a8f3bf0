/* y = x W^T for compressed weights read in their stored format, on the CPU: no dense copy of W.

   int8: W [N, K] int8, one float32 scale per output row.
   int4: W [N, K/2] uint8, two codes a byte (low nibble first, offset 8), one bfloat16 scale per
         group of 32 along K (kernels/packing.py's layout, used as stored: no repack at load).
   f32 / bf16: W [N, K] dense (the fused ops of kernels/csrc/ops.cpp take every format through
         edge_linear, declared in edge_kernels.h). A bf16 checkpoint's matrices stay bf16 on a CPU
         (kernels.dispatch.keeps_bf16): half the bytes a decode step reads, widened in registers.

   One row of x (a decode step at batch 1, bandwidth-bound): each row of W is decoded in registers
   straight into its dot product, the int8 row scale applied once to the sum and each int4 group's
   scale to that group's partial sum. Several rows of x: four output rows at a time are decoded
   (scaled) into a float tile that stays in L1/L2, and a register-blocked micro-kernel dots MR rows of
   x (4 on AVX-512, 3 on AVX2) with the tile's four rows at once (MR x 4 accumulators), so each weight is decoded once per call
   whatever the batch and each load feeds several FMAs. Output rows are split over threads with
   OpenMP (torch's thread count). Three paths, chosen at run time by CPUID (qlinear_isa says which):
   AVX-512 (F, BW, VL), AVX2 + FMA, and the same loops in portable scalar C; qlinear_set_max_isa caps
   the choice (the tests run every path the CPU has). Accumulation is float32 throughout.

   bf16 rows below the micro-kernel's MR rows of x skip the tile (bf16_rows_*: the same arithmetic,
   so the same bits), and edge_linear_bf16x2 multiplies them on AVX-512 BF16's vdpbf16ps with x split
   into two bf16 halves (the "bf16x2" activations; a path of its own, "avx512_bf16", qlinear_bf16_isa).
   Measured (bench/bf16_linear.py, AMD EPYC Zen 4, one thread, beside other work), batch 1 streamed
   from memory: bf16 widened 18.6-22 GB/s of weights, 2.8-3.5x the float32 path's time per product;
   vdpbf16ps about 5% faster than widening (15% in cache), but 1.3x slower at 32 rows of x. */

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

/* --- bf16 rows read as stored, a few rows of x ----------------------------------------------------

   Why: the tile path writes four decoded rows as float32 (twice the bf16 bytes) and reads them back,
   which pays for itself only when several rows of x share the tile. Below MR rows of x each bf16
   weight is widened in registers straight into the same FMAs, in the same order, with the same
   accumulators and horizontal sums as tile_dots_avx512 / tile_dots_avx2 make of the decoded tile
   (widening a bf16 is exact), so a row's result is the same bits on either path and at every batch
   size. The last chunk of a row (k off the vector width) is read with a mask, as zeros: the tile's
   padding. Four weight rows are read at once, too short a stream each for the hardware prefetcher
   to learn, so each is prefetched into L2 16 KB ahead (bf16_ahead, as qlinear_a8.c does). */

static inline int64_t bf16_ahead(int64_t k) {
    int64_t group = ROWS * k * 2;
    return group * ((16384 + group - 1) / group);
}

AVX512 static inline __attribute__((always_inline)) void bf16_rows_avx512_mr(
    const float *x, int mr, int64_t k, int64_t kp, const uint16_t *const *w, int rows, float *y, int64_t n) {
    __m512 acc[3][4];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t ahead = bf16_ahead(k);
    int64_t j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512 wv[4];
        for (int c = 0; c < 4; c++) {
            __builtin_prefetch(w[c] + j + ahead / 2, 0, 2);
            wv[c] = bf16x16(_mm256_loadu_si256((const __m256i *)(w[c] + j)));
        }
        for (int r = 0; r < mr; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * kp + j);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    if (j < kp) { /* k % 16 left: the mask reads no further than the row, the padded x is zero past k */
        __mmask16 mask = (__mmask16)((1u << (k - j)) - 1);
        __m512 wv[4];
        for (int c = 0; c < 4; c++) wv[c] = bf16x16(_mm256_maskz_loadu_epi16(mask, w[c] + j));
        for (int r = 0; r < mr; r++) {
            __m512 xv = _mm512_loadu_ps(x + r * kp + j);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < mr; r++) {
        float out[4];
        _mm_storeu_ps(out, hsum4_512(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        memcpy(y + r * n, out, sizeof(float) * rows);
    }
}

/* y[i, n0 .. n0 + rows) for the m (< 4) rows of x, x padded to kp (a multiple of 16) */
AVX512 static void bf16_rows_avx512(const float *x, int64_t m, int64_t k, int64_t kp, const uint16_t *const *w,
                                    int rows, float *y, int64_t n) {
    if (m == 1) bf16_rows_avx512_mr(x, 1, k, kp, w, rows, y, n);
    else if (m == 2) bf16_rows_avx512_mr(x, 2, k, kp, w, rows, y, n);
    else bf16_rows_avx512_mr(x, 3, k, kp, w, rows, y, n);
}

/* as bf16_rows_avx512 for tile_dots_avx2's order: 8 wide, m < 3 (its 3-row pass differs in nothing
   per row, but 3 rows x 4 here would need more than AVX2's 16 registers) */
AVX2 static inline __attribute__((always_inline)) void bf16_rows_avx2_mr(
    const float *x, int mr, int64_t k, int64_t kp, const uint16_t *const *w, int rows, float *y, int64_t n) {
    __m256 acc[2][4];
    for (int r = 0; r < 2; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
    const int64_t ahead = bf16_ahead(k);
    int64_t j = 0;
    for (; j + 8 <= k; j += 8) {
        if ((j & 31) == 0)
            for (int c = 0; c < 4; c++) __builtin_prefetch(w[c] + j + ahead / 2, 0, 2);
        for (int c = 0; c < 4; c++) {
            __m256 wv = bf16x8(w[c] + j);
            for (int r = 0; r < mr; r++) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * kp + j), wv, acc[r][c]);
        }
    }
    for (; j < kp; j += 8) { /* the tail, and the tile's zero padding, from a zeroed copy */
        uint16_t tail[4][8] = {{0}};
        for (int c = 0; c < 4; c++)
            for (int64_t t = j; t < k && t < j + 8; t++) tail[c][t - j] = w[c][t];
        for (int c = 0; c < 4; c++) {
            __m256 wv = bf16x8(tail[c]);
            for (int r = 0; r < mr; r++) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * kp + j), wv, acc[r][c]);
        }
    }
    for (int r = 0; r < mr; r++) {
        float out[4];
        _mm_storeu_ps(out, hsum4_256(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        memcpy(y + r * n, out, sizeof(float) * rows);
    }
}

AVX2 static void bf16_rows_avx2(const float *x, int64_t m, int64_t k, int64_t kp, const uint16_t *const *w,
                                int rows, float *y, int64_t n) {
    if (m == 1) bf16_rows_avx2_mr(x, 1, k, kp, w, rows, y, n);
    else bf16_rows_avx2_mr(x, 2, k, kp, w, rows, y, n);
}

/* --- AVX-512 BF16: vdpbf16ps ------------------------------------------------------------------------

   Why: widening costs two operations per 16 weights before the FMA; vdpbf16ps multiplies 32 bf16
   pairs into 16 float32 sums in one. It multiplies bf16 by bf16, so each row of x is split once per
   call into two bf16 rows, hi = bf16(x) (round to nearest even) and lo = bf16(x - hi): hi + lo
   carries 16 of x's 24 significant bits (|x - hi - lo| <= 2^-16 |x|), and the weight is dotted with
   each (a bf16 x bf16 product is exact in float32). Float32 accumulation, 16 lanes of pairs per
   (row of x, row of W), summed as the other paths do; one code for every batch size (up to four rows
   of x against four of W a pass, each pair's arithmetic the same in any pass), so a row's result is
   the same bits whatever the batch, though not the widening paths' bits. vdpbf16ps treats
   denormal inputs and results as zero (below 2^-126: no weight or activation of a model). */
#if !defined(EDGE_NO_BF16DP) && (defined(__clang__) ? __clang_major__ >= 9 : (defined(__GNUC__) && __GNUC__ >= 10))
#define EDGE_HAVE_BF16DP 1
#define BF16DP __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx2,fma")))

/* x [m, k] -> hi, lo [m, kq] bf16 (kq: k up to a multiple of 32, zeros past k) */
BF16DP static void bf16_split(const float *x, int64_t m, int64_t k, int64_t kq, uint16_t *hi, uint16_t *lo) {
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < kq; j += 16) {
            int64_t left = k - j;
            __mmask16 mask = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __m512 v = _mm512_maskz_loadu_ps(mask, x + i * k + j);
            __m256bh h = _mm512_cvtneps_pbh(v);
            __m512 rest = _mm512_sub_ps(v, bf16x16((__m256i)h));
            _mm256_storeu_si256((__m256i *)(hi + i * kq + j), (__m256i)h);
            _mm256_storeu_si256((__m256i *)(lo + i * kq + j), (__m256i)_mm512_cvtneps_pbh(rest));
        }
}

BF16DP static inline __attribute__((always_inline)) void bf16_dp_mr(
    const uint16_t *hi, const uint16_t *lo, int mr, int64_t k, int64_t kq, const uint16_t *const *w, int rows,
    float *y, int64_t n) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_setzero_ps();
    const int64_t ahead = bf16_ahead(k);
    for (int64_t j = 0; j < kq; j += 32) {
        int64_t left = k - j;
        __mmask32 mask = left >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << left) - 1); /* no read past a row */
        __m512bh wv[4];
        for (int c = 0; c < 4; c++) {
            __builtin_prefetch(w[c] + j + ahead / 2, 0, 2);
            wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[c] + j);
        }
        for (int r = 0; r < mr; r++) {
            __m512bh xh = (__m512bh)_mm512_loadu_si512((const void *)(hi + r * kq + j));
            __m512bh xl = (__m512bh)_mm512_loadu_si512((const void *)(lo + r * kq + j));
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][c], xh, wv[c]), xl, wv[c]);
        }
    }
    for (int r = 0; r < mr; r++) {
        float out[4];
        _mm_storeu_ps(out, hsum4_512(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        memcpy(y + r * n, out, sizeof(float) * rows);
    }
}

/* y[i, n0 .. n0 + rows) for every row i of x (split into hi, lo [m, kq]) */
BF16DP static void bf16_dp_rows(const uint16_t *hi, const uint16_t *lo, int64_t m, int64_t k, int64_t kq,
                                const uint16_t *const *w, int rows, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) bf16_dp_mr(hi + i * kq, lo + i * kq, 4, k, kq, w, rows, y + i * n, n);
    if (m - i == 3) bf16_dp_mr(hi + i * kq, lo + i * kq, 3, k, kq, w, rows, y + i * n, n);
    else if (m - i == 2) bf16_dp_mr(hi + i * kq, lo + i * kq, 2, k, kq, w, rows, y + i * n, n);
    else if (m - i == 1) bf16_dp_mr(hi + i * kq, lo + i * kq, 1, k, kq, w, rows, y + i * n, n);
}
#endif
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

/* bf16 weights have a path more: "avx512_bf16" (vdpbf16ps, for the "bf16x2" activations of
   edge_linear_bf16x2) above the widening ones, where the CPU has AVX-512 BF16 and the compiler knew
   it; qlinear_set_max_isa's cap bounds it (AVX-512 BF16 only under an "avx512" cap), and
   qlinear_bf16_set_max too (the tests run every path) */
enum { BF16_DP = 3 };
static const char *BF16_NAMES[] = {"scalar", "avx2", "avx512", "avx512_bf16"};

static int bf16_cpu(void) {
    int isa = cpu_level();
#ifdef EDGE_HAVE_BF16DP
    static int dp = -1;
    if (dp < 0) dp = isa == ISA_AVX512 && __builtin_cpu_supports("avx512bf16");
    if (dp) return BF16_DP;
#endif
    return isa;
}

static int bf16_max = BF16_DP;

static int bf16_level(void) {
    int best = bf16_cpu(), cap = level();
    int bound = cap == ISA_AVX512 ? BF16_DP : cap;
    int path = best < bound ? best : bound;
    return path < bf16_max ? path : bf16_max;
}

/* "avx512_bf16", "avx512", "avx2" or "scalar": the best path a bf16 weight's product may run now
   (float32 activations run the widening one at most: "avx512") */
const char *qlinear_bf16_isa(void) { return BF16_NAMES[bf16_level()]; }

/* the best bf16 path this CPU has, whatever the caps */
const char *qlinear_bf16_cpu_isa(void) { return BF16_NAMES[bf16_cpu()]; }

/* cap the bf16 path: 0 scalar, 1 avx2, 2 avx512, 3 avx512_bf16 */
void qlinear_bf16_set_max(int path) { bf16_max = path < ISA_SCALAR ? ISA_SCALAR : path > BF16_DP ? BF16_DP : path; }

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

/* W's four rows from n0 (the last one repeated past n: those sums are not stored) */
static void four_rows(const uint16_t *w, int64_t k, int64_t n0, int rows, const uint16_t **out) {
    for (int r = 0; r < ROWS; r++) out[r] = w + (n0 + (r < rows ? r : rows - 1)) * k;
}

#ifdef EDGE_HAVE_BF16DP
/* the AVX-512 BF16 path: x split once, then every block of four rows of W; 0 out of memory */
static int bf16_dp_linear(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads,
                          const uint16_t *w) {
    int64_t kq = (k + 31) / 32 * 32;
    uint16_t *hi = (uint16_t *)malloc(sizeof(uint16_t) * (size_t)(2 * m * kq) + 64);
    if (hi == NULL) return 0;
    uint16_t *lo = hi + m * kq;
    bf16_split(x, m, k, kq, hi, lo);
    int64_t blocks = (n + ROWS - 1) / ROWS;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t b = 0; b < blocks; b++) {
        int64_t n0 = b * ROWS;
        int rows = (int)(n - n0 < ROWS ? n - n0 : ROWS);
        const uint16_t *wr[ROWS];
        four_rows(w, k, n0, rows, wr);
        bf16_dp_rows(hi, lo, m, k, kq, wr, rows, y + n0, n);
    }
    free(hi);
    return 1;
}
#endif

void edge_linear(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads,
                 const void *w, const void *scales, int fmt) {
    int isa = level();
    /* a fork and join (a few us) costs more than a product this small */
    if (threads < 1 || n * k * (m < 8 ? 1 : m / 4) < 128 * 1024 || n < 2 * ROWS) threads = 1;
    if (fmt == EDGE_BF16) {
        int path = bf16_level(); /* the bf16 cap, lower than the f32 one in the tests */
        if (path < isa) isa = path;
    }
    /* one row of x against int8 / int4: each weight row decoded in registers straight into its dot
       product. Dense rows take the tile path (or for bf16 below 4 / 3 rows of x its direct rows, the
       same arithmetic) at every m, so a row's result is the same bits whatever the batch (int8 / int4
       sum one row in another order than several: the last bits may differ) */
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
    /* bf16 rows against fewer rows of x than the tile's micro-kernel takes: widened in registers */
    int direct = fmt == EDGE_BF16 && m >= 1 && ((isa == ISA_AVX512 && m < 4) || (isa == ISA_AVX2 && m < 3));
    int64_t blocks = (n + ROWS - 1) / ROWS;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        float *tile = direct ? NULL : (float *)calloc((size_t)(ROWS * kp), sizeof(float));
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t b = 0; b < blocks; b++) {
            int64_t n0 = b * ROWS;
            int rows = (int)(n - n0 < ROWS ? n - n0 : ROWS);
#ifdef EDGE_X86
            if (direct) {
                const uint16_t *wr[ROWS];
                four_rows((const uint16_t *)w, k, n0, rows, wr);
                if (isa == ISA_AVX512) bf16_rows_avx512(xs, m, k, kp, wr, rows, y + n0, n);
                else bf16_rows_avx2(xs, m, k, kp, wr, rows, y + n0, n);
                continue;
            }
#endif
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

/* y = x W^T for a bf16 W with x in "bf16x2" activations (each row split into two bf16 halves,
   vdpbf16ps): on the AVX-512 BF16 path where the CPU has it and the caps allow, else (and out of
   memory for the split x) edge_linear's float32 activations, a closer product */
void edge_linear_bf16x2(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads, const void *w) {
#ifdef EDGE_HAVE_BF16DP
    int ths = threads < 1 || n * k * (m < 8 ? 1 : m / 4) < 128 * 1024 || n < 2 * ROWS ? 1 : threads;
    if (bf16_level() == BF16_DP && bf16_dp_linear(x, m, k, n, y, ths, (const uint16_t *)w)) return;
#endif
    edge_linear(x, m, k, n, y, threads, w, NULL, EDGE_BF16);
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
