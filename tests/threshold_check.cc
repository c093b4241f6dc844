// Checks distributions.cc's RowThreshold against a full sort, built by kernel_isa_test.py
// with the flags of an instruction set (the library itself is built for the machine's own):
//   g++ -O3 -march=<isa> -std=c++17 -I<jax.ffi.include_dir()> threshold_check.cc
// Prints each wrong threshold and "<wrong> of <checked> wrong"; exits 1 if any is.

#include "../spec_decode/kernels/distributions.cc"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>

int main() {
  std::mt19937 generator(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<int32_t> keys;
  std::vector<float> weights;
  int wrong = 0, checked = 0;
  auto check = [&](const char* what, int64_t V, double bound, float got, float want) {
    ++checked;
    if (got != want && ++wrong <= 10)
      std::printf("%s V=%ld bound %g: got %g, want %g\n", what, static_cast<long>(V), bound, got,
                  want);
  };
  for (int64_t V : {1, 7, 17, 100, 8192, 32128}) {
    for (int kind = 0; kind < 4; ++kind) {  // spread, peaked, tied, half -inf
      std::vector<float> x(V);
      for (float& v : x) v = normal(generator) * (kind == 1 ? 8.f : 1.f);
      if (kind == 2)
        for (float& v : x) v = std::round(v * 2.f);
      if (kind == 3)
        for (int64_t i = 0; i < V / 2; ++i) x[i] = -INFINITY;
      std::vector<float> sorted(x);
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      for (int64_t k : {int64_t{1}, std::min<int64_t>(40, V), V / 2 + 1, V})
        check("top-k", V, k, RowThreshold<false>(x.data(), V, k, keys, weights), sorted[k - 1]);

      std::vector<float> p(V);  // softmax, summed in double
      double total = 0.0;
      for (int64_t i = 0; i < V; ++i) total += p[i] = std::exp(x[i] - sorted[0]);
      for (float& v : p) v = static_cast<float>(v / total);
      std::vector<float> ranked(p);
      std::sort(ranked.begin(), ranked.end(), std::greater<float>());
      for (float top_p : {0.05f, 0.5f, 0.9f, 0.99f, 1.f}) {
        double before = 0.0;  // mass of the larger entries, in rank order
        float want = INFINITY;
        for (float v : ranked) {
          if (before < top_p) want = std::min(want, v);
          before += v;
        }
        check("top-p", V, top_p, RowThreshold<true>(p.data(), V, top_p, keys, weights), want);
      }
    }
  }
  std::printf("%d of %d wrong\n", wrong, checked);
  return wrong ? 1 : 0;
}
