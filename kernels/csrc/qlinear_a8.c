/* y = x W^T for int8 / int4 weights with the activations in 8 bits ("a8", kernels/formats.py's
   ACTIVATION table; kernels/activation_quant.py is the float64 reference of the same integer math).

   Why: qlinear.c widens every weight to float32 and multiplies by float32 activations: about ten
   vector operations per 16 bytes of weights, so a decode step at batch 1 is bound by arithmetic,
   not by the bytes it reads. Here each row of x is quantized once per call into blocks of 32 (an
   int8 value each, round to nearest even of x / d with d = max|x| / 127 per block, a float32 d per
   block, and for int4 the block's sum of codes), and the products run on integer units: 64 weight
   bytes a vpdpbusd on AVX-512 VNNI, 32 on AVX-VNNI, maddubs + madd on plain AVX2, and plain C
   elsewhere (the same sums). A block's integer dot product is exact in int32; it is scaled once
   by d (and int4's group scale), and the int8 row scale is applied to the row's sum.

   Four output rows at a time: one load of the packed activations (and their block scales) serves
   four weight rows. Several rows of x: two rows of x a pass against the same four weight rows
   (int4 shares the weight loads, nibble split and scale spread between them; int8 takes them one by
   one), the rest of the batch over the same rows while they are in L1; a row's arithmetic is the
   same in every case, so its result is the same bits whatever the batch and thread count.

   Measured (bench/int_dot_linear.py, AMD EPYC Zen 4, one thread, beside other work): at batch 1,
   int4 is 3.1-3.7x as fast as qlinear.c with the weight in cache and 2.4-2.5x streamed from memory;
   int8 1.6-2.0x in cache and level streamed (0.93-0.99x), where both read at the core's memory rate.

   int4's offset (codes 0..15 stand for -8..7) is folded into the integer sums: the accumulator of
   each block starts at -8 x the block's sum of x codes (-2 in each of its four int32 lanes). int8
   uses no offset: |x| (unsigned) against w carrying x's sign, as an offset of 128 would overflow
   maddubs's int16 pairs on AVX2 and leave large lanes to cancel in float on VNNI.

   Paths, chosen at run time like qlinear.c's (CPUID, capped by qlinear_set_max_isa, and by
   qlinear_a8_set_max for the tests): "avx512_vnni" (512 bits), "avx_vnni" (the 256-bit kernels with
   vpdpbusd: the VEX form on a CPU with AVX-VNNI, else AVX-512 VNNI's EVEX form), "avx2" (maddubs),
   "scalar". A compiler without one of these instruction sets builds without that path. */

#include <math.h>
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
#if defined(__clang__) ? __clang_major__ >= 6 : (defined(__GNUC__) && __GNUC__ >= 8)
#define A8_HAVE_VNNI512 1
#endif
#if defined(__clang__) ? __clang_major__ >= 12 : (defined(__GNUC__) && __GNUC__ >= 11)
#define A8_HAVE_AVXVNNI 1
#endif
#endif

#define A8_BLOCK 32 /* activation values per scale (int4's weight group too) */
#define ROWS 4      /* output rows per activation load */

enum { A8_SCALAR = 0, A8_AVX2 = 1, A8_VNNI256 = 2, A8_VNNI512 = 3 };
static const char *A8_NAMES[] = {"scalar", "avx2", "avx_vnni", "avx512_vnni"};

/* activation rows packed for one path: q [m, kp] codes (zero past k), d [m, nb] block scales; int4
   also dl and o [m, nb * 4]: the block scale and -2 x the block's code sum, once per int32 lane */
typedef struct {
    int64_t k, kp, nb;
    int8_t *q;
    float *d, *dl;
    int32_t *o;
    int wpacked; /* the int8 weights these rows meet are repacked (EDGE_INT8_R4: w8at) */
} A8Rows;

struct EdgeA8 {
    A8Rows a;
    int64_t m;
    int fmt, path;
};

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* --- the path this CPU runs ------------------------------------------------------------------- */

static int has_vex_vnni = 0; /* AVX-VNNI (VEX), set by a8_cpu */

