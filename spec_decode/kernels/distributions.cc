// Sampling's row kernels for XLA:CPU through the XLA FFI (spec_decode.kernels.distributions):
// the truncation thresholds of top-k and top-p, softmax, and argmax. The rows of x [..., V] are
// done in turn on the calling thread, and a row's result depends on that row alone.
//
// Built by spec_decode/kernels/build.py; its handlers are the FFI targets
// spec_decode_top_k_threshold, spec_decode_top_p_threshold, spec_decode_softmax and
// spec_decode_argmax.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Truncation thresholds.
//
// Top-k keeps the entries >= the k-th largest logit, top-p the entries >= the
// smallest probability whose larger entries hold less than top_p (ties kept). Both
// are, for each row x[r] of x [R, V] and its bound b[r] > 0,
//   t = min { v in x[r] : W(v) < b[r] },  W(v) = sum of w(u) over the entries u > v,
// with w(u) = 1 (top-k: b = k) or w(u) = u (top-p: b = top_p, x probabilities).
// Without the kernels spec_decode.sampling finds t with a TopK where it lies among a
// row's few largest entries, elsewhere by bisecting the float bits with 32 masked sums of
// the whole row, each a handful of XLA operations. Here the same bisection runs over
// the entries' order-preserving 32-bit keys with vectorized masked sums (masses in
// double precision), and every few halvings drops the entries that can no longer
// decide, so that later halvings read a few entries instead of the row. A row's
// sums run in a fixed order. A row whose bound is not > 0 is not cut: its threshold is
// -inf (every entry kept), for callers that cut some rows of a call.

// float -> int32 in the same order (-0.0 and 0.0 alike; NaNs past the infinity of their sign),
// without branches (the signs of a row's logits would mislead a branch predictor); signed,
// because AVX2 compares signed integers only. spec_decode.sampling's `_order_keys`.
static inline int32_t Key(float x) {
  x += 0.f;  // -0.0 + 0.0 = 0.0
  int32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits ^ ((bits >> 31) & 0x7fffffff);
}

static inline float Value(int32_t key) {
  const int32_t bits = key ^ ((key >> 31) & 0x7fffffff);
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

// Halvings before the first compaction of the entries still in the interval (most of a
// row lies in it before), and between two.
constexpr int kCompactFirst = 6, kCompactEvery = 3;

// W of the first `count` entries whose key exceeds t: counts in 16 integer lanes, masses
// in 8 double lanes of partial sums in a fixed order, then the lanes in order.
template <bool kMass>
static double WeightAbove(const int32_t* keys, const float* weights, int64_t count, int32_t t) {
  int64_t i = 0;
  double sum = 0.0;
  if (kMass) {
    d4 low = {}, high = {};
    for (; i + 8 <= count; i += 8) {
      const f8 w = Load<i8>(keys + i) > t ? Load<f8>(weights + i) : f8{};
      low += __builtin_convertvector(__builtin_shufflevector(w, w, 0, 1, 2, 3), d4);
      high += __builtin_convertvector(__builtin_shufflevector(w, w, 4, 5, 6, 7), d4);
    }
    for (int j = 0; j < 4; ++j) sum += low[j];
    for (int j = 0; j < 4; ++j) sum += high[j];
  } else {
    i8 first = {}, second = {};  // minus the counts (a true comparison is -1)
    for (; i + 16 <= count; i += 16) {
      first += Load<i8>(keys + i) > t;
      second += Load<i8>(keys + i + 8) > t;
    }
    for (int j = 0; j < 8; ++j) sum -= first[j];
    for (int j = 0; j < 8; ++j) sum -= second[j];
  }
  for (; i < count; ++i)
    if (keys[i] > t) sum += kMass ? weights[i] : 1.0;
  return sum;
}

// The mass of the first `count` entries whose key exceeds t, summed in float32 (16 lanes):
// twice as fast as WeightAbove's, off by at most count / 16 float32 roundings of the
// entries' total mass each (each lane adds count / 16 terms in turn).
static double MassAboveFast(const int32_t* keys, const float* weights, int64_t count,
                            int32_t t) {
  f8 first = {}, second = {};
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    first += Load<i8>(keys + i) > t ? Load<f8>(weights + i) : f8{};
    second += Load<i8>(keys + i + 8) > t ? Load<f8>(weights + i + 8) : f8{};
  }
  double sum = 0.0;
  for (int j = 0; j < 8; ++j) sum += first[j];
  for (int j = 0; j < 8; ++j) sum += second[j];
  for (; i < count; ++i)
    if (keys[i] > t) sum += weights[i];
  return sum;
}

