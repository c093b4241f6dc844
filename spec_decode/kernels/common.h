// What the CPU kernels (dense.cc, attention.cc, distributions.cc) share: their vector types,
// unaligned loads and stores, the split of a call's work between the calling thread and one
// thread of XLA's intra-op pool, and the exp of a softmax (attention's and sampling's).

#ifndef SPEC_DECODE_KERNELS_COMMON_H_
#define SPEC_DECODE_KERNELS_COMMON_H_

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include "xla/ffi/api/ffi.h"

// 16 lanes, AVX-512's width: the products and attention.
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
typedef uint32_t u16 __attribute__((vector_size(64)));
// 8 lanes, AVX2's width: sampling's row kernels (AVX-512 machines ran them as fast). With
// 16-lane types GCC 12 spills to the stack on AVX2 (10x slower), and it vectorized a plain lane
// loop of masked float sums wrongly at -O3 -march=x86-64-v3 (tests/kernel_isa_test.py).
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef double d4 __attribute__((vector_size(32)));

// The vector V at p (any alignment), e.g. Load<v16>(x + i).
template <typename V>
static inline V Load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V>
static inline void Store(void* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

static inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// chunk(c) for c = 0..chunks - 1, shared by the caller and one thread of XLA's pool, each
// taking the next chunk in turn; returns when all are done. The caller takes every chunk the
// pool thread has not started, so it never waits on a thread that did not run. `chunk` is
// copied into the pool's task (which may start after the call returned and find nothing left).
template <typename F>
static void ShareChunks(xla::ffi::ThreadPool& pool, int64_t chunks, F chunk) {
  struct Shared {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto shared = std::make_shared<Shared>();
  auto work = [=]() {
    for (int64_t c; (c = shared->next.fetch_add(1)) < chunks;) {
      chunk(c);
      shared->done.fetch_add(1, std::memory_order_release);
    }
  };
  pool.Schedule([=]() { work(); });
  work();
  while (shared->done.load(std::memory_order_acquire) < chunks) Pause();
}

// exp(d) for d <= 0 (the logits less their maximum): Cephes' single-precision polynomial, within
// 1 ulp of the float64 exp at 2M points of [-87, 0]; 0 below -87, a safe cut above -87.34, where
// float32's normal range ends. F, I: float and int32 vectors of one width (f8, i8 or v16, i16).
template <typename F, typename I>
static inline F ExpNonPositive(F d) {
  F t = d * 1.44269504088896341f;  // d / ln 2
  t = t < -127.f ? F{} - 127.f : t;  // within int32 (-inf, a pruned head's -1e30): cut below
  // n = t rounded to the nearest integer: t - 0.5 <= 0 truncated toward zero.
  const I floor = I{} - 126;  // 2^n stays a normal float; results that small are cut below
  I n = __builtin_convertvector(t - 0.5f, I);
  n = n < floor ? floor : n;
  const F nf = __builtin_convertvector(n, F);
  const F r = d - nf * 0.693359375f - nf * -2.12194440e-4f;  // d - n ln 2, in two parts
  F p = F{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F e = p * r * r + r + 1.f;
  F scale;
  const I bits = (n + 127) << 23;
  std::memcpy(&scale, &bits, sizeof(F));
  return d < -87.f ? F{} : e * scale;
}

#endif  // SPEC_DECODE_KERNELS_COMMON_H_
