// The launch-floor kernel and host helpers shared by the launchers.
#include "common.cuh"

namespace sdbench {
namespace {

// empty: measures the launch floor (host submission + the GPU's minimum kernel time).
// Grid: one block of one thread that does nothing. Shared memory: none; registers: 4.
__global__ void empty_kernel() {}

constexpr int kMaxDevices = 64;

}  // namespace

cudaError_t launch_empty(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

// Benign race: two threads that miss the cache both store the same value.
int current_device_sm_count() {
  static int sm_counts[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 1;
  if (sm_counts[device] == 0) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count < 1) return 1;
    sm_counts[device] = count;
  }
  return sm_counts[device];
}

int cooperative_grid_size(const void* kernel, int threads, int max_per_sm) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess || per_sm < 1) {
    per_sm = 1;  // the cooperative launch itself then reports any real problem
  }
  if (per_sm > max_per_sm) per_sm = max_per_sm;
  return per_sm * current_device_sm_count();
}

}  // namespace sdbench
