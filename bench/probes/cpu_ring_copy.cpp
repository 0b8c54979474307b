// A probe, not part of the engine: does a layer's ring copy on the CPU slow the
// compute after it (its weights pushed out of L2), and would non-temporal
// stores help? Per layer of a 16-layer step: copy the layer's 0.92 MiB of KV
// (3776 tokens of the CPU benchmark's tiny Llama) into a ring of 2, read it
// (the attention), then read the layer's 288 KiB of weights twice (the rest).
// "plain" reads its KV where it lies, as plain vLLM does. Build and run:
//   g++ -O2 -mavx2 -o build/cpu_ring_copy bench/probes/cpu_ring_copy.cpp
//   taskset -c 1 build/cpu_ring_copy
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

float sink;  // what the reads sum, so the compiler keeps them

float read_sum(const char* p, std::size_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t i = 0; i < n; i += 32) {
    acc = _mm256_add_ps(acc, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i)));
  }
  float o[8];
  _mm256_storeu_ps(o, acc);
  return o[0] + o[7];
}

void nt_copy(char* dst, const char* src, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
  }
  _mm_sfence();
}

char* filled(std::size_t n) {
  auto* p = static_cast<char*>(std::aligned_alloc(64, n));
  std::memset(p, 1, n);
  return p;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main() {
  constexpr std::size_t kLayers = 16;
  constexpr std::size_t kKv = 966656;           // 3776 tokens x 256 bytes
  constexpr std::size_t kWeights = 288 * 1024;  // 147,456 bf16 weights
  std::vector<char*> homes(kLayers), plain_kv(kLayers), weights(kLayers), ring(2);
  for (auto& p : homes) p = filled(kKv);
  for (auto& p : plain_kv) p = filled(kKv);
  for (auto& p : weights) p = filled(kWeights);
  for (auto& p : ring) p = filled(kKv);
  const char* names[] = {"plain (attention reads its cache)", "memcpy into the ring",
                         "NT stores into the ring"};
  for (int repeat = 0; repeat < 3; ++repeat) {
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<double> copy_t, attention_t, rest_t;
      for (int step = 0; step < 200; ++step) {
        double c = 0, a = 0, r = 0;
        for (std::size_t l = 0; l < kLayers; ++l) {
          const auto t0 = Clock::now();
          const char* kv = plain_kv[l];
          if (variant == 1) std::memcpy(ring[l % 2], homes[l], kKv);
          if (variant == 2) nt_copy(ring[l % 2], homes[l], kKv);
          if (variant != 0) kv = ring[l % 2];
          const auto t1 = Clock::now();
          sink += read_sum(kv, kKv);
          const auto t2 = Clock::now();
          sink += read_sum(weights[l], kWeights);  // the projections and the MLP
          sink += read_sum(weights[l], kWeights);
          const auto t3 = Clock::now();
          c += us(t0, t1);
          a += us(t1, t2);
          r += us(t2, t3);
        }
        if (step >= 20) {  // the first steps warm the caches
          copy_t.push_back(c);
          attention_t.push_back(a);
          rest_t.push_back(r);
        }
      }
      const double c = median(copy_t), a = median(attention_t), r = median(rest_t);
      std::printf("%-36s copy %7.1f  attention %7.1f  rest %7.1f  total %7.1f us/step\n", names[variant], c,
                  a, r, c + a + r);
    }
  }
  std::printf("%s", sink == 0.5f ? " \n" : "");  // keeps sink alive; never prints
  return 0;
}
