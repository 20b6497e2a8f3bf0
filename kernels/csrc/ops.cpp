// The edge_cpu:: torch ops: schemas and CPU kernels over the plain C kernels (edge_kernels.h). The
// only file that includes torch's headers, so a build stays a few seconds; the ops' fake (meta)
// implementations, which let torch.compile trace through them, are registered in kernels/native_ops.py.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "edge_kernels.h"

namespace {

// the format code of a weight as stored (kernels/formats.py): dense float32 / bfloat16, int8, int4
int64_t check_format(int64_t fmt) {
  TORCH_CHECK(fmt == EDGE_F32 || fmt == EDGE_BF16 || fmt == EDGE_INT8 || fmt == EDGE_INT4 || fmt == EDGE_INT8_R4,
              "edge_cpu: weight format code ", fmt,
              " is not one of 32 (f32), 16 (bf16), 8 (int8), 4 (int4), 9 (int8 repacked)");
  return fmt;
}

// the activation format code (kernels/formats.py's ACTIVATION): 32 f32, 8 a8 beside int8 / int4, or 16
// bf16x2 beside bf16
void check_activations(int64_t act, int64_t fmt, const char* op) {
  TORCH_CHECK((act == EDGE_ACT_F32 && fmt != EDGE_INT8_R4) ||
                  (act == EDGE_ACT_A8 && (fmt == EDGE_INT8 || fmt == EDGE_INT4 || fmt == EDGE_INT8_R4)) ||
                  (act == EDGE_ACT_BF16X2 && fmt == EDGE_BF16),
              "edge_cpu::", op, ": activation format code ", act, " is not 32 (f32), 8 (a8, for int8 / int4 ",
              "weights only) or 16 (bf16x2, for bf16 weights only); int8 repacked (9) takes a8 only");
}

const void* scale_ptr(const std::optional<at::Tensor>& scale, int64_t fmt) {
  if (fmt == EDGE_F32 || fmt == EDGE_BF16) return nullptr;
  TORCH_CHECK(scale.has_value() && scale->is_contiguous(), "edge_cpu: an int8 / int4 weight needs its contiguous scales");
  return scale->data_ptr();
}

at::Tensor fused_moe(const at::Tensor& x, const at::Tensor& topk_weights, const at::Tensor& topk_ids,
                     const at::Tensor& w13, const std::optional<at::Tensor>& s13, const at::Tensor& w2,
                     const std::optional<at::Tensor>& s2, int64_t fmt, int64_t inter,
                     const std::optional<at::Tensor>& real_rows, at::Tensor& load, int64_t act) {
  check_format(fmt);
  check_activations(act, fmt, "fused_moe");
  TORCH_CHECK(x.dim() == 2 && topk_ids.dim() == 2 && topk_ids.size(0) == x.size(0) &&
                  topk_weights.sizes() == topk_ids.sizes(),
              "edge_cpu::fused_moe: x [T, H], topk ids and weights [T, K]");
  TORCH_CHECK(w13.is_contiguous() && w2.is_contiguous() && w13.size(0) == w2.size(0),
              "edge_cpu::fused_moe: contiguous stacked weights [E, ...]");
  TORCH_CHECK(load.scalar_type() == at::kLong && load.is_contiguous() && load.numel() == w13.size(0),
              "edge_cpu::fused_moe: load is int64 [E]");
  TORCH_CHECK(fmt != EDGE_INT4 || (x.size(1) % 32 == 0 && inter % 32 == 0),
              "edge_cpu::fused_moe: int4 needs hidden and intermediate sizes divisible by 32");
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor ids = topk_ids.to(at::kLong).contiguous();
  at::Tensor weights = topk_weights.to(at::kFloat).contiguous();
  int64_t tokens = xf.size(0), hidden = xf.size(1);
  int64_t real = real_rows.has_value() ? real_rows->item<int64_t>() : tokens;
  at::Tensor out = at::empty({tokens, hidden}, xf.options());
  int done = edge_fused_moe(xf.data_ptr<float>(), tokens, hidden, ids.data_ptr<int64_t>(),
                            weights.data_ptr<float>(), ids.size(1), w13.size(0), inter, w13.data_ptr(),
                            scale_ptr(s13, fmt), w2.data_ptr(), scale_ptr(s2, fmt), static_cast<int>(fmt), real,
                            load.data_ptr<int64_t>(), out.data_ptr<float>(), at::get_num_threads(),
                            static_cast<int>(act));
  TORCH_CHECK(done == 0, "edge_cpu::fused_moe: out of memory");
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// y = x W^T (+ b) for a weight W [N, K] in `fmt`, as stored; x [..., K] in float32 or bfloat16, y in x's
// dtype (computed in float32, or with `act` 8 for an int8 / int4 W: x quantized to 8 bits per block
// of 32 and multiplied in integers, qlinear_a8.c; `act` 16 for a bf16 W: x split into two bf16 halves,
// vdpbf16ps)
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& scale,
                  const std::optional<at::Tensor>& bias, int64_t fmt, int64_t out_features, int64_t act) {
  check_format(fmt);
  check_activations(act, fmt, "linear");
  int64_t k = x.size(-1), n = out_features;
  if (fmt == EDGE_INT8_R4) {  // blocks of four rows, each padded to a multiple of 64 bytes
    TORCH_CHECK(w.is_contiguous() && w.dim() == 2 && w.size(0) == (n + 3) / 4 * 4 && w.size(1) == (k + 63) / 64 * 64,
                "edge_cpu::linear: a repacked int8 weight of ", n, " rows of ", k, " is [", (n + 3) / 4 * 4, ", ",
                (k + 63) / 64 * 64, "]");
  } else {
    TORCH_CHECK(w.is_contiguous() && w.size(0) == n, "edge_cpu::linear: a contiguous weight of ", n, " rows");
  }
  TORCH_CHECK(fmt != EDGE_INT4 || k % 32 == 0, "edge_cpu::linear: int4 needs an input size divisible by 32");
  at::Tensor xf = x.reshape({-1, k}).to(at::kFloat).contiguous();
  at::Tensor y = at::empty({xf.size(0), n}, xf.options());
  if (act == EDGE_ACT_A8) {
    int done = edge_linear_a8(xf.data_ptr<float>(), xf.size(0), k, n, y.data_ptr<float>(), at::get_num_threads(),
                              w.data_ptr(), scale_ptr(scale, fmt), static_cast<int>(fmt));
    TORCH_CHECK(done == 0, "edge_cpu::linear: out of memory packing the activations");
  } else if (act == EDGE_ACT_BF16X2) {
    edge_linear_bf16x2(xf.data_ptr<float>(), xf.size(0), k, n, y.data_ptr<float>(), at::get_num_threads(),
                       w.data_ptr());
  } else {
    edge_linear(xf.data_ptr<float>(), xf.size(0), k, n, y.data_ptr<float>(), at::get_num_threads(), w.data_ptr(),
                scale_ptr(scale, fmt), static_cast<int>(fmt));
  }
  if (bias.has_value()) y.add_(*bias);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  y = y.view(shape);
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY(edge_cpu, m) {
  m.def(
      "fused_moe(Tensor x, Tensor topk_weights, Tensor topk_ids, Tensor w13, Tensor? s13, Tensor w2, "
      "Tensor? s2, int fmt, int inter, Tensor? real_rows, Tensor(a!) load, int act=32) -> Tensor");
  m.def("linear(Tensor x, Tensor w, Tensor? scale, Tensor? bias, int fmt, int out_features, int act=32) -> Tensor");
}

TORCH_LIBRARY_IMPL(edge_cpu, CPU, m) {
  m.impl("fused_moe", &fused_moe);
  m.impl("linear", &linear);
}