// Keeps the first `count` entries with lo < key <= hi (in order) and returns how many;
// W of the entries above hi goes into `above`. Which entries stay is random, so nothing
// branches on one: AVX-512 packs a block's kept entries with one compress per array,
// otherwise every entry is written and the end advances by whether it stays. Blocks
// none of whose entries stay, most of them once the interval is narrow, cost one test.
template <bool kMass>
static int64_t Compact(int32_t* keys, float* weights, int64_t count, int64_t lo, int32_t hi,
                       double* above) {
  *above += WeightAbove<kMass>(keys, weights, count, hi);
  const int32_t first = static_cast<int32_t>(lo + 1);  // lo >= INT32_MIN - 1
  int64_t kept = 0, i = 0;
#if defined(__AVX512F__)
  const __m512i low = _mm512_set1_epi32(first), high = _mm512_set1_epi32(hi);
  for (; i + 16 <= count; i += 16) {  // writes reach at most entry i + 15: already read
    const __m512i k = _mm512_loadu_si512(keys + i);
    const __mmask16 inside = _mm512_cmpge_epi32_mask(k, low) & _mm512_cmple_epi32_mask(k, high);
    if (!inside) continue;
    _mm512_storeu_si512(keys + kept, _mm512_maskz_compress_epi32(inside, k));
    if (kMass)  // top-k's weights are all 1 and never read
      _mm512_storeu_ps(weights + kept,
                       _mm512_maskz_compress_ps(inside, _mm512_loadu_ps(weights + i)));
    kept += __builtin_popcount(inside);
  }
#else
  for (; i + 8 <= count; i += 8) {
    const i8 k = Load<i8>(keys + i);
    const i8 inside = (k >= first) & (k <= hi);
    uint64_t lanes[4];
    std::memcpy(lanes, &inside, 32);
    if (!(lanes[0] | lanes[1] | lanes[2] | lanes[3])) continue;
    for (int j = 0; j < 8; ++j) {
      keys[kept] = keys[i + j];
      if (kMass) weights[kept] = weights[i + j];
      kept += inside[j] & 1;
    }
  }
#endif
  for (; i < count; ++i) {
    keys[kept] = keys[i];
    if (kMass) weights[kept] = weights[i];
    kept += keys[i] >= first && keys[i] <= hi;
  }
  return kept;
}

// The threshold of one row of V entries (see the file comment), by bisection over the
// keys: W(above the keys) only changes at an entry's key, so the smallest key t with
// W(t) < bound is an entry's. Every few halvings the entries that can no longer decide
// are dropped: those at or below the lower end, and those above the upper end, whose W
// is then carried as a sum of its own.
template <bool kMass>
static float RowThreshold(const float* x, int64_t V, double bound, std::vector<int32_t>& keys,
                          std::vector<float>& weights) {
  if (!(bound > 0.0)) return -INFINITY;  // a row the caller does not cut
  keys.resize(V);
  if (kMass) weights.resize(V);  // top-k counts entries: its weights are never read
  int32_t lowest = INT32_MAX, highest = INT32_MIN;
  for (int64_t i = 0; i < V; ++i) {
    keys[i] = Key(x[i]);
    if (kMass) weights[i] = x[i];
    lowest = keys[i] < lowest ? keys[i] : lowest;
    highest = keys[i] > highest ? keys[i] : highest;
  }
  // MassAboveFast over n entries errs by less than n / 16 roundings (2^-24 relative) of
  // the entries' total mass: where a halving's fast sum lies farther than twice that
  // from the bound, it decides as the double sum would.
  const double error =
      kMass ? 0x1p-27 * 1.01 * MassAboveFast(keys.data(), weights.data(), V, INT32_MIN)
            : 0.0;  // per entry summed
  // W(hi) < bound (nothing is above the highest key); W(lo) is all of W, which reaches the
  // bound or not: if not, every halving lowers hi, down to the lowest key (all kept).
  int64_t lo = static_cast<int64_t>(lowest) - 1, hi = highest, count = V;
  double above = 0.0;
  for (int step = 1; hi - lo > 1; ++step) {
    const int64_t mid = lo + (hi - lo) / 2;
    const int32_t t = static_cast<int32_t>(mid);
    double w = kMass ? above + MassAboveFast(keys.data(), weights.data(), count, t) : 0.0;
    if (!kMass || std::fabs(w - bound) <= error * static_cast<double>(count))
      w = above + WeightAbove<kMass>(keys.data(), weights.data(), count, t);
    (w < bound ? hi : lo) = mid;
    if (step >= kCompactFirst && (step - kCompactFirst) % kCompactEvery == 0)
      count = Compact<kMass>(keys.data(), weights.data(), count, lo, static_cast<int32_t>(hi),
                             &above);
  }
  return Value(static_cast<int32_t>(hi));
}

