/* What the plain C kernels share with each other and with the torch registration (ops.cpp). */
#ifndef EDGE_KERNELS_H
#define EDGE_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* weight formats, as stored (kernels/formats.py): the code is the bits per weight; EDGE_INT8_R4 is
   int8 repacked at load four rows to a block in 64-byte chunks (qlinear_a8.c, 8-bit activations only) */
enum { EDGE_INT4 = 4, EDGE_INT8 = 8, EDGE_INT8_R4 = 9, EDGE_BF16 = 16, EDGE_F32 = 32 };
/* activation formats of a product (kernels/formats.py's ACTIVATION): the bits per activation (bf16x2:
   two bf16 halves of each, for bf16 weights on vdpbf16ps) */
enum { EDGE_ACT_A8 = 8, EDGE_ACT_BF16X2 = 16, EDGE_ACT_F32 = 32 };

/* y [m, n] = x [m, k] W^T, float32 in and out, W [n, k] in `fmt` (int8: float32 scale per row; int4:
   two codes a byte, bfloat16 scale per 32 along k, k % 32 == 0; dense: scales unused); output rows
   split over `threads` OpenMP threads when the product is large enough to pay for the fork */
void edge_linear(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads,
                 const void *w, const void *scales, int fmt);

/* the routed experts of one MoE layer in one call (moe.c), with activations in `acts` (EDGE_ACT_A8:
   int8 / int4 experts on integer units; EDGE_ACT_BF16X2: bf16 experts on vdpbf16ps); 0 when done, -1
   out of memory */
int edge_fused_moe(const float *x, int64_t tokens, int64_t hidden, const int64_t *ids, const float *weights,
                   int64_t top_k, int64_t experts, int64_t inter, const void *w13, const void *s13,
                   const void *w2, const void *s2, int fmt, int64_t real, int64_t *load, float *out,
                   int threads, int acts);

/* y [m, n] = x [m, k] W^T for a bf16 W [n, k] with x split into two bf16 halves (hi = bf16(x), lo =
   bf16(x - hi)) and multiplied on vdpbf16ps where the CPU has AVX-512 BF16, else as edge_linear */
void edge_linear_bf16x2(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads, const void *w);

/* the instruction-set path the kernels run now: 0 scalar, 1 AVX2 + FMA, 2 AVX-512 */
int edge_isa_level(void);
/* the best one this CPU has, whatever the cap */
int edge_cpu_isa_level(void);

/* int8 / int4 products with the activations quantized to 8 bits per block of 32 (qlinear_a8.c, the
   "a8" activation format): y [m, n] = x [m, k] W^T as edge_linear's, 0 when done, -1 out of memory */
int edge_linear_a8(const float *x, int64_t m, int64_t k, int64_t n, float *y, int threads, const void *w,
                   const void *scales, int fmt);

/* the same in two steps, so the fused MoE quantizes each token once for all its experts: rows of x
   packed for one weight format (NULL out of memory), then y [m, n] for the packed rows `rows` (NULL:
   0 .. m-1) against W [n, k] */
typedef struct EdgeA8 EdgeA8;
EdgeA8 *edge_a8_pack(const float *x, int64_t m, int64_t k, int fmt, int threads);
void edge_a8_linear(const EdgeA8 *packed, const int64_t *rows, int64_t m, int64_t n, float *y, int threads,
                    const void *w, const void *scales);
void edge_a8_free(EdgeA8 *packed);

#ifdef __cplusplus
}
#endif
#endif
