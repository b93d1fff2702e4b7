// L2 round trip of a status-word load, alone and with every block reading 256 words of a 4 KB region.
#include <cstdio>
#include <vector>
#include <algorithm>
__device__ __forceinline__ unsigned long long ldr(const unsigned long long* a) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ldcg(const unsigned long long* a) {
  unsigned long long v;
  asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory");
  return v;
}
// chase: words[i] = (i + 37) % n
__global__ void chase(const unsigned long long* w, int steps, int strong, unsigned long long* out) {
  unsigned long long i = 0;
  long long t0 = clock64();
  for (int s = 0; s < steps; ++s) i = strong ? ldr(w + i) : ldcg(w + i);
  long long t1 = clock64();
  out[0] = (t1 - t0) / steps;
  out[1] = i;
}
// every block: its threads read words (b - 1 - t) (window of `window`), once; time of the read per block
__global__ void window_read(unsigned long long* w, int n, int window, int publish, unsigned long long* out) {
  __shared__ unsigned long long sink;
  if (publish && threadIdx.x == 0) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(w + blockIdx.x % n), "l"(1ull) : "memory");
  }
  long long t0 = clock64();
  long long other = (long long)blockIdx.x - 1 - threadIdx.x;
  unsigned long long v = 0;
  if (threadIdx.x < window && other >= 0) v = ldr(w + other % n);
  unsigned any = __syncthreads_or(v == 12345);
  long long t1 = clock64();
  if (threadIdx.x == 0) out[blockIdx.x] = t1 - t0;
  if (any) sink = v;
}
int main() {
  const int n = 1 << 16;
  unsigned long long *w, *out;
  cudaMalloc(&w, n * 8);
  cudaMalloc(&out, 1 << 20);
  std::vector<unsigned long long> h(n);
  for (int i = 0; i < n; ++i) h[i] = (i + 37) % 512;
  cudaMemcpy(w, h.data(), n * 8, cudaMemcpyHostToDevice);
  for (int strong = 0; strong < 2; ++strong) {
    chase<<<1, 1>>>(w, 64, strong, out);  // warm
    chase<<<1, 1>>>(w, 1000, strong, out);
    unsigned long long r[2];
    cudaMemcpy(r, out, 16, cudaMemcpyDeviceToHost);
    printf("chase %s: %llu cycles per load\n", strong ? "ld.relaxed.gpu" : "ld.global.cg", r[0]);
  }
  for (int blocks : {32, 64, 256, 512, 1024}) {
    for (int window : {32, 256}) {
      for (int publish = 0; publish < 2; ++publish) {
        std::vector<double> med;
        for (int rep = 0; rep < 5; ++rep) {
          window_read<<<blocks, 256>>>(w, 512, window, publish, out);
          std::vector<unsigned long long> t(blocks);
          cudaMemcpy(t.data(), out, blocks * 8, cudaMemcpyDeviceToHost);
          std::sort(t.begin(), t.end());
          med.push_back(t[blocks / 2]);
          if (rep == 4) printf("blocks %4d window %3d publish %d: cycles median %llu p90 %llu max %llu\n", blocks, window,
                               publish, t[blocks / 2], t[blocks * 9 / 10], t[blocks - 1]);
        }
      }
    }
  }
  cudaDeviceSynchronize();
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
