// K-row dense products for XLA:CPU through the XLA FFI: y = x @ w for 1..16 rows (1..256
// from packed panels).
//
// XLA:CPU multiplies one row by a weight matrix as a GEMV that streams the weights
// once, but 2-16 rows as a GEMM that packs the weights on every call, so a verify
// call over K positions costs up to 2-3 single steps on some CPUs. Here every row
// is multiplied in the pass that streams the weights once: for each tile of output
// columns, each weight row i is loaded once and multiplied into the accumulators of
// all M rows. Each output element is the sum over i in increasing order of fused
// multiply-adds, whatever M is, whichever layout the weights come in and whichever
// thread computes its tile: a row's result does not depend on the rows beside it.
//
// Two layouts of the weights:
// - SpecDecodeDense: w [in, out] as stored. A tile reads 128 bytes of each of the
//   `in` rows, `out` floats apart, which streams at about half the bandwidth of a
//   contiguous read on the machines measured.
// - SpecDecodeDensePanels: w packed once into panels [ceil(out / 64), in, 64] (zero
//   columns past `out`), each panel contiguous: a 64-column tile reads one stream.
//   Each group of up to 6 rows takes a block of a panel in one pass (the accumulators
//   must fit the registers); the block is then in L2 for the other groups' passes.
//   SpecDecodeDensePanelsBf16 reads bfloat16 panels, widened exactly to float32: for
//   weights that bfloat16 holds (a bfloat16 checkpoint's) the same products from half
//   the bytes. Their rows interleave each 32 columns, so that a shift or a mask widens
//   16 weights (LoadRow).
//
// SpecDecodeEmbed and SpecDecodeEmbedBf16 look up rows of an embedding table, as float32: XLA:CPU
// split a gather of a decoding step's few rows across its threads, and widened a bfloat16 table
// whole to float32 on every call (T5 1.1 small's 16.4M entries: ~12 ms).
//
// Built by spec_decode/kernels/build.py with the system compiler for the machine
// it runs on (-march=native); its handlers are registered as the FFI targets
// spec_decode_dense, spec_decode_dense_panels{,_bf16} and spec_decode_embed{,_bf16}.

#include <cstdint>
#include <limits>
#include "common.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
// Weight rows fetched ahead of the one being multiplied by a product from w [in, out] as stored
// (each row its own stream).
constexpr int64_t kPrefetchRows = 16;
// Bytes fetched ahead in a panel's single stream: 16 rows (4 KB of float32 panels) left the
// step's products waiting on memory; 16 KB ahead made the demo target's float32 step 5% faster
// at one position and 8% at five, with bfloat16 panels 7-12% (one-process A/B, EPYC); of
// 1.5-32 KB, 12-16 KB did best.
constexpr int64_t kPanelPrefetchBytes = 16384;

// The NV vectors of one weight row (NV * 16 weights at p) as float32: float32 as stored,
// bfloat16 widened exactly (its bits are the high half of the float32's). A bfloat16
// panel row holds each 32 columns interleaved (32-bit lane i: column i in its low half, column 16 + i in
// its high half; kernels.pack), so one load and one operation widen 16 weights.
// The + 0.f (an addition GCC must keep: -0.f + 0.f is +0.f) holds each weight vector in a
// register: without it GCC 12 folded the loads into the multiply-adds for 2..4 rows (M loads
// of each weight vector), and 3 and 4 rows took 1.5-2.2x as long as with it, single-threaded
// at a T5 step's shapes (EPYC; an asm barrier or asm loads instead slowed every row count).
// It changes a weight only from -0 to +0, in every row count alike.
template <int NV>
static inline void LoadRow(const float* p, v16* wv) {
  for (int v = 0; v < NV; ++v) wv[v] = Load<v16>(p + 16 * v) + 0.f;
}
template <int NV>
static inline void LoadRow(const uint16_t* p, v16* wv) {
  static_assert(NV % 2 == 0, "bfloat16 panel rows hold pairs of 16-column vectors");
  for (int v = 0; v < NV; v += 2) {
    u16 bits, low, high;
    __builtin_memcpy(&bits, p + 16 * v, 64);
    low = bits << 16;
    high = bits & 0xffff0000u;
    __builtin_memcpy(&wv[v], &low, 64);
    __builtin_memcpy(&wv[v + 1], &high, 64);
  }
}

