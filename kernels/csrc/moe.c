/* The routed experts of one MoE layer in one call, on the CPU (kernels/moe.py's fused_moe_ref is
   the reference): the top-k expert ids come in as a tensor and the tokens per expert are counted
   here, so nothing is read back on the host and only the active experts' weights are touched.

   For each expert with tokens: its tokens gathered into one block, gate and up as one product
   (w13 [E, 2I, H]: gate rows, then up rows), SiLU(gate) * up, the down product (w2 [E, H, I]),
   each row weighted by its routing weight and added to its token's output. Weights are read as
   stored in any format edge_linear takes (f32, bf16, int8, int4; and int8 repacked at load, EDGE_INT8_R4,
   with 8-bit activations only); everything is computed in float32,
   or with `acts` EDGE_ACT_A8 for int8 / int4 experts with 8-bit activations on integer units
   (qlinear_a8.c): each routed token quantized once for all its experts' gate and up rows, each
   expert's SiLU(gate) * up once for its down rows; or EDGE_ACT_BF16X2 for bf16 experts on
   vdpbf16ps (edge_linear_bf16x2).
   `real`: only the first `real` tokens are routed (a compiled step's padding rows stay zero and are
   not counted); `load`, when given, gains each expert's token count (the engine's expert load). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "edge_kernels.h"

static int64_t weight_bytes(int fmt, int64_t rows, int64_t cols) {
    switch (fmt) {
    case EDGE_F32: return rows * cols * 4;
    case EDGE_BF16: return rows * cols * 2;
    case EDGE_INT8: return rows * cols;
    case EDGE_INT8_R4: return (rows + 3) / 4 * 4 * ((cols + 63) / 64 * 64); /* padded blocks of four rows */
    default: return rows * cols / 2;
    }
}

static int64_t scale_bytes(int fmt, int64_t rows, int64_t cols) {
    if (fmt == EDGE_INT8 || fmt == EDGE_INT8_R4) return rows * 4; /* a float32 per row */
    if (fmt == EDGE_INT4) return rows * (cols / 32) * 2; /* a bfloat16 per 32 along a row */
    return 0;
}

int edge_fused_moe(const float *x, int64_t tokens, int64_t hidden, const int64_t *ids, const float *weights,
                   int64_t top_k, int64_t experts, int64_t inter, const void *w13, const void *s13,
                   const void *w2, const void *s2, int fmt, int64_t real, int64_t *load, float *out,
                   int threads, int acts) {
    memset(out, 0, sizeof(float) * (size_t)(tokens * hidden));
    if (real < 0 || real > tokens) real = tokens;
    int64_t slots = real * top_k;
    if (slots == 0) return 0;
    int64_t *counts = (int64_t *)calloc((size_t)(experts + 1), sizeof(int64_t));
    int64_t *order = (int64_t *)malloc(sizeof(int64_t) * (size_t)slots);
    if (counts == NULL || order == NULL) { free(counts); free(order); return -1; }
    for (int64_t s = 0; s < slots; s++) {
        int64_t e = ids[s];
        if (e >= 0 && e < experts) counts[e + 1]++;
    }
    if (load != NULL)
        for (int64_t e = 0; e < experts; e++) load[e] += counts[e + 1];
    int64_t most = 0;
    for (int64_t e = 0; e < experts; e++) {
        if (counts[e + 1] > most) most = counts[e + 1];
        counts[e + 1] += counts[e]; /* counts[e]: where expert e's slots start in `order` */
    }
    int64_t *fill = (int64_t *)malloc(sizeof(int64_t) * (size_t)experts);
    float *xs = (float *)malloc(sizeof(float) * (size_t)(most * hidden));
    float *gu = (float *)malloc(sizeof(float) * (size_t)(most * 2 * inter));
    float *act = (float *)malloc(sizeof(float) * (size_t)(most * inter));
    float *ys = (float *)malloc(sizeof(float) * (size_t)(most * hidden));
    int64_t *tok = (int64_t *)malloc(sizeof(int64_t) * (size_t)(most > 0 ? most : 1));
    /* 8-bit activations: the routed tokens' rows packed once, each expert reads its own by index */
    int a8 = acts == EDGE_ACT_A8 && (fmt == EDGE_INT8 || fmt == EDGE_INT8_R4 || fmt == EDGE_INT4);
    int bf16x2 = acts == EDGE_ACT_BF16X2 && fmt == EDGE_BF16; /* bf16 experts on vdpbf16ps */
    EdgeA8 *xa = a8 ? edge_a8_pack(x, real, hidden, fmt, threads) : NULL;
    int status = -1; /* out of memory until every expert is done */
    if (fill == NULL || xs == NULL || gu == NULL || act == NULL || ys == NULL || tok == NULL) goto done;
    if (a8 && xa == NULL) goto done;
    memcpy(fill, counts, sizeof(int64_t) * (size_t)experts);
    for (int64_t s = 0; s < slots; s++) { /* stable: an expert's slots in token order */
        int64_t e = ids[s];
        if (e >= 0 && e < experts) order[fill[e]++] = s;
    }
    int64_t w13_bytes = weight_bytes(fmt, 2 * inter, hidden), s13_bytes = scale_bytes(fmt, 2 * inter, hidden);
    int64_t w2_bytes = weight_bytes(fmt, hidden, inter), s2_bytes = scale_bytes(fmt, hidden, inter);
    for (int64_t e = 0; e < experts; e++) {
        int64_t start = counts[e], c = counts[e + 1] - counts[e];
        if (c == 0) continue;
        const void *we13 = (const char *)w13 + e * w13_bytes, *we2 = (const char *)w2 + e * w2_bytes;
        const void *se13 = s13 == NULL ? NULL : (const char *)s13 + e * s13_bytes;
        const void *se2 = s2 == NULL ? NULL : (const char *)s2 + e * s2_bytes;
        if (a8) {
            for (int64_t j = 0; j < c; j++) tok[j] = order[start + j] / top_k;
            edge_a8_linear(xa, tok, c, 2 * inter, gu, threads, we13, se13);
        } else {
            for (int64_t j = 0; j < c; j++)
                memcpy(xs + j * hidden, x + (order[start + j] / top_k) * hidden, sizeof(float) * (size_t)hidden);
            if (bf16x2) edge_linear_bf16x2(xs, c, hidden, 2 * inter, gu, threads, we13);
            else edge_linear(xs, c, hidden, 2 * inter, gu, threads, we13, se13, fmt);
        }
        for (int64_t j = 0; j < c; j++) {
            const float *g = gu + j * 2 * inter, *u = g + inter;
            float *a = act + j * inter;
            for (int64_t i = 0; i < inter; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        if (a8) {
            EdgeA8 *pa = edge_a8_pack(act, c, inter, fmt, threads);
            if (pa == NULL) goto done;
            edge_a8_linear(pa, NULL, c, hidden, ys, threads, we2, se2);
            edge_a8_free(pa);
        } else if (bf16x2) {
            edge_linear_bf16x2(act, c, inter, hidden, ys, threads, we2);
        } else {
            edge_linear(act, c, inter, hidden, ys, threads, we2, se2, fmt);
        }
        for (int64_t j = 0; j < c; j++) {
            int64_t slot = order[start + j];
            float w = weights[slot];
            float *o = out + (slot / top_k) * hidden;
            const float *y = ys + j * hidden;
            for (int64_t h = 0; h < hidden; h++) o[h] += w * y[h];
        }
    }
    status = 0;
done:
    free(counts); free(order); free(fill); free(xs); free(gu); free(act); free(ys); free(tok);
    edge_a8_free(xa);
    return status;
}
