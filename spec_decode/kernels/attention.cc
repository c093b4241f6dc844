// Cached attention of 1..16 query positions for XLA:CPU through the XLA FFI.
//
// XLA:CPU computes a decoding step's attention as two batched products and a
// softmax between them; for 2..16 query positions the products go to a batched GEMM
// that costs a demo-size call more than all of its weight products. Here one call
// does all of it, per (batch row, head) and query position:
//   s[t] = q . k[t] + bias[t];  w = softmax(s);  out = sum_t w[t] v[t]
// Every query position is computed with its own fixed order of operations (the dot products
// summed by one fixed tree of lane shuffles), so its result does not depend on how many
// positions share the call. Up to 4 positions share
// each load of a key or value vector: 1.3-1.5x faster than a position at a time for 2-8 positions
// (6 heads of 64, 40-128 keys, one thread, EPYC), bitwise the same results.
//
// Built by spec_decode/kernels/build.py with dense.cc; its handler SpecDecodeAttention
// is registered as the FFI target spec_decode_attention.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

// Lane-wise sums of pairs: lanes 0..7 from a, 8..15 from b, each the sum of two lanes
// of its source, so that repeated halving turns 16 vectors into their 16 lane sums.
#define PAIR(a, b, lo, hi) \
  (__builtin_shufflevector(a, b, lo) + __builtin_shufflevector(a, b, hi))
#define L1_LO 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23
#define L1_HI 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define L2_LO 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27
#define L2_HI 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31
#define L3_LO 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29
#define L3_HI 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31
#define L4_LO 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30
#define L4_HI 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31

// [16] vectors -> one vector whose lane t is the sum of p[t]'s lanes.
static inline v16 LaneSums(v16* p) {
  v16 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = PAIR(p[2 * i], p[2 * i + 1], L1_LO, L1_HI);
  for (int i = 0; i < 4; ++i) b[i] = PAIR(a[2 * i], a[2 * i + 1], L2_LO, L2_HI);
  for (int i = 0; i < 2; ++i) c[i] = PAIR(b[2 * i], b[2 * i + 1], L3_LO, L3_HI);
  return PAIR(c[0], c[1], L4_LO, L4_HI);
}

struct Shapes {
  int64_t batch, length, heads, depth, keys;  // B, L, H, Dh, T
  int64_t bias_batch, bias_heads, bias_length;  // each 1 or B, H, L
};

// Query positions whose keys' and values' loads are shared (G <= kGroup): each key and
// value vector is loaded once for the group; the group's 4 x G accumulators fill the registers.
constexpr int kGroup = 4;

// The scores of G query positions (row l of ql at ql + l * q_stride) over all T keys,
// bias added: scores[l * padded + t]. Each position's dot products are its own sums, in the
// order a position alone takes.
template <int G>
static void Scores(const Shapes& s, const float* ql, int64_t q_stride, const float* kh,
                   const float* const* bl, float* scores, int64_t padded) {
  const int64_t T = s.keys, D = s.depth, blocks = (T + 15) / 16;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    v16 partial[G][16];  // missing keys of the last block are zeros, dropped
    for (int j = 0; j < 16; ++j) {
      const int64_t t = blk * 16 + j;
      v16 acc[G] = {};
      if (t < T)
        for (int64_t d = 0; d < D; d += 16) {
          const v16 kv = Load<v16>(kh + t * D + d);
          for (int l = 0; l < G; ++l) acc[l] += Load<v16>(ql + l * q_stride + d) * kv;
        }
      for (int l = 0; l < G; ++l) partial[l][j] = acc[l];
    }
    for (int l = 0; l < G; ++l) {
      float lanes[16];
      Store(lanes, LaneSums(partial[l]));
      for (int j = 0; j < 16 && blk * 16 + j < T; ++j)
        scores[l * padded + blk * 16 + j] = lanes[j] + bl[l][blk * 16 + j];
    }
  }
}

// out[l] = sum_t w[l, t] v[t], t increasing, for G positions (weights at w + l * padded,
// row l of out at ol + l * o_stride).
template <int G>
static void Weighted(const Shapes& s, const float* w, int64_t padded, const float* vh,
                     float* ol, int64_t o_stride) {
  const int64_t T = s.keys, D = s.depth;
  for (int64_t d = 0; d < D; d += 64) {
    const int64_t chunks = (D - d) / 16 < 4 ? (D - d) / 16 : 4;
    v16 acc[G][4] = {};
    for (int64_t t = 0; t < T; ++t) {
      v16 vv[4];
      for (int c = 0; c < chunks; ++c) vv[c] = Load<v16>(vh + t * D + d + 16 * c);
      for (int l = 0; l < G; ++l) {
        const v16 wt = v16{} + w[l * padded + t];
        for (int c = 0; c < chunks; ++c) acc[l][c] += wt * vv[c];
      }
    }
    for (int l = 0; l < G; ++l)
      for (int c = 0; c < chunks; ++c) Store(ol + l * o_stride + d + 16 * c, acc[l][c]);
  }
}