static int a8_cpu(void) {
    static int known = -1;
    if (known >= 0) return known;
    int isa = edge_cpu_isa_level(), v512 = 0, vex = 0;
#ifdef EDGE_X86
    __builtin_cpu_init();
#ifdef A8_HAVE_VNNI512
    v512 = isa >= 2 && __builtin_cpu_supports("avx512vnni");
#endif
#ifdef A8_HAVE_AVXVNNI
    vex = isa >= 1 && __builtin_cpu_supports("avxvnni");
#endif
#endif
    has_vex_vnni = vex;
    known = v512 ? A8_VNNI512 : vex ? A8_VNNI256 : isa >= 1 ? A8_AVX2 : A8_SCALAR;
    return known;
}

static int a8_max = A8_VNNI512;

static int a8_level(void) {
    int best = a8_cpu(), isa = edge_isa_level(); /* the cap the f32 kernels run under */
    /* AVX2's cap rules out AVX-512's EVEX encodings, not AVX-VNNI's VEX ones */
    int bound = isa == 0 ? A8_SCALAR : isa == 1 ? (has_vex_vnni ? A8_VNNI256 : A8_AVX2) : A8_VNNI512;
    int level = best < bound ? best : bound;
    return level < a8_max ? level : a8_max;
}

/* "avx512_vnni", "avx_vnni", "avx2" or "scalar": the path the a8 products run now */
const char *qlinear_a8_isa(void) { return A8_NAMES[a8_level()]; }

/* the best a8 path this CPU has, whatever the caps */
const char *qlinear_a8_cpu_isa(void) { return A8_NAMES[a8_cpu()]; }

/* cap the a8 path: 0 scalar, 1 avx2, 2 avx_vnni, 3 avx512_vnni (the tests run every path) */
void qlinear_a8_set_max(int path) { a8_max = path < A8_SCALAR ? A8_SCALAR : path > A8_VNNI512 ? A8_VNNI512 : path; }

/* --- packing the activations ------------------------------------------------------------------ */

/* how many values of K one step of the path's loop takes (k is padded with zeros to a multiple) and
   how many int4 blocks share one interleaved run (evens, then odds); 0: natural order */
static int64_t a8_step(int fmt, int path) {
    if (path == A8_VNNI512) return fmt == EDGE_INT4 ? 128 : 64;
    if (path == A8_SCALAR) return A8_BLOCK;
    return fmt == EDGE_INT4 ? 64 : 32;
}

static int interleave(int fmt, int path) {
    if (fmt != EDGE_INT4 || path == A8_SCALAR) return 0;
    return path == A8_VNNI512 ? 4 : 2;
}

/* one row of x: round to nearest even of x / d, d = max|x| / 127 per block (x * (1 / d) in float32,
   as the reference computes it; clamped before rounding, so an overflow cannot wrap) */
static void pack_row(const float *x, int fmt, int path, A8Rows *a, int64_t i) {
    int64_t k = a->k;
    int8_t *q = a->q + i * a->kp;
    float *d = a->d + i * a->nb;
    int g = interleave(fmt, path);
    memset(q, 0, (size_t)a->kp);
    for (int64_t b = 0; b < a->nb; b++) {
        int64_t start = b * A8_BLOCK, n = k - start < A8_BLOCK ? k - start : A8_BLOCK;
        float amax = 0.0f;
        for (int64_t j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[start + j]));
        float db = amax / 127.0f, inv = db > 0.0f ? 1.0f / db : 0.0f;
        int32_t sum = 0;
        int8_t codes[A8_BLOCK] = {0};
        for (int64_t j = 0; j < n; j++) {
            float v = x[start + j] * inv;
            v = fminf(fmaxf(v, -127.0f), 127.0f);
            codes[j] = (int8_t)lrintf(v);
            sum += codes[j];
        }
        d[b] = db;
        if (g == 0) memcpy(q + start, codes, A8_BLOCK);
        else {
            int8_t *run = q + (b / g) * g * A8_BLOCK; /* the g blocks' evens, then their odds */
            int64_t t = b % g;
            for (int j = 0; j < A8_BLOCK / 2; j++) {
                run[t * 16 + j] = codes[2 * j];
                run[g * 16 + t * 16 + j] = codes[2 * j + 1];
            }
        }
        if (fmt == EDGE_INT4) {
            for (int l = 0; l < 4; l++) {
                a->dl[(i * a->nb + b) * 4 + l] = db;
                a->o[(i * a->nb + b) * 4 + l] = -2 * sum;
            }
        }
    }
}

