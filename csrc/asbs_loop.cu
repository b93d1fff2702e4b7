// The launch-once verification loop with adaptive speculative block sizing (sdbench/asbs; docs/asbs.md).
// One launch runs up to `rounds` rounds for B requests and reproduces sdbench/asbs/simulator.py bit for bit:
// per round, the KV-pressure test over the unfinished requests, then per request a draft of its current
// block size, acceptance from the counter-based hash against its profile, commit of the accepted tokens
// (lengths, and KV rows into the request's region), the float32 EMA and the next block size.
//
// Grid: one block of min(32·B, 1024) threads, one warp per request slot (warps loop over requests when
// B > 32): the pressure test sums over all requests every round, and one block makes that a shared-memory
// reduction between two __syncthreads instead of a grid barrier. Lane j evaluates draft position j (block
// sizes are <= 32), a ballot finds the first rejection. The state lives in global memory, so a launch
// with rounds = 1 is one round of the same code (the host-loop and CUDA-graph variants) and the next
// launch continues where this one stopped (round_state[0] counts the rounds run). Bounded: a launch runs
// at most `rounds` rounds, so no input can hang the GPU.
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace sdbench {

struct AsbsParams {
  uint32_t seed;
  int rounds;          // rounds this launch may run
  int history_rounds;  // columns of history [B, history_rounds]
  float alpha, high, low;  // float32 values (the simulator's f32 of the policy's numbers)
  int min_block, mid_block, max_block, pressure_cap;
  int page_size;
  int64_t capacity_pages;
  int adaptive;  // 0: fixed block sizes (block[] never changes)
  int kv_dim;    // 0: no KV rows written
  int max_len;   // rows of each request's KV region
};

cudaError_t launch_asbs_loop(float* ema, int32_t* block, int32_t* committed, const int32_t* target_len,
                             const int32_t* phase_start, const int32_t* phase_value, int32_t* history,
                             int32_t* round_state, void* kv, int64_t batch, const AsbsParams& params,
                             cudaStream_t stream);

namespace {

constexpr int kPhases = 4;  // mirrors sdbench/asbs/profiles.py MAX_PHASES
constexpr int kPressurePercent = 85;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ uint32_t mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

__device__ __forceinline__ uint32_t hash32(uint32_t seed, uint32_t request, uint32_t round, uint32_t position) {
  return mix(mix(mix(mix(seed ^ 0x9e3779b9u) ^ request) ^ round) ^ position);
}

__device__ __forceinline__ int64_t pages_of(int64_t tokens, int page_size) { return (tokens + page_size - 1) / page_size; }

__device__ __forceinline__ int per_mille(const int32_t* start, const int32_t* value, int64_t committed, int64_t target) {
  const int64_t progress = committed * 1000 / target;
  int result = value[0];
#pragma unroll
  for (int p = 0; p < kPhases; ++p) {
    if (progress >= start[p]) result = value[p];
  }
  return result;
}

__global__ void asbs_loop_kernel(float* __restrict__ ema, int32_t* __restrict__ block, int32_t* __restrict__ committed,
                                 const int32_t* __restrict__ target_len, const int32_t* __restrict__ phase_start,
                                 const int32_t* __restrict__ phase_value, int32_t* __restrict__ history,
                                 int32_t* __restrict__ round_state, __half* __restrict__ kv, int64_t batch,
                                 AsbsParams params) {
  __shared__ unsigned long long s_live;
  __shared__ int s_active;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int first_round = round_state[0];
  int round = first_round;
  for (; round < first_round + params.rounds; ++round) {
    if (threadIdx.x == 0) {
      s_live = 0;
      s_active = 0;
    }
    __syncthreads();
    // 1. pressure over the unfinished requests, with this round's blocks
    if (lane == 0) {
      unsigned long long live = 0;
      int active = 0;
      for (int64_t r = warp; r < batch; r += warps) {
        if (committed[r] < target_len[r]) {
          live += pages_of(static_cast<int64_t>(committed[r]) + block[r], params.page_size);
          ++active;
        }
      }
      atomicAdd(&s_live, live);
      atomicAdd(&s_active, active);
    }
    __syncthreads();
    if (s_active == 0) break;  // every request has finished (uniform across the block)
    const bool pressure = static_cast<long long>(s_live) * 100 > kPressurePercent * params.capacity_pages;
    // 2. every unfinished request: draft, accept, commit, EMA, next block
    for (int64_t r = warp; r < batch; r += warps) {
      const int64_t before = committed[r], target = target_len[r];
      if (before >= target) continue;  // warp-uniform
      const int proposed = block[r];
      const uint64_t limit =
          static_cast<uint64_t>(per_mille(phase_start + r * kPhases, phase_value + r * kPhases, before, target)) *
          (uint64_t{1} << 32) / 1000;
      const bool ok = lane < proposed && hash32(params.seed, static_cast<uint32_t>(r), static_cast<uint32_t>(round),
                                                static_cast<uint32_t>(lane)) < limit;
      const unsigned accepted_mask = __ballot_sync(kFullMask, ok);
      const int accepted = accepted_mask == kFullMask ? 32 : min(__ffs(~accepted_mask) - 1, proposed);
      const int64_t gained = min(static_cast<int64_t>(accepted) + 1, target - before);
      if (params.kv_dim > 0) {  // the committed rows into the request's KV region (values from the hash)
        __half* rows = kv + (r * params.max_len + before) * params.kv_dim;
        const int64_t count = gained * params.kv_dim;
        for (int64_t e = lane; e < count && before + e / params.kv_dim < params.max_len; e += 32) {
          rows[e] = __float2half_rn(static_cast<float>(hash32(params.seed, static_cast<uint32_t>(r),
                                                              static_cast<uint32_t>(before + e / params.kv_dim),
                                                              static_cast<uint32_t>(e % params.kv_dim)) & 0xffu));
        }
      }
      if (lane == 0) {
        if (round < params.history_rounds) history[r * params.history_rounds + round] = proposed;
        committed[r] = static_cast<int32_t>(before + gained);
        if (params.adaptive) {
          const float rate = __fdiv_rn(static_cast<float>(accepted), static_cast<float>(proposed));
          const float updated = __fadd_rn(__fmul_rn(params.alpha, rate), __fmul_rn(__fsub_rn(1.0f, params.alpha), ema[r]));
          int next = updated >= params.high ? params.max_block : (updated >= params.low ? params.mid_block : params.min_block);
          if (pressure) next = min(next, params.pressure_cap);
          ema[r] = updated;
          block[r] = next;
        }
      }
    }
    __syncthreads();  // this round's state is what the next round's pressure test reads
  }
  if (threadIdx.x == 0) round_state[0] = round;
}

}  // namespace

cudaError_t launch_asbs_loop(float* ema, int32_t* block, int32_t* committed, const int32_t* target_len,
                             const int32_t* phase_start, const int32_t* phase_value, int32_t* history,
                             int32_t* round_state, void* kv, int64_t batch, const AsbsParams& params,
                             cudaStream_t stream) {
  if (batch < 1 || params.rounds < 0 || params.max_block > 32 || params.min_block < 1 || params.page_size < 1) {
    return cudaErrorInvalidValue;
  }
  const int threads = static_cast<int>(batch >= 32 ? 1024 : 32 * batch);
  asbs_loop_kernel<<<1, threads, 0, stream>>>(ema, block, committed, target_len, phase_start, phase_value, history,
                                              round_state, static_cast<__half*>(kv), batch, params);
  return cudaGetLastError();
}

}  // namespace sdbench