// Softmax of one position's scores in place: exp(s - max), summed in a fixed order, divided
// by the sum; entries T..padded - 1 set to 0. Not common.h's SoftmaxRow (sampling's, over V
// logits): over a few hundred keys 16 float lanes suffice, where SoftmaxRow's double sums and
// NaN pass made the demo target's five-position step 1-5% slower (one-process A/B, EPYC).
static void Softmax(float* scores, int64_t T, int64_t padded) {
  for (int64_t t = T; t < padded; ++t) scores[t] = -INFINITY;
  v16 top = v16{} - INFINITY;
  for (int64_t i = 0; i < padded; i += 16) {
    v16 x = Load<v16>(scores + i);
    top = x > top ? x : top;
  }
  float m = -INFINITY;
  for (int j = 0; j < 16; ++j) m = top[j] > m ? top[j] : m;
  v16 total = v16{};
  for (int64_t i = 0; i < padded; i += 16) {
    v16 e = ExpNonPositive<v16, i16>(Load<v16>(scores + i) - m);
    Store(scores + i, e);
    total += e;
  }
  float sum = 0.f;
  for (int j = 0; j < 16; ++j) sum += total[j];
  for (int64_t i = 0; i < padded; i += 16) Store(scores + i, Load<v16>(scores + i) / sum);
}

// One (batch row, head): all L query positions over all T keys, in groups of up to kGroup
// positions that share the loads of the keys and values. scores: [L, padded] scratch.
static void Head(const Shapes& s, int64_t b, int64_t h, const float* q, const float* k,
                 const float* v, const float* bias, float* out, float* scores) {
  const int64_t T = s.keys, D = s.depth, padded = (T + 15) / 16 * 16;
  const float* kh = k + (b * s.heads + h) * T * D;
  const float* vh = v + (b * s.heads + h) * T * D;
  const int64_t stride = s.heads * D;  // from one position's row of q or out to the next
  for (int64_t l0 = 0; l0 < s.length; l0 += kGroup) {
    const int g = s.length - l0 < kGroup ? static_cast<int>(s.length - l0) : kGroup;
    const float* ql = q + ((b * s.length + l0) * s.heads + h) * D;
    float* ol = out + ((b * s.length + l0) * s.heads + h) * D;
    float* sl = scores + l0 * padded;
    const float* bl[kGroup];
    for (int l = 0; l < g; ++l)
      bl[l] = bias + (((s.bias_batch > 1 ? b : 0) * s.bias_heads + (s.bias_heads > 1 ? h : 0)) *
                          s.bias_length + (s.bias_length > 1 ? l0 + l : 0)) * T;
    switch (g) {
      case 1: Scores<1>(s, ql, stride, kh, bl, sl, padded); break;
      case 2: Scores<2>(s, ql, stride, kh, bl, sl, padded); break;
      case 3: Scores<3>(s, ql, stride, kh, bl, sl, padded); break;
      default: Scores<4>(s, ql, stride, kh, bl, sl, padded);
    }
    for (int l = 0; l < g; ++l) Softmax(sl + l * padded, T, padded);
    switch (g) {
      case 1: Weighted<1>(s, sl, padded, vh, ol, stride); break;
      case 2: Weighted<2>(s, sl, padded, vh, ol, stride); break;
      case 3: Weighted<3>(s, sl, padded, vh, ol, stride); break;
      default: Weighted<4>(s, sl, padded, vh, ol, stride);
    }
  }
}

// q [B, L, H, Dh], k and v [B, H, T, Dh], bias [Bb, Hb, Lb, T] with each of Bb, Hb, Lb
// 1 or B, H, L -> out [B, L, H, Dh]; float32, Dh a multiple of 16. Calls of more than
// kParallelWork multiply-adds split the (row, head) pairs with one thread of XLA's pool.
static ffi::Error AttentionImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q,
                                ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> v,
                                ffi::Buffer<ffi::F32> bias, ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions(), bd = bias.dimensions();
  auto vd = v.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || bd.size() != 4 || vd.size() != 4 ||
      vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2] || vd[3] != kd[3])
    return ffi::Error::InvalidArgument("spec_decode_attention: q, k, v and bias of rank 4");
  Shapes s{qd[0], qd[1], qd[2], qd[3], kd[2], bd[0], bd[1], bd[2]};
  if (kd[0] != s.batch || kd[1] != s.heads || kd[3] != s.depth || s.depth % 16 ||
      s.length < 1 || s.length > 16 || s.keys < 1 || bd[3] != s.keys ||
      (s.bias_batch != 1 && s.bias_batch != s.batch) ||
      (s.bias_heads != 1 && s.bias_heads != s.heads) ||
      (s.bias_length != 1 && s.bias_length != s.length))
    return ffi::Error::InvalidArgument(
        "spec_decode_attention: q [B, L <= 16, H, Dh % 16 == 0], k, v [B, H, T, Dh], "
        "bias [1 or B, 1 or H, 1 or L, T]");
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const float* bp = bias.typed_data();
  float* op = out->typed_data();
  const int64_t pairs = s.batch * s.heads, padded = (s.keys + 15) / 16 * 16;
  auto run = [=](int64_t first, int64_t last) {
    thread_local std::vector<float> scores;
    if (static_cast<int64_t>(scores.size()) < s.length * padded) scores.resize(s.length * padded);
    for (int64_t i = first; i < last; ++i)
      Head(s, i / s.heads, i % s.heads, qp, kp, vp, bp, op, scores.data());
  };
  constexpr int64_t kParallelWork = 1 << 16;
  if (pairs < 2 || pairs * s.length * s.keys * s.depth < kParallelWork || pool.num_threads() < 1) {
    run(0, pairs);
    return ffi::Error::Success();
  }
  // Two halves of the (row, head) pairs.
  const int64_t chunk = (pairs + 1) / 2;
  ShareChunks(pool, 2, [=](int64_t c) {
    const int64_t first = c * chunk;
    run(first, first + chunk < pairs ? first + chunk : pairs);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeAttention, AttentionImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