EdgeA8 *edge_a8_pack(const float *x, int64_t m, int64_t k, int fmt, int threads) {
    int wpacked = fmt == EDGE_INT8_R4; /* int8's activations, for weights repacked at load */
    if (wpacked) fmt = EDGE_INT8;
    int path = a8_level();
    int64_t step = a8_step(fmt, path), kp = (k + step - 1) / step * step, nb = kp / A8_BLOCK;
    EdgeA8 *p = (EdgeA8 *)calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    size_t lanes = fmt == EDGE_INT4 ? (size_t)(m * nb * 4) : 0;
    p->a.q = (int8_t *)malloc((size_t)(m * kp) + 64);
    p->a.d = (float *)malloc(sizeof(float) * (size_t)(m * nb) + 64);
    p->a.dl = (float *)malloc(sizeof(float) * lanes + 64);
    p->a.o = (int32_t *)malloc(sizeof(int32_t) * lanes + 64);
    if (p->a.q == NULL || p->a.d == NULL || p->a.dl == NULL || p->a.o == NULL) {
        edge_a8_free(p);
        return NULL;
    }
    p->a.k = k, p->a.kp = kp, p->a.nb = nb, p->a.wpacked = wpacked, p->m = m, p->fmt = fmt, p->path = path;
    if (threads < 1 || m * k < 64 * 1024) threads = 1; /* packing is O(m k): a fork costs more below */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t i = 0; i < m; i++) pack_row(x + i * k, fmt, path, &p->a, i);
    return p;
}

void edge_a8_free(EdgeA8 *p) {
    if (p == NULL) return;
    free(p->a.q), free(p->a.d), free(p->a.dl), free(p->a.o);
    free(p);
}

/* --- int8 weights repacked at load (EDGE_INT8_R4) ----------------------------------------------

   Why: the kernels below read four weight rows at once, four streams too short each for the hardware
   prefetcher to learn (software prefetch into L2 brings int8 streamed from memory to 15-17 GB/s a
   thread, against 18-20 for one row at a time). Repacked, a block of four rows is one stream: chunk c
   of the block holds the four rows' bytes 64c .. 64c + 63 one after another (256 bytes), rows padded
   with zeros to a multiple of 64 bytes and the last block with zero rows to four
   (kernels.native_ops.repack_int8 does it at load; the checkpoint keeps its own layout). Byte j of a
   row is then 256 (j / 64) + j % 64 past the row's first chunk; the same codes meet the same
   activations in the same order as unpacked, so the result is the same bits. One stream is what the
   hardware prefetcher follows best, so the kernels prefetch nothing for it (kept, it cost as much as
   the repack gave). Measured (int8 at batch 1 streamed from memory, one thread, AMD EPYC Zen 4, a
   shared 2-core VM beside other work, medians of 7 interleaved rounds): 1.01-1.21x the rows as
   stored (2048 x 2048: 17.0-19.7 GB/s against 16.4-17.1; 4096 x 7168, whose 7 KB rows are long
   enough streams already, 1.01-1.03x); 1.15x with a 5632 x 2048 weight in L3; at two threads
   0.8-1.2x, within what the neighbours' load moved it. */

static inline const int8_t *w8at(const int8_t *row, int64_t j, const int packed) {
    return packed ? row + (j >> 6) * 256 + (j & 63) : row + j;
}

/* --- portable path ---------------------------------------------------------------------------- */

static void int8_rows_scalar(const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw, float *out) {
    const int8_t *q = a->q + i * a->kp;
    const float *d = a->d + i * a->nb;
    for (int r = 0; r < ROWS; r++) {
        float f = 0.0f;
        for (int64_t b = 0; b < a->nb; b++) {
            int64_t start = b * A8_BLOCK, n = a->k - start < A8_BLOCK ? a->k - start : A8_BLOCK;
            int32_t s = 0;
            for (int64_t j = 0; j < n; j++) s += (int32_t)q[start + j] * *w8at(w[r], start + j, a->wpacked);
            f += (float)s * d[b];
        }
        out[r] = f * sw[r];
    }
}