// x [..., V], bound [...] (one per row) -> t [...], float32.
template <bool kMass>
static ffi::Error ThresholdImpl(ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> bound,
                                ffi::ResultBuffer<ffi::F32> out) {
  auto xd = x.dimensions();
  if (xd.size() < 1 || xd[xd.size() - 1] < 1)
    return ffi::Error::InvalidArgument("spec_decode threshold: x [..., V] with V >= 1");
  const int64_t V = xd[xd.size() - 1], rows = x.element_count() / V;
  if (bound.element_count() != rows || out->element_count() != rows)
    return ffi::Error::InvalidArgument("spec_decode threshold: one bound and one result per row");
  const float *xp = x.typed_data(), *bp = bound.typed_data();
  float* op = out->typed_data();
  thread_local std::vector<int32_t> keys;
  thread_local std::vector<float> weights;
  for (int64_t r = 0; r < rows; ++r)
    op[r] = RowThreshold<kMass>(xp + r * V, V, static_cast<double>(bp[r]), keys, weights);
  return ffi::Error::Success();
}

#define SPEC_DECODE_THRESHOLD_BINDING      \
  ffi::Ffi::Bind()                         \
      .Arg<ffi::Buffer<ffi::F32>>()        \
      .Arg<ffi::Buffer<ffi::F32>>()        \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeTopKThreshold, ThresholdImpl<false>,
                              SPEC_DECODE_THRESHOLD_BINDING);
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeTopPThreshold, ThresholdImpl<true>,
                              SPEC_DECODE_THRESHOLD_BINDING);

// Softmax over the last axis.
//
// Each decoding step turns a few rows of V logits into probabilities (the draft's row, the
// verify call's gamma + 1 rows). XLA:CPU (jax 0.10.2) computes max and exp in a YNNPACK fusion
// that, inside the demo's speculative loop, took 25 us for one row of V = 8192 and 70-100 us
// for four (median and 10-90th percentiles of a profile, EPYC); this kernel took 7-8 us and
// 26 us there. (In a loop of softmaxes alone XLA's was the faster, by 1.2x at one row and
// 3x at 16 or more: sampling takes this kernel for a decoding step's few rows only.) Each row
// is SoftmaxRow's, y[r, i] = exp(x[r, i] - m_r) / sum_j exp(x[r, j] - m_r) as jax.nn.softmax,
// exp common.h's ExpNonPositive.

static float ScalarExpNonPositive(float d) {
  f8 v = f8{} + d;
  return ExpNonPositive<f8, i8>(v)[0];
}

// One row's softmax: x [V] -> y [V]. Three passes: the maximum m, then
// e = exp(x - m) and its sum (in double lanes, a fixed order), then e times 1 / sum; a row whose
// maximum is not finite (all -inf, +inf, or a NaN anywhere) comes out NaN, as jax.nn.softmax's.
static void SoftmaxRow(const float* x, float* y, int64_t V) {
  f8 top = f8{} - INFINITY;
  i8 nan = {};
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const f8 v = Load<f8>(x + i);
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
    const f8 e = ExpNonPositive<f8, i8>(Load<f8>(x + i) - m);
    Store(y + i, e);
    low += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), d4);
    high += __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), d4);
  }
  double sum = 0.0;
  for (int j = 0; j < 4; ++j) sum += low[j];
  for (int j = 0; j < 4; ++j) sum += high[j];
  for (; i < V; ++i) sum += y[i] = ScalarExpNonPositive(x[i] - m);
  const float inverse = static_cast<float>(1.0 / sum);  // within 1 ulp of dividing by it
  for (i = 0; i + 8 <= V; i += 8) {
    const f8 q = Load<f8>(y + i) * inverse;
    Store(y + i, q);
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
  for (int64_t r = 0; r < rows; ++r)
    SoftmaxRow(x.typed_data() + r * V, y->typed_data() + r * V, V);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    SpecDecodeSoftmax, SoftmaxImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());