// y[m, 0:cols] (row m at y + m * y_stride) of all M rows (row m at x + m * x_stride)
// from w's 16 NV columns at w (row i at w + i * w_stride), over i = 0..count - 1 in
// increasing order; `resume` starts the sums from y's values instead of 0 (a pass
// over later rows of w: the same sequence of multiply-adds as one pass).
template <int M, int NV, typename W = float, int64_t P = kPrefetchRows>
static inline void Tile(const float* __restrict x, int64_t x_stride, int64_t count,
                        const W* __restrict w, int64_t w_stride, float* __restrict y,
                        int64_t y_stride, int64_t cols, bool resume) {
  v16 acc[M][NV];
  for (int m = 0; m < M; ++m) {
    float row[16 * NV] = {};
    if (resume)
      for (int64_t n = 0; n < cols; ++n) row[n] = y[m * y_stride + n];
    __builtin_memcpy(acc[m], row, 64 * NV);
  }
  const W* wr = w;
  for (int64_t i = 0; i < count; ++i, wr += w_stride) {
    for (int v = 0; v < NV; ++v) __builtin_prefetch(wr + P * w_stride + 16 * v);
    v16 wv[NV];
    LoadRow<NV>(wr, wv);
    for (int m = 0; m < M; ++m) {
      float s = x[m * x_stride + i];  // s * vector: a broadcast folded into the multiply-add
      for (int v = 0; v < NV; ++v) acc[m][v] += s * wv[v];
    }
  }
  for (int m = 0; m < M; ++m) {
    if (cols == 16 * NV) {
      __builtin_memcpy(y + m * y_stride, acc[m], 64 * NV);
    } else {
      float row[16 * NV];
      __builtin_memcpy(row, acc[m], 64 * NV);
      for (int64_t n = 0; n < cols; ++n) y[m * y_stride + n] = row[n];
    }
  }
}

// Columns n_begin..n_end of all M rows: 32-column tiles, then 16, then one at a time.
template <int M>
static void Columns(const float* x, const float* w, float* y, int64_t in, int64_t out,
                    int64_t n_begin, int64_t n_end) {
  constexpr int NV = M <= 8 ? 2 : 1;
  int64_t n = n_begin;
  for (; n + 16 * NV <= n_end; n += 16 * NV)
    Tile<M, NV>(x, in, in, w + n, out, y + n, out, 16 * NV, false);
  for (; n + 16 <= n_end; n += 16) Tile<M, 1>(x, in, in, w + n, out, y + n, out, 16, false);
  for (; n < n_end; ++n)
    for (int m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t i = 0; i < in; ++i) acc = __builtin_fmaf(x[m * in + i], w[i * out + n], acc);
      y[m * out + n] = acc;
    }
}

constexpr int64_t kPanel = 64;
// Weight rows per pass over a panel: 128 KB, held in L2 for the passes of the other rows.
constexpr int64_t kPanelBlock = 512;

// Rows of x a product from panels takes (kernels.PANEL_MAX_ROWS): a step's few, or an
// encoder's tokens; beyond, XLA's product.
constexpr int64_t kMaxPanelRows = 256;

// Rows of x per pass over a panel block: 6 x 4 accumulators and the 4 weight vectors
// fill 28 of the 32 vector registers of AVX-512.
constexpr int kGroup = 6;

// One pass over a block of a panel for g = 1..kGroup rows of x.
template <typename W>
static void PanelPass(int g, const float* x, int64_t in, int64_t count, const W* w, float* y,
                      int64_t out, int64_t cols, bool resume) {
  constexpr int64_t P = kPanelPrefetchBytes / (kPanel * sizeof(W));  // panel rows ahead
  switch (g) {
    case 1: return Tile<1, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
    case 2: return Tile<2, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
    case 3: return Tile<3, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
    case 4: return Tile<4, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
    case 5: return Tile<5, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
    default: return Tile<6, 4, W, P>(x, in, count, w, kPanel, y, out, cols, resume);
  }
}