static void int4_rows_scalar1(const A8Rows *a, int64_t i, const uint8_t *const *w, const uint16_t *const *s,
                              float *out) {
    const int8_t *q = a->q + i * a->kp;
    const float *d = a->d + i * a->nb;
    for (int r = 0; r < ROWS; r++) {
        float f = 0.0f;
        for (int64_t b = 0; b < a->k / A8_BLOCK; b++) {
            const uint8_t *wb = w[r] + b * (A8_BLOCK / 2);
            const int8_t *qb = q + b * A8_BLOCK;
            int32_t sum = 0;
            for (int j = 0; j < A8_BLOCK / 2; j++)
                sum += ((int32_t)(wb[j] & 0x0F) - 8) * qb[2 * j] + ((int32_t)(wb[j] >> 4) - 8) * qb[2 * j + 1];
            f += (float)sum * (bf16_to_f32(s[r][b]) * d[b]);
        }
        out[r] = f;
    }
}

/* How far ahead of a weight row the SIMD kernels prefetch (into L2: hint 2, prefetcht1): the same
   place in a later group of four rows, at least 16 KB on. Why: they read four rows at once, and a
   row (2-11 KB at the mid-size shapes) is too short a stream for the hardware prefetcher to learn
   before it ends. Measured on int8 2048 x 2048 streamed from memory, one thread (AMD EPYC, Zen 4):
   9 GB/s without, 9.5 prefetching into L1 (its few miss buffers bound it), 15-16.5 into L2 from
   8 KB on, as qlinear.c's one-row-at-a-time loop (16.5-19.6, the same run). */
static inline int64_t a8_ahead(int64_t row_bytes) {
    int64_t group = ROWS * row_bytes;
    return group * ((16384 + group - 1) / group);
}

static void int4_rows_scalar(const A8Rows *a, const int64_t *ix, int nx, const uint8_t *const *w,
                             const uint16_t *const *s, float *out) {
    for (int x = 0; x < nx; x++) int4_rows_scalar1(a, ix[x], w, s, out + 4 * x);
}

#ifdef EDGE_X86
/* --- the 256-bit paths: one source (qlinear_a8_256.h), three instruction sets ------------------- */

#define A8_TARGET __attribute__((target("avx2,fma")))
#define A8_FN(name) name##_avx2
#define A8_DOT(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
/* the two maddubs added in int16 before one madd: int4 pairs are at most 2 x 2 x 15 x 127 */
#define A8_DOT2(acc, u1, s1, u2, s2)                                                                       \
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u1, s1),                \
                                                             _mm256_maddubs_epi16(u2, s2)),               \
                                            _mm256_set1_epi16(1)))
#include "qlinear_a8_256.h"
#undef A8_TARGET
#undef A8_FN
#undef A8_DOT
#undef A8_DOT2

#ifdef A8_HAVE_AVXVNNI
#define A8_TARGET __attribute__((target("avxvnni,avx2,fma")))
#define A8_FN(name) name##_avxvnni
#define A8_DOT(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#define A8_DOT2(acc, u1, s1, u2, s2) _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, u1, s1), u2, s2)
#include "qlinear_a8_256.h"
#undef A8_TARGET
#undef A8_FN
#undef A8_DOT
#undef A8_DOT2
#endif

#ifdef A8_HAVE_VNNI512
#define AVX512VNNI "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma"
#define A8_TARGET __attribute__((target(AVX512VNNI)))
#define A8_FN(name) name##_evex256
#define A8_DOT(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#define A8_DOT2(acc, u1, s1, u2, s2) _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(acc, u1, s1), u2, s2)
#include "qlinear_a8_256.h"
#undef A8_TARGET
#undef A8_FN
#undef A8_DOT
#undef A8_DOT2

/* --- AVX-512 VNNI, 512 bits --------------------------------------------------------------------- */
#define AVX512V __attribute__((target(AVX512VNNI)))

AVX512V static inline __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

