// Softmax over the last axis for XLA:CPU through the XLA FFI: sampling's distributions.
//
// Each decoding step turns a few rows of V logits into probabilities (the draft's row, the
// verify call's gamma + 1 rows). XLA:CPU (jax 0.10.2) computes max and exp in a YNNPACK fusion
// that, inside the demo's speculative loop, took 25 us for one row of V = 8192 and 70-100 us
// for four (median and 10-90th percentiles of a profile, EPYC); this kernel took 7-8 us and
// 26 us there. Each row is done in turn on the calling thread, in three passes: the maximum
// m, then e = exp(x - m) and its sum (in double lanes, a fixed order), then e times 1 / sum:
//   y[r, i] = exp(x[r, i] - m_r) / sum_j exp(x[r, j] - m_r),
// as jax.nn.softmax. exp is Cephes' single-precision polynomial (within 1 ulp of the float64
// exp at 2M points of [-87, 0]; 0 below -87, a safe cut above -87.34, where float32's normal
// range ends). A row whose maximum is not finite (all -inf, +inf, or a NaN anywhere) comes
// out NaN, as jax.nn.softmax's does. A row's result depends on that row alone.
//
// Built by spec_decode/kernels/build.py; its handler is the FFI target spec_decode_softmax.

#include <cmath>
#include <cstdint>
#include <cstring>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef double d4 __attribute__((vector_size(32)));

static inline f8 Load(const float* p) {
  f8 v;
  std::memcpy(&v, p, 32);
  return v;
}

// exp(d) for d <= 0 (the logits less their maximum), 0 below -87.
static inline f8 ExpNonPositive(f8 d) {
  f8 t = d * 1.44269504088896341f;  // d / ln 2
  t = t < -127.f ? f8{} - 127.f : t;  // within int32 (-inf, a pruned head's -1e30): cut below
  // n = t rounded to the nearest integer: t - 0.5 <= 0 truncated toward zero.
  const i8 floor = i8{} - 126;  // 2^n stays a normal float; results that small are cut below
  i8 n = __builtin_convertvector(t - 0.5f, i8);
  n = n < floor ? floor : n;
  const f8 nf = __builtin_convertvector(n, f8);
  const f8 r = d - nf * 0.693359375f - nf * -2.12194440e-4f;  // d - n ln 2, in two parts
  f8 p = f8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const f8 e = p * r * r + r + 1.f;
  f8 scale;
  const i8 bits = (n + 127) << 23;
  std::memcpy(&scale, &bits, 32);
  return d < -87.f ? f8{} : e * scale;
}

static float ScalarExpNonPositive(float d) {
  f8 v = f8{} + d;
  return ExpNonPositive(v)[0];
}

// One row: x [V] -> y [V].
static void Row(const float* x, float* y, int64_t V) {
  f8 top = f8{} - INFINITY;
  i8 nan = {};
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const f8 v = Load(x + i);
    top = v > top ? v : top;
    nan |= v != v;
  }
  float m = -INFINITY;
  for (int j = 0; j < 8; ++j) m = top[j] > m ? top[j] : m;
  bool any_nan = false;
  for (int j = 0; j < 8; ++j) any_nan |= nan[j] != 0;
  for (; i < V; ++i) {
    m = x[i] > m ? x[i] : m;
    any_nan |= x[i] != x[i];
  }
  if (any_nan || !std::isfinite(m)) {
    for (int64_t i = 0; i < V; ++i) y[i] = NAN;
    return;
  }
  d4 low = {}, high = {};
  for (i = 0; i + 8 <= V; i += 8) {
    const f8 e = ExpNonPositive(Load(x + i) - m);
    std::memcpy(y + i, &e, 32);
    low += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), d4);
    high += __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), d4);
  }
  double sum = 0.0;
  for (int j = 0; j < 4; ++j) sum += low[j];
  for (int j = 0; j < 4; ++j) sum += high[j];
  for (; i < V; ++i) sum += y[i] = ScalarExpNonPositive(x[i] - m);
  const float inverse = static_cast<float>(1.0 / sum);  // within 1 ulp of dividing by it
  for (i = 0; i + 8 <= V; i += 8) {
    const f8 q = Load(y + i) * inverse;
    std::memcpy(y + i, &q, 32);
  }
  for (; i < V; ++i) y[i] *= inverse;
}

// x [..., V] -> y [..., V], float32.
static ffi::Error SoftmaxImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y) {
  auto dims = x.dimensions();
  if (dims.size() < 1 || dims[dims.size() - 1] < 1)
    return ffi::Error::InvalidArgument("spec_decode softmax: x [..., V] with V >= 1");
  const int64_t V = dims[dims.size() - 1], rows = x.element_count() / V;
  if (y->element_count() != x.element_count())
    return ffi::Error::InvalidArgument("spec_decode softmax: y must have x's shape");
  for (int64_t r = 0; r < rows; ++r) Row(x.typed_data() + r * V, y->typed_data() + r * V, V);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeSoftmax, SoftmaxImpl,
                              ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
