// What the CPU kernels (dense.cc, attention.cc, distributions.cc) share: their vector types,
// unaligned loads and stores, and the split of a call's work between the calling thread and one
// thread of XLA's intra-op pool.

#ifndef SPEC_DECODE_KERNELS_COMMON_H_
#define SPEC_DECODE_KERNELS_COMMON_H_

#include <atomic>
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

#endif  // SPEC_DECODE_KERNELS_COMMON_H_