AVX512V static inline __m128 hsum4_512(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(fold512(a), fold512(b)), _mm256_hadd_ps(fold512(c), fold512(d)));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* int8, two blocks a vector: |x| against w negated where x < 0 (AVX-512 has no vpsignb); `packed`: a
   constant in each of the two copies int8_rows_avx512 calls, so neither tests it in its loop */
AVX512V static inline __attribute__((always_inline)) void int8_body_avx512(
    const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw, float *out, const int packed) {
    const int8_t *q = a->q + i * a->kp;
    const float *d = a->d + i * a->nb;
    int64_t k = a->k, steps = a->kp / 64;
    const __m512i zero = _mm512_setzero_si512();
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0;
    const int64_t ahead = a8_ahead(k);
    for (int64_t v = 0; v < steps; v++) {
        int64_t left = k - v * 64;
        __mmask64 in = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1); /* no read past a row */
        __m512i xv = _mm512_loadu_si512((const void *)(q + v * 64));
        __m512i ax = _mm512_abs_epi8(xv);
        __mmask64 neg = _mm512_movepi8_mask(xv);
        __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(d + 2 * v))); /* the two blocks' d */
        __m512 dv = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d2));
#define A8_ROW(r, f)                                                                                      \
    do {                                                                                                  \
        if (!packed) __builtin_prefetch(w[r] + v * 64 + ahead, 0, 2); /* repacked: one stream */        \
        __m512i wv = _mm512_maskz_loadu_epi8(in, w8at(w[r], v * 64, packed));                             \
        __m512i acc = _mm512_dpbusd_epi32(zero, ax, _mm512_mask_sub_epi8(wv, neg, zero, wv));             \
        f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), dv, f);                                              \
    } while (0)
        A8_ROW(0, f0);
        A8_ROW(1, f1);
        A8_ROW(2, f2);
        A8_ROW(3, f3);
#undef A8_ROW
    }
    _mm_storeu_ps(out, _mm_mul_ps(hsum4_512(f0, f1, f2, f3), _mm_loadu_ps(sw)));
}

AVX512V static void int8_rows_avx512(const A8Rows *a, int64_t i, const int8_t *const *w, const float *sw,
                                     float *out) {
    if (a->wpacked) int8_body_avx512(a, i, w, sw, out, 1);
    else int8_body_avx512(a, i, w, sw, out, 0);
}

/* int4, four blocks a vector (64 bytes: their low nibbles against the four blocks' evens, high
   nibbles against their odds), four weight rows against nx (1 or 2) rows of x as in the 256-bit
   int4_body; each block's scale spread to its four lanes by one word permute */
AVX512V static inline __attribute__((always_inline)) void int4_body_avx512(
    const A8Rows *a, const int64_t *ix, const int nx, const uint8_t *const *w, const uint16_t *const *s,
    float *out) {
    static const uint16_t SPREAD[32] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1,
                                        0, 2, 0, 2, 0, 2, 0, 2, 0, 3, 0, 3, 0, 3, 0, 3};
    int64_t blocks = a->k / A8_BLOCK, steps = a->kp / 128;
    const __m512i nib = _mm512_set1_epi8(0x0F), spread = _mm512_loadu_si512((const void *)SPREAD);
    const int64_t ahead = a8_ahead(a->k / 2);
    __m512 f[2][4];
    for (int x = 0; x < nx; x++)
        for (int r = 0; r < 4; r++) f[x][r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < steps; g++) {
        int64_t left = blocks - g * 4; /* blocks of this step that are there: 1 to 4 */
        __mmask64 in = left >= 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * left)) - 1);
        __mmask8 sin = left >= 4 ? 0x0F : (__mmask8)((1u << left) - 1);
        __m512i xe[2], xo[2], ol[2];
        __m512 dlv[2];
        for (int x = 0; x < nx; x++) {
            const int8_t *q = a->q + ix[x] * a->kp + g * 128;
            xe[x] = _mm512_loadu_si512((const void *)q);
            xo[x] = _mm512_loadu_si512((const void *)(q + 64));
            ol[x] = _mm512_loadu_si512((const void *)(a->o + ix[x] * a->nb * 4 + g * 16));
            dlv[x] = _mm512_loadu_ps(a->dl + ix[x] * a->nb * 4 + g * 16);
        }
        for (int r = 0; r < 4; r++) {
            __builtin_prefetch(w[r] + g * 64 + ahead, 0, 2);
            __m512i wv = _mm512_maskz_loadu_epi8(in, w[r] + g * 64);
            __m512i lo = _mm512_and_si512(wv, nib), hi = _mm512_and_si512(_mm512_srli_epi16(wv, 4), nib);
            __m128i s4 = _mm_maskz_loadu_epi16(sin, s[r] + g * 4);
            /* bf16 j into the high half of block j's four lanes, the low halves zero: float32 */
            __m512i sw = _mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, spread, _mm512_castsi128_si512(s4));
            __m512 sl = _mm512_castsi512_ps(sw);
            for (int x = 0; x < nx; x++) {
                __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(ol[x], lo, xe[x]), hi, xo[x]);
                f[x][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sl, dlv[x]), f[x][r]);
            }
        }
    }
    for (int x = 0; x < nx; x++) _mm_storeu_ps(out + 4 * x, hsum4_512(f[x][0], f[x][1], f[x][2], f[x][3]));
}