// Columns n_begin..n_end (multiples of kPanel, or n_end = out) of all `rows` rows from the
// panels [ceil(out / 64), in, 64]: per panel and block of kPanelBlock weight rows, one
// pass for each group of kGroup rows of x.
template <typename W>
static void Panels(int rows, const float* x, const W* w, float* y, int64_t in, int64_t out,
                   int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; n += kPanel) {
    const W* panel = w + n / kPanel * in * kPanel;
    const int64_t cols = n_end - n < kPanel ? n_end - n : kPanel;
    for (int64_t i0 = 0; i0 < in; i0 += kPanelBlock) {
      const int64_t count = in - i0 < kPanelBlock ? in - i0 : kPanelBlock;
      for (int g = 0; g < rows; g += kGroup)
        PanelPass(rows - g < kGroup ? rows - g : kGroup, x + g * in + i0, in, count,
                  panel + i0 * kPanel, y + g * out + n, out, cols, i0 > 0);
    }
  }
}

typedef void (*ColumnsFn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static const ColumnsFn kColumns[16] = {
    Columns<1>, Columns<2>, Columns<3>, Columns<4>, Columns<5>, Columns<6>, Columns<7>, Columns<8>,
    Columns<9>, Columns<10>, Columns<11>, Columns<12>, Columns<13>, Columns<14>, Columns<15>,
    Columns<16>};

// columns(n_begin, n_end) over 0..out, split between the caller and one thread of XLA's
// intra-op pool (ShareChunks) by chunks of whole `granule`-column tiles when the product has at
// least kParallelElements weights.
template <typename F>
static void Run(ffi::ThreadPool& pool, F columns, int64_t in, int64_t out, int64_t granule) {
  constexpr int64_t kParallelElements = 1 << 14;
  const int64_t tiles = (out + granule - 1) / granule;
  // Work items of equal whole tiles, an even number of them, each of at most 4 tiles
  // (256 columns of panels): as many for either thread when both run throughout.
  const int64_t items = 2 * ((tiles + 7) / 8);
  const int64_t chunk = (tiles + items - 1) / items * granule;
  const int64_t chunks = (out + chunk - 1) / chunk;
  if (chunks < 2 || in * out < kParallelElements || pool.num_threads() < 1) {
    columns(0, out);
    return;
  }
  ShareChunks(pool, chunks, [=](int64_t c) {
    const int64_t n0 = c * chunk, n1 = n0 + chunk < out ? n0 + chunk : out;
    columns(n0, n1);
  });
}

// x [..., in] with 1..16 rows in all, w [in, out] -> y [..., out], float32.
static ffi::Error DenseImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                            ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  if (wd.size() != 2 || wd[0] < 1 || x.element_count() % wd[0])
    return ffi::Error::InvalidArgument("spec_decode_dense: x [..., in], w [in, out]");
  int64_t in = wd[0], out = wd[1];
  int64_t rows = x.element_count() / in;
  if (rows < 1 || rows > 16 || y->element_count() != rows * out)
    return ffi::Error::InvalidArgument("spec_decode_dense: 1..16 rows of x, y [..., out]");
  ColumnsFn fn = kColumns[rows - 1];
  const float *xp = x.typed_data(), *wp = w.typed_data();
  float* yp = y->typed_data();
  Run(pool, [=](int64_t n0, int64_t n1) { fn(xp, wp, yp, in, out, n0, n1); }, in, out, 32);
  return ffi::Error::Success();
}

