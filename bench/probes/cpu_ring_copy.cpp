// A probe, not part of the engine: does a layer's ring copy on the CPU slow the
// compute after it (its weights pushed out of L2), and would non-temporal
// stores help? Per layer of a 16-layer step: copy the layer's 0.92 MiB of KV
// (3776 tokens of the CPU benchmark's tiny Llama) into a ring of 2, read it
// (the attention), then read the layer's 300 KiB of weights twice (the rest).
// "plain" reads its KV where it lies, as plain vLLM does. Build and run:
//   g++ -O2 -mavx2 -o /tmp/cpu_ring_copy bench/probes/cpu_ring_copy.cpp && taskset -c 1 /tmp/cpu_ring_copy
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
static float sink;
static float read_sum(const char* p, size_t n) {  // memory-read kernel
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < n; i += 32) acc = _mm256_add_ps(acc, _mm256_loadu_ps((const float*)(p + i)));
  float o[8]; _mm256_storeu_ps(o, acc); return o[0] + o[7];
}
static void nt_copy(char* dst, const char* src, size_t n) {
  for (size_t i = 0; i < n; i += 32) _mm256_stream_si256((__m256i*)(dst + i), _mm256_loadu_si256((const __m256i*)(src + i)));
  _mm_sfence();
}
int main(int argc, char** argv) {
  const size_t layers = 16, kv = 966656, w = 288 * 1024;  // 3776 tokens x 256 B; 147,456 bf16 weights
  std::vector<char*> homes(layers), plain_kv(layers), weights(layers), ring(2);
  for (auto* v : {&homes, &plain_kv}) for (auto& p : *v) { p = (char*)aligned_alloc(64, kv); memset(p, 1, kv); }
  for (auto& p : weights) { p = (char*)aligned_alloc(64, w); memset(p, 1, w); }
  for (auto& p : ring) { p = (char*)aligned_alloc(64, kv); memset(p, 1, kv); }
  const char* names[] = {"plain (attention reads its cache)", "memcpy into the ring", "NT stores into the ring"};
  for (int rep = 0; rep < 3; ++rep)
  for (int variant = 0; variant < 3; ++variant) {
    std::vector<double> copy_t, attn_t, rest_t;
    for (int step = 0; step < 200; ++step) {
      double c = 0, a = 0, r = 0;
      for (size_t l = 0; l < layers; ++l) {
        auto t0 = clk::now();
        const char* kvp = plain_kv[l];
        if (variant == 1) { memcpy(ring[l % 2], homes[l], kv); kvp = ring[l % 2]; }
        if (variant == 2) { nt_copy(ring[l % 2], homes[l], kv); kvp = ring[l % 2]; }
        auto t1 = clk::now();
        sink += read_sum(kvp, kv);
        auto t2 = clk::now();
        sink += read_sum(weights[l], w);  // the projections and MLP: the layer's weights
        sink += read_sum(weights[l], w);
        auto t3 = clk::now();
        c += us(t0, t1); a += us(t1, t2); r += us(t2, t3);
      }
      if (step >= 20) { copy_t.push_back(c); attn_t.push_back(a); rest_t.push_back(r); }
    }
    auto med = [](std::vector<double> v) { std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end()); return v[v.size() / 2]; };
    std::printf("%-36s copy %7.1f  attention %7.1f  rest %7.1f  total %7.1f us/step\n", names[variant], med(copy_t), med(attn_t), med(rest_t), med(copy_t) + med(attn_t) + med(rest_t));
  }
  return sink == 12345.f;
}