AVX512V static void int4_rows_avx512(const A8Rows *a, const int64_t *ix, int nx, const uint8_t *const *w,
                                     const uint16_t *const *s, float *out) {
    if (nx == 2) int4_body_avx512(a, ix, 2, w, s, out);
    else int4_body_avx512(a, ix, 1, w, s, out);
}
#endif /* A8_HAVE_VNNI512 */
#endif /* EDGE_X86 */

/* --- the products ----------------------------------------------------------------------------- */

/* four output rows (pointers into W) against nx (1 or 2) packed rows ix of x: out [nx][4] */
static void rows4(const EdgeA8 *p, const int64_t *ix, int nx, const void *const *w, const void *const *s,
                  float *out) {
    const A8Rows *a = &p->a;
    if (p->fmt == EDGE_INT8) { /* int8's |x| x signed w leaves nothing to share between rows of x */
        const int8_t *const *w8 = (const int8_t *const *)w;
        const float *sw = (const float *)s[ROWS]; /* the four row scales, gathered by the caller */
        for (int x = 0; x < nx; x++) {
            float *o = out + 4 * x;
            int64_t i = ix[x];
#ifdef EDGE_X86
            switch (p->path) {
#ifdef A8_HAVE_VNNI512
            case A8_VNNI512: int8_rows_avx512(a, i, w8, sw, o); continue;
            case A8_VNNI256:
#ifdef A8_HAVE_AVXVNNI
                if (has_vex_vnni) { int8_rows_avxvnni(a, i, w8, sw, o); continue; }
#endif
                int8_rows_evex256(a, i, w8, sw, o);
                continue;
#elif defined(A8_HAVE_AVXVNNI)
            case A8_VNNI256: int8_rows_avxvnni(a, i, w8, sw, o); continue;
#endif
            case A8_AVX2: int8_rows_avx2(a, i, w8, sw, o); continue;
            default: break;
            }
#endif
            int8_rows_scalar(a, i, w8, sw, o);
        }
        return;
    }
    const uint8_t *const *w4 = (const uint8_t *const *)w;
    const uint16_t *const *s4 = (const uint16_t *const *)s;
#ifdef EDGE_X86
    switch (p->path) {
#ifdef A8_HAVE_VNNI512
    case A8_VNNI512: int4_rows_avx512(a, ix, nx, w4, s4, out); return;
    case A8_VNNI256:
#ifdef A8_HAVE_AVXVNNI
        if (has_vex_vnni) { int4_rows_avxvnni(a, ix, nx, w4, s4, out); return; }
#endif
        int4_rows_evex256(a, ix, nx, w4, s4, out);
        return;
#elif defined(A8_HAVE_AVXVNNI)
    case A8_VNNI256: int4_rows_avxvnni(a, ix, nx, w4, s4, out); return;
#endif
    case A8_AVX2: int4_rows_avx2(a, ix, nx, w4, s4, out); return;
    default: break;
    }
#endif
    int4_rows_scalar(a, ix, nx, w4, s4, out);
}

