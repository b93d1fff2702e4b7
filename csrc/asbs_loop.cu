// The launch-once verification loop with adaptive speculative block sizing (sdbench/asbs; docs/asbs.md).
// One launch runs up to `rounds` rounds for B requests and reproduces sdbench/asbs/simulator.py bit for bit:
// per round, the KV-pressure test over the unfinished requests, then per request a draft of its current
// block size, acceptance from the counter-based hash against its profile, commit of the accepted tokens
// (lengths, and KV rows into the request's region), the float32 EMA and the next block size.
//
// Grid: one block of min(B, 32) warps: the pressure test sums over all requests every round, and one block
// makes that a shared-memory reduction instead of a grid barrier. The request state (EMA, block size,
// committed and target lengths) lives in registers for the whole launch: lane l of warp w holds requests
// w + (32·s + l)·warps, s < kSlots (B <= 2048; one block is the wrong shape for more anyway). A round is then one barrier: each lane sums the pages of its
// own requests, warps exchange partial sums through double-buffered shared memory, every warp reduces them
// to the same pressure flag; each warp verifies its requests one at a time (lane j evaluates draft position
// j, a ballot finds the first rejection: block sizes are <= 32) and every lane updates its own requests'
// state. Global memory sees the state read once, written back once, plus the history and KV-row stores,
// which nothing in the loop reads. (The first version kept the state in global memory and paid ~3
// dependent L2 round trips a round: 3.3 µs a round at b = 32 on the H100; docs/perf-notes.md.)
// A launch with rounds = 1 is one round of the same code (the host-loop and CUDA-graph variants), and the
// next launch continues where this one stopped (round_state[0] counts the rounds run). Bounded: a launch
// runs at most `rounds` rounds, so no input can hang the GPU.
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
// 32 warps x 32 lanes x 2 slots (4 spill registers under the 64 that 1024 threads leave each): the request state of one launch lives in one block's registers.
constexpr int64_t kMaxBatch = 32 * 32 * 2;

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

// Both on the round's critical path, so neither divides in 64 bits (a software routine of ~100 instructions).
// committed + block < 2^31 + 32 fits 32 unsigned bits.
__device__ __forceinline__ uint32_t pages_of(uint32_t tokens, uint32_t page_size) {
  return tokens / page_size + (tokens % page_size != 0);
}

// The profile's acceptance (per mille) at progress committed·1000 // target (sdbench/asbs/profiles.py), with
// progress >= start tested as committed·1000 >= start·target: the same for committed >= 0, target > 0.
__device__ __forceinline__ int per_mille(const int32_t* start, const int32_t* value, int64_t committed, int64_t target) {
  const int64_t scaled = committed * 1000;
  int result = value[0];
#pragma unroll
  for (int p = 0; p < kPhases; ++p) {
    if (scaled >= start[p] * target) result = value[p];
  }
  return result;
}

// A sum over one warp that every lane receives.
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

