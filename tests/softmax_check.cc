// Checks distributions.cc's SoftmaxRow against float64 arithmetic, built by kernel_isa_test.py
// with the flags of an instruction set (the library itself is built for the machine's own):
//   g++ -O3 -march=<isa> -std=c++17 -I<jax.ffi.include_dir()> softmax_check.cc
// Prints each wrong row and "<wrong> of <checked> wrong"; exits 1 if any is.

#include "../spec_decode/kernels/distributions.cc"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

int main() {
  std::mt19937 generator(0);
  std::normal_distribution<float> normal(0.f, 1.f);
  int wrong = 0, checked = 0;
  for (int64_t V : {1, 7, 8, 9, 100, 8192, 32128}) {
    for (float scale : {0.1f, 3.f, 30.f}) {
      for (int masked = 0; masked < 2; ++masked) {
        std::vector<float> x(V), y(V);
        for (float& v : x) v = normal(generator) * scale;
        if (masked)  // top-k's -inf, a pruned head's -1e30
          for (int64_t i = 1; i < V; i += 3) x[i] = i % 2 ? -INFINITY : -1e30f;
        SoftmaxRow(x.data(), y.data(), V);
        // The reference from the same float32 differences x - m, in float64.
        const float m = *std::max_element(x.begin(), x.end());
        double sum = 0.0;
        for (float v : x) sum += std::exp(static_cast<double>(v - m));
        double worst = 0.0;
        for (int64_t i = 0; i < V; ++i) {
          const float d = x[i] - m;
          const double want = std::exp(static_cast<double>(d)) / sum;
          const double error = d < -87.f ? (y[i] == 0.f ? 0.0 : INFINITY)  // cut to 0
                                         : std::fabs(y[i] - want) / want;
          worst = std::max(worst, error);
        }
        ++checked;
        if (!(worst <= 1e-6) && ++wrong <= 10)
          std::printf("V=%ld scale %g masked %d: relative error %g\n", static_cast<long>(V), scale,
                      masked, worst);
      }
    }
  }
  std::printf("%d of %d wrong\n", wrong, checked);
  return wrong ? 1 : 0;
}