/* y [m, n] = the packed rows of x (row j is packed row rows[j], or j without `rows`) times W [n, k]
   in the pack's format (int8: float32 scale per row; int4: bfloat16 scale per 32) */
void edge_a8_linear(const EdgeA8 *p, const int64_t *rows, int64_t m, int64_t n, float *y, int threads,
                    const void *w, const void *scales) {
    int64_t k = p->a.k, groups = (n + ROWS - 1) / ROWS;
    /* a fork and join (a few us) costs more than a product this small */
    if (threads < 1 || n * k * (m < 8 ? 1 : m / 4) < 128 * 1024 || n < 2 * ROWS) threads = 1;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(threads)
#endif
    for (int64_t g = 0; g < groups; g++) {
        int64_t n0 = g * ROWS;
        int count = (int)(n - n0 < ROWS ? n - n0 : ROWS);
        const void *wr[ROWS], *sr[ROWS + 1];
        float sw[ROWS];
        for (int r = 0; r < ROWS; r++) {
            int64_t row = n0 + (r < count ? r : count - 1); /* past n: repeat the last row, result unused */
            if (p->fmt == EDGE_INT8 && p->a.wpacked) { /* row r of block g: its first chunk */
                wr[r] = (const int8_t *)w + g * ROWS * ((k + 63) / 64 * 64) + r * 64;
                sw[r] = ((const float *)scales)[row];
                sr[r] = NULL;
            } else if (p->fmt == EDGE_INT8) {
                wr[r] = (const int8_t *)w + row * k;
                sw[r] = ((const float *)scales)[row];
                sr[r] = NULL;
            } else {
                wr[r] = (const uint8_t *)w + row * (k / 2);
                sr[r] = (const uint16_t *)scales + row * (k / A8_BLOCK);
            }
        }
        sr[ROWS] = sw;
        for (int64_t j = 0; j < m; j += 2) { /* two rows of x a pass, the last alone */
            int nx = j + 1 < m ? 2 : 1;
            int64_t ix[2] = {rows != NULL ? rows[j] : j, 0};
            if (nx == 2) ix[1] = rows != NULL ? rows[j + 1] : j + 1;
            float out[2 * ROWS];
            rows4(p, ix, nx, wr, sr, out);
            for (int x = 0; x < nx; x++) memcpy(y + (j + x) * n + n0, out + 4 * x, sizeof(float) * (size_t)count);
        }
    }
}

/* edge_linear's int8 / int4 product with the activations in 8 bits; 0, or -1 when out of memory */
int edge_linear_a8(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads, const void *w,
                   const void *scales, int fmt) {
    EdgeA8 *p = edge_a8_pack(x, m, k, fmt, threads);
    if (p == NULL) return -1;
    edge_a8_linear(p, NULL, m, n, y, threads, w, scales);
    edge_a8_free(p);
    return 0;
}

/* the codes and block scales of x [m, k] as every path computes them, in natural order: q [m, nb * 32]
   (zero past k), d [m, nb] (the tests hold them to the reference's rounding); 0, or -1 out of memory */
int qlinear_a8_quantize(const float *x, int64_t m, int64_t k, int8_t *q, float *d) {
    int path = a8_max;
    a8_max = A8_SCALAR; /* the scalar path's pack is the natural order; every path rounds alike */
    EdgeA8 *p = edge_a8_pack(x, m, k, EDGE_INT8, 1);
    a8_max = path;
    if (p == NULL) return -1;
    memcpy(q, p->a.q, (size_t)(m * p->a.kp));
    memcpy(d, p->a.d, sizeof(float) * (size_t)(m * p->a.nb));
    edge_a8_free(p);
    return 0;
}

/* the ctypes entry points (kernels.native_ops): as qlinear_int8 / qlinear_int4 */
int qlinear_a8_int8(const float *x, int64_t m, int64_t k, const int8_t *w, const float *scales, int64_t n,
                    float *y, int threads) {
    return edge_linear_a8(x, m, k, n, y, threads, w, scales, EDGE_INT8);
}

int qlinear_a8_int4(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint16_t *scales, int64_t n,
                    float *y, int threads) {
    return edge_linear_a8(x, m, k, n, y, threads, w, scales, EDGE_INT4);
}