// kSlots requests per lane: lane l of warp w holds, in slot s, request w + (32·s + l)·warps.
template <int kSlots>
__global__ void __launch_bounds__(1024) asbs_loop_kernel(
    float* __restrict__ ema, int32_t* __restrict__ block, int32_t* __restrict__ committed,
    const int32_t* __restrict__ target_len, const int32_t* __restrict__ phase_start,
    const int32_t* __restrict__ phase_value, int32_t* __restrict__ history, int32_t* __restrict__ round_state,
    __half* __restrict__ kv, int64_t batch, AsbsParams params) {
  // Per-warp partial sums of the pressure test, double-buffered by round parity: a warp writing round t+1's
  // partial never overwrites one a slower warp still reads for round t, so one barrier a round suffices.
  __shared__ unsigned long long s_live[2][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  // The state, in registers for the whole launch (read once here, written back once at the end).
  // request_of(s) = this lane's request in slot s; a slot past the batch holds target 0 (always finished).
  const auto request_of = [&](int s) { return warp + static_cast<int64_t>(32 * s + lane) * warps; };
  float my_ema[kSlots];
  int my_block[kSlots], my_committed[kSlots], my_target[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool valid = request_of(s) < batch;
    const int64_t r = valid ? request_of(s) : 0;
    my_ema[s] = ema[r];
    my_block[s] = block[r];
    my_committed[s] = valid ? committed[r] : 0;  // a slot past the batch: committed 0 = target, finished
    my_target[s] = valid ? target_len[r] : 0;
  }

  const int first_round = round_state[0];
  int round = first_round;
  for (; round < first_round + params.rounds; ++round) {
    // 1. pressure over the unfinished requests, with this round's blocks. Every unfinished request holds at
    //    least one page (block >= 1), so no live pages means every request has finished.
    unsigned long long live = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (my_committed[s] < my_target[s]) {
        live += pages_of(static_cast<uint32_t>(my_committed[s]) + static_cast<uint32_t>(my_block[s]),
                         static_cast<uint32_t>(params.page_size));
      }
    }
    live = warp_sum(live);
    const int parity = (round - first_round) & 1;
    if (lane == 0) s_live[parity][warp] = live;
    __syncthreads();
    live = warp_sum(lane < warps ? s_live[parity][lane] : 0ull);
    if (live == 0) break;  // every request has finished (the same sum in every warp)
    const bool pressure = static_cast<long long>(live) * 100 > kPressurePercent * params.capacity_pages;

    // 2. each lane's acceptance threshold for its own requests (lane-parallel: no request reads another's)
    int acceptance[kSlots];  // per mille
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      const int64_t r = my_committed[s] < my_target[s] ? request_of(s) : 0;
      acceptance[s] = per_mille(phase_start + r * kPhases, phase_value + r * kPhases, my_committed[s], my_target[s]);
    }

    // 3. the warp verifies its requests one by one: lane j evaluates draft position j, a ballot finds the
    //    first rejection; the request's owner lane keeps the count, and the warp writes its KV rows.
    int accepted[kSlots];
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      accepted[s] = 0;
      for (int owner = 0; owner < 32; ++owner) {
        const int64_t r = warp + static_cast<int64_t>(32 * s + owner) * warps;
        if (r >= batch) break;  // warp-uniform
        const int before = __shfl_sync(kFullMask, my_committed[s], owner);
        const int target = __shfl_sync(kFullMask, my_target[s], owner);
        if (before >= target) continue;  // finished: warp-uniform
        const int proposed = __shfl_sync(kFullMask, my_block[s], owner);
        const uint64_t bound =
            static_cast<uint64_t>(__shfl_sync(kFullMask, acceptance[s], owner)) * (uint64_t{1} << 32) / 1000;
        const bool ok = lane < proposed && hash32(params.seed, static_cast<uint32_t>(r), static_cast<uint32_t>(round),
                                                  static_cast<uint32_t>(lane)) < bound;
        const unsigned accepted_mask = __ballot_sync(kFullMask, ok);
        const int count = accepted_mask == kFullMask ? 32 : min(__ffs(~accepted_mask) - 1, proposed);
        if (lane == owner) accepted[s] = count;
        if (params.kv_dim > 0) {  // the committed rows into the request's KV region (values from the hash)
          // (the per-element division here is off the benchmark's path, which writes no KV rows)
          const int64_t gained = min(static_cast<int64_t>(count) + 1, static_cast<int64_t>(target) - before);
          __half* rows = kv + (r * params.max_len + before) * params.kv_dim;
          const int64_t elements = gained * params.kv_dim;
          for (int64_t e = lane; e < elements && before + e / params.kv_dim < params.max_len; e += 32) {
            rows[e] = __float2half_rn(static_cast<float>(hash32(params.seed, static_cast<uint32_t>(r),
                                                                static_cast<uint32_t>(before + e / params.kv_dim),
                                                                static_cast<uint32_t>(e % params.kv_dim)) & 0xffu));
          }
        }
      }
    }

    // 4. commit, history, EMA and the next block size, each lane for its own requests
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      if (my_committed[s] >= my_target[s]) continue;
      const int proposed = my_block[s];
      if (round < params.history_rounds) history[request_of(s) * params.history_rounds + round] = proposed;
      my_committed[s] += min(accepted[s] + 1, my_target[s] - my_committed[s]);
      if (params.adaptive) {
        const float rate = __fdiv_rn(static_cast<float>(accepted[s]), static_cast<float>(proposed));
        const float updated =
            __fadd_rn(__fmul_rn(params.alpha, rate), __fmul_rn(__fsub_rn(1.0f, params.alpha), my_ema[s]));
        int next = updated >= params.high ? params.max_block : (updated >= params.low ? params.mid_block : params.min_block);
        if (pressure) next = min(next, params.pressure_cap);
        my_ema[s] = updated;
        my_block[s] = next;
      }
    }
  }

#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    if (request_of(s) >= batch) continue;
    ema[request_of(s)] = my_ema[s];
    block[request_of(s)] = my_block[s];
    committed[request_of(s)] = my_committed[s];
  }
  if (threadIdx.x == 0) round_state[0] = round;
}

}  // namespace

cudaError_t launch_asbs_loop(float* ema, int32_t* block, int32_t* committed, const int32_t* target_len,
                             const int32_t* phase_start, const int32_t* phase_value, int32_t* history,
                             int32_t* round_state, void* kv, int64_t batch, const AsbsParams& params,
                             cudaStream_t stream) {
  if (batch < 1 || params.rounds < 0 || params.max_block > 32 || params.min_block < 1 || params.page_size < 1 ||
      params.pressure_cap < 1) {  // a request always drafts >= 1 token, so unfinished means live pages
    return cudaErrorInvalidValue;
  }
  if (batch > kMaxBatch) return cudaErrorInvalidValue;
  // One warp per request up to 32 requests; above, 32 warps whose lanes hold ceil(B / 1024) requests each.
  const int warps = static_cast<int>(batch < 32 ? batch : 32);
  const int64_t per_lane = (batch + 32 * warps - 1) / (32 * warps);
  auto* rows = static_cast<__half*>(kv);
  if (per_lane == 1) {
    asbs_loop_kernel<1><<<1, 32 * warps, 0, stream>>>(ema, block, committed, target_len, phase_start, phase_value,
                                                     history, round_state, rows, batch, params);
  } else {
    asbs_loop_kernel<2><<<1, 32 * warps, 0, stream>>>(ema, block, committed, target_len, phase_start, phase_value,
                                                     history, round_state, rows, batch, params);
  }
  return cudaGetLastError();
}

}  // namespace sdbench