// Argmax over the last axis.
//
// Greedy decoding takes the argmax of every row of logits (the draft's row, the verify call's
// gamma + 1). XLA:CPU computes spec_decode.sampling's argmax as a maximum, a select and a
// minimum over the row; in the demo target's step loop these three took 15 us for one row of
// V = 8192 and 51 us for five (EPYC, a profile), about 2% and 6% of the step. Here one pass
// keeps each lane's largest value and its first index; the lanes then give the largest value
// and, among the lanes that hold it, the smallest index: the first index of the maximum, as
// jnp.argmax for finite and infinite entries. A row with a NaN gives the index of its first
// NaN, as jnp.argmax (a second pass, on such rows only).

// One row: the index of its largest entry (the first on ties).
static int32_t ArgmaxRow(const float* x, int64_t V) {
  int64_t i = 0;
  float best = -INFINITY;
  int64_t index = 0;
  bool any_nan = false;
  if (V >= 16) {
    // Two sets of 8 lanes, blocks of 16 entries: lane j of `low` sees entries 16 b + j,
    // lane j of `high` entries 16 b + 8 + j.
    f8 low = Load<f8>(x), high = Load<f8>(x + 8);
    i8 low_at = {0, 1, 2, 3, 4, 5, 6, 7}, high_at = low_at + 8;
    const i8 step = i8{} + 16;
    i8 at_low = low_at, at_high = high_at;
    i8 nan = (low != low) | (high != high);
    for (i = 16; i + 16 <= V; i += 16) {
      at_low += step;
      at_high += step;
      const f8 a = Load<f8>(x + i), b = Load<f8>(x + i + 8);
      const i8 up_a = a > low, up_b = b > high;  // strictly larger: a lane keeps its first
      low = up_a ? a : low;
      low_at = up_a ? at_low : low_at;
      high = up_b ? b : high;
      high_at = up_b ? at_high : high_at;
      nan |= (a != a) | (b != b);
    }
    best = low[0];
    index = low_at[0];
    for (int j = 0; j < 8; ++j) {
      const float values[2] = {low[j], high[j]};
      const int32_t at[2] = {low_at[j], high_at[j]};
      for (int h = 0; h < 2; ++h)
        if (values[h] > best || (values[h] == best && at[h] < index)) {
          best = values[h];
          index = at[h];
        }
      any_nan |= nan[j] != 0;
    }
  } else {
    best = x[0];
    any_nan = x[0] != x[0];
    i = 1;
  }
  for (; i < V; ++i) {  // entries past every lane's: a strictly larger one wins
    if (x[i] > best) {
      best = x[i];
      index = i;
    }
    any_nan |= x[i] != x[i];
  }
  if (any_nan)
    for (index = 0; x[index] == x[index];) ++index;
  return static_cast<int32_t>(index);
}

// x [..., V] float32 -> [...] int32.
static ffi::Error ArgmaxImpl(ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::S32> out) {
  auto dims = x.dimensions();
  if (dims.size() < 1 || dims[dims.size() - 1] < 1 || dims[dims.size() - 1] > INT32_MAX)
    return ffi::Error::InvalidArgument("spec_decode argmax: x [..., V] with 1 <= V < 2^31");
  const int64_t V = dims[dims.size() - 1], rows = x.element_count() / V;
  if (out->element_count() != rows)
    return ffi::Error::InvalidArgument("spec_decode argmax: one result per row");
  for (int64_t r = 0; r < rows; ++r)
    out->typed_data()[r] = ArgmaxRow(x.typed_data() + r * V, V);
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    SpecDecodeArgmax, ArgmaxImpl,
    ffi::Ffi::Bind().Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::S32>>());
