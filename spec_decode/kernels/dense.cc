// K-row dense products for XLA:CPU through the XLA FFI: y = x @ w for 1..16 rows.
//
// XLA:CPU multiplies one row by a weight matrix as a GEMV that streams the weights
// once, but 2-16 rows as a GEMM that packs the weights on every call, so a verify
// call over K positions costs up to 2-3 single steps on some CPUs. Here every row
// is multiplied in the pass that streams the weights once: for each tile of 32
// output columns (two 16-float vectors), each weight row i is loaded once and
// multiplied into the accumulators of all M rows. Each output element is the sum
// over i in increasing order of fused multiply-adds, whatever M is and whichever
// thread computes its tile: a row's result does not depend on the rows beside it.
//
// Built by spec_decode/kernels/build.py with the system compiler for the machine
// it runs on (-march=native); its handler SpecDecodeDense is registered as the FFI
// target spec_decode_dense.

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
// Weight rows fetched ahead of the one being multiplied.
constexpr int64_t kPrefetchRows = 16;
typedef float v16 __attribute__((vector_size(64)));

// y[m, n0:n0 + 16 NV] of all M rows: one pass over w's rows, i increasing.
template <int M, int NV>
static inline void Tile(const float* __restrict x, const float* __restrict w, float* __restrict y,
                        int64_t in, int64_t out, int64_t n0) {
  v16 acc[M][NV];
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = v16{};
  const float* wr = w + n0;
  for (int64_t i = 0; i < in; ++i, wr += out) {
    for (int v = 0; v < NV; ++v) __builtin_prefetch(wr + kPrefetchRows * out + 16 * v);
    v16 wv[NV];
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&wv[v], wr + 16 * v, 64);
    for (int m = 0; m < M; ++m) {
      float s = x[m * in + i];
      v16 xv = v16{} + s;
      for (int v = 0; v < NV; ++v) acc[m][v] += xv * wv[v];
    }
  }
  for (int m = 0; m < M; ++m)
    for (int v = 0; v < NV; ++v) __builtin_memcpy(y + m * out + n0 + 16 * v, &acc[m][v], 64);
}

// Columns n_begin..n_end of all M rows: 32-column tiles, then 16, then one at a time.
template <int M>
static void Columns(const float* x, const float* w, float* y, int64_t in, int64_t out,
                    int64_t n_begin, int64_t n_end) {
  constexpr int NV = M <= 8 ? 2 : 1;
  int64_t n = n_begin;
  for (; n + 16 * NV <= n_end; n += 16 * NV) Tile<M, NV>(x, w, y, in, out, n);
  for (; n + 16 <= n_end; n += 16) Tile<M, 1>(x, w, y, in, out, n);
  for (; n < n_end; ++n)
    for (int m = 0; m < M; ++m) {
      float acc = 0.f;
      for (int64_t i = 0; i < in; ++i) acc = __builtin_fmaf(x[m * in + i], w[i * out + n], acc);
      y[m * out + n] = acc;
    }
}

typedef void (*ColumnsFn)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
static const ColumnsFn kColumns[16] = {
    Columns<1>, Columns<2>, Columns<3>, Columns<4>, Columns<5>, Columns<6>, Columns<7>, Columns<8>,
    Columns<9>, Columns<10>, Columns<11>, Columns<12>, Columns<13>, Columns<14>, Columns<15>,
    Columns<16>};

static inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Work shared by the caller and one pool thread: chunks of columns taken in turn.
struct Shared {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
};

// x [..., in] with 1..16 rows in all, w [in, out] -> y [..., out], float32. Products of
// at least kParallelElements weights are split between the caller and one thread of
// XLA's intra-op pool by chunks of columns; the caller takes every chunk the pool
// thread has not started, so it never waits on a thread that did not run.
static ffi::Error DenseImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                            ffi::ResultBuffer<ffi::F32> y) {
  auto wd = w.dimensions();
  if (wd.size() != 2 || wd[0] < 1 || x.element_count() % wd[0])
    return ffi::Error::InvalidArgument("spec_decode_dense: x [..., in], w [in, out]");
  int64_t in = wd[0], out = wd[1];
  int64_t rows = x.element_count() / in;
  if (rows < 1 || rows > 16)
    return ffi::Error::InvalidArgument("spec_decode_dense: 1..16 rows of x");
  ColumnsFn fn = kColumns[rows - 1];
  const float* xp = x.typed_data();
  const float* wp = w.typed_data();
  float* yp = y->typed_data();
  // Columns per work item: whole 32-column tiles, half of a small product's.
  const int64_t chunk = out >= 1024 ? 256 : ((out + 1) / 2 + 31) / 32 * 32;
  constexpr int64_t kParallelElements = 1 << 14;
  int64_t chunks = (out + chunk - 1) / chunk;
  if (chunks < 2 || in * out < kParallelElements || pool.num_threads() < 1) {
    fn(xp, wp, yp, in, out, 0, out);
    return ffi::Error::Success();
  }
  auto shared = std::make_shared<Shared>();
  auto work = [=]() {
    int64_t c;
    while ((c = shared->next.fetch_add(1)) < chunks) {
      int64_t n0 = c * chunk, n1 = n0 + chunk < out ? n0 + chunk : out;
      fn(xp, wp, yp, in, out, n0, n1);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  pool.Schedule([=]() { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < chunks) Pause();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpecDecodeDense, DenseImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
