// Checks distributions.cc's ArgmaxRow against a plain scan, built by kernel_isa_test.py
// with the flags of an instruction set (the library itself is built for the machine's own):
//   g++ -O3 -march=<isa> -std=c++17 -I<jax.ffi.include_dir()> argmax_check.cc
// Prints each wrong row and "<wrong> of <checked> wrong"; exits 1 if any is.

#include "../spec_decode/kernels/distributions.cc"

#include <cstdio>
#include <random>
#include <vector>

// The first index of the maximum, or of the first NaN.
static int64_t Reference(const std::vector<float>& x) {
  int64_t best = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    if (x[i] != x[i]) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
}

int main() {
  std::mt19937 generator(0);
  std::uniform_int_distribution<int> small(-3, 3);
  std::normal_distribution<float> normal(0.f, 1.f);
  int wrong = 0, checked = 0;
  for (int64_t V : {1, 7, 15, 16, 17, 31, 32, 33, 100, 8192, 32128}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> x(V);
      for (float& v : x) v = kind == 0 ? normal(generator) : static_cast<float>(small(generator));
      if (kind == 2) x.assign(V, -INFINITY);
      if (kind == 3) x[V - 1] = 10.f;  // the maximum last
      if (kind == 4) x[V / 2] = NAN;
      if (kind == 5)
        for (int64_t i = 0; i < V; i += 2) x[i] = -INFINITY;
      const int64_t got = ArgmaxRow(x.data(), V), want = Reference(x);
      ++checked;
      if (got != want && ++wrong <= 10)
        std::printf("V=%ld kind %d: %ld, want %ld\n", static_cast<long>(V), kind,
                    static_cast<long>(got), static_cast<long>(want));
    }
  }
  std::printf("%d of %d wrong\n", wrong, checked);
  return wrong ? 1 : 0;
}