// x [..., in] with 1..256 rows in all, panels [ceil(out / 64), in, 64] of float32 (W = float)
// or bfloat16 (W = uint16_t) -> y [..., out].
template <ffi::DataType T, typename W>
static ffi::Error DensePanelsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                  ffi::Buffer<T> w, ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  auto yd = y->dimensions();
  if (wd.size() != 3 || wd[1] < 1 || wd[2] != kPanel || yd.size() < 1 ||
      x.element_count() % wd[1])
    return ffi::Error::InvalidArgument(
        "spec_decode_dense_panels: x [..., in], panels [ceil(out / 64), in, 64], y [..., out]");
  int64_t in = wd[1], out = yd[yd.size() - 1];
  int64_t rows = x.element_count() / in;
  if (rows < 1 || rows > kMaxPanelRows || y->element_count() != rows * out ||
      wd[0] != (out + kPanel - 1) / kPanel)
    return ffi::Error::InvalidArgument(
        "spec_decode_dense_panels: 1..256 rows of x and ceil(out / 64) panels");
  const float* xp = x.typed_data();
  const W* wp = reinterpret_cast<const W*>(w.typed_data());
  float* yp = y->typed_data();
  const int m = static_cast<int>(rows);  // groups of kGroup rows per pass
  Run(pool, [=](int64_t n0, int64_t n1) { Panels(m, xp, wp, yp, in, out, n0, n1); }, in, out,
      kPanel);
  return ffi::Error::Success();
}

// A table entry as float32: float32 as stored, bfloat16 widened exactly.
static inline float Widen(float w) { return w; }
static inline float Widen(uint16_t w) {
  const uint32_t bits = static_cast<uint32_t>(w) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// out [N, E] float32 = rows ids [N] of table [V, E] (float32, W = float; bfloat16, W = uint16_t);
// a row of NaNs for an id outside 0..V-1 (jnp.take's fill).
template <ffi::DataType T, typename W>
static ffi::Error EmbedImpl(ffi::Buffer<T> table, ffi::Buffer<ffi::S32> ids,
                            ffi::ResultBuffer<ffi::F32> out) {
  auto td = table.dimensions();
  if (td.size() != 2 || out->element_count() != ids.element_count() * td[1])
    return ffi::Error::InvalidArgument("spec_decode_embed: table [V, E], ids [N], out [N, E]");
  const int64_t vocab = td[0], width = td[1], count = ids.element_count();
  const W* t = reinterpret_cast<const W*>(table.typed_data());
  const int32_t* id = ids.typed_data();
  float* o = out->typed_data();
  for (int64_t n = 0; n < count; ++n) {
    float* row = o + n * width;
    const bool inside = id[n] >= 0 && id[n] < vocab;
    const W* src = t + (inside ? id[n] : 0) * width;
    for (int64_t e = 0; e < width; ++e)
      row[e] = inside ? Widen(src[e]) : std::numeric_limits<float>::quiet_NaN();
  }
  return ffi::Error::Success();
}

#define SPEC_DECODE_DENSE_BINDING(T)              \
  ffi::Ffi::Bind()                                \
      .Ctx<ffi::ThreadPool>()                     \
      .Arg<ffi::Buffer<ffi::F32>>()               \
      .Arg<ffi::Buffer<T>>()                      \
      .Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeDense, DenseImpl, SPEC_DECODE_DENSE_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeDensePanels, (DensePanelsImpl<ffi::F32, float>),
                              SPEC_DECODE_DENSE_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeDensePanelsBf16, (DensePanelsImpl<ffi::BF16, uint16_t>),
                              SPEC_DECODE_DENSE_BINDING(ffi::BF16));
#define SPEC_DECODE_EMBED_BINDING(T) \
  ffi::Ffi::Bind().Arg<ffi::Buffer<T>>().Arg<ffi::Buffer<ffi::S32>>().Ret<ffi::Buffer<ffi::F32>>()

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeEmbed, (EmbedImpl<ffi::F32, float>),
                              SPEC_DECODE_EMBED_BINDING(ffi::F32));
XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeEmbedBf16, (EmbedImpl<ffi::BF16, uint16_t>),
                              SPEC_DECODE_EMBED_BINDING(ffi::BF16));
