// Chain floors: kernels that do strictly less than a correct kernel of a design class (issues #17 and #18;
// docs/perf-notes.md, "Session 32"). Their GPU time, the best over the launch shapes tried, is an empirical floor for
// designs of that shape: a design that does more work the same way takes longer. Built as a shared library by
// sdbench/commands/chain_floor.py (ext.tool_library, nvcc only, called through ctypes); never part of the extension.
// Every kernel moves 16-byte units; each thread issues all of its loads before any store.
//
// #17, verify-and-pack's accepted KV (draft_kv [B, gamma, row], rows of 2^n units, k_i given):
//   copy         the accepted bytes as one contiguous run: no lengths, no verdict, no prefix. An oracle's floor.
//   gather       reads k_i and the exclusive prefix off_i (given, one 16-byte pair a sequence), then loads the
//                accepted rows and stores them at off_i: the chain of a design that reads a row only once it knows
//                the row is accepted, without the tokens, the verification and the prefix (ballot, look-back).
//   speculative  loads every drafted row while k_i and off_i load, then stores the accepted ones: the chain of a
//                design that reads rows before their verdict, with the bytes of every drafted row, without the same.
// #18, verification from logits (target [B, gamma+1, V], draft [B, gamma, V], bf16 or fp32):
//   rows_max     pass 1: every row read once, its maximum per split written (no exp, no sums, no accept test);
//   race         launched with programmatic dependent launch behind rows_max: waits for it, picks a row k per
//                sequence from the maxima (the first j < gamma whose target maximum is below the draft's, else
//                gamma), reads target row k and draft row k (where k < gamma) again and returns
//                argmax(target - draft) (argmax(target) at k = gamma) by one 64-bit atomicMax per block.
//   Both read every row of every request. fused_logits reads fewer where requests are greedy (no draft rows in
//   pass 1, no race), so on a batch with greedy requests these two are not a floor for it. With greedy_period P > 0
//   (request s greedy iff s % P == 0, as a temperature cycle that starts at 0 makes them), both skip what
//   fused_logits skips: rows_max reads no draft row of a greedy request, and the race runs for sampled requests only.
//   Rows and requests are mapped by arithmetic, so skipping adds no load to either chain.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace chain_floor {
namespace {

constexpr int kThreads = 256;

// ---- #17 ------------------------------------------------------------------------------------------------
// Grid: ceil(units / (kThreads * kUnits)) blocks; thread t copies units t + u * (grid threads). Registers only
// (kUnits 16-byte words a thread), no shared memory.
template <int kUnits>
__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                        int64_t units) {
  const int64_t stride = int64_t{gridDim.x} * kThreads, first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  uint4 word[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (first + u * stride < units) word[u] = __ldg(src + first + u * stride);
  }
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    if (first + u * stride < units) dst[first + u * stride] = word[u];
  }
}

// Grid: ceil(drafted units / (kThreads * kUnits)) blocks; thread t handles drafted units t + u * (grid threads):
// consecutive threads, consecutive units. Registers only (a (k, off) pair and a 16-byte word a unit), no shared memory.
template <int kUnits, bool kSpeculative>
__global__ void __launch_bounds__(kThreads) gather_kernel(const uint4* __restrict__ draft_kv,
                                                          const longlong2* __restrict__ length_offset,
                                                          uint4* __restrict__ packed, int64_t units, int log_row_units,
                                                          int log_slab_units) {
  const int64_t stride = int64_t{gridDim.x} * kThreads, first = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  const int64_t row_mask = (int64_t{1} << (log_slab_units - log_row_units)) - 1;
  const int64_t unit_mask = (int64_t{1} << log_row_units) - 1;
  longlong2 meta[kUnits];
  uint4 word[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = first + u * stride;
    if (unit < units) {
      meta[u] = __ldg(length_offset + (unit >> log_slab_units));
      if constexpr (kSpeculative) word[u] = __ldg(draft_kv + unit);
    }
  }
  if constexpr (!kSpeculative) {
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int64_t unit = first + u * stride;
      if (unit < units && ((unit >> log_row_units) & row_mask) < meta[u].x) word[u] = __ldg(draft_kv + unit);
    }
  }
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int64_t unit = first + u * stride, row = (unit >> log_row_units) & row_mask;
    if (unit < units && row < meta[u].x) packed[((meta[u].y + row) << log_row_units) | (unit & unit_mask)] = word[u];
  }
}

// ---- #18 ------------------------------------------------------------------------------------------------
template <typename T>
struct Lanes;  // the elements of a 16-byte unit, as floats
template <>
struct Lanes<float> {
  static constexpr int kCount = 4;
  static constexpr unsigned kMinusInf = 0xff800000u;  // a 32-bit word of -inf lanes
  __device__ __forceinline__ static void unpack(const uint4& word, float (&out)[4]) {
    out[0] = __uint_as_float(word.x), out[1] = __uint_as_float(word.y);
    out[2] = __uint_as_float(word.z), out[3] = __uint_as_float(word.w);
  }
};
template <>
struct Lanes<__nv_bfloat16> {
  static constexpr int kCount = 8;
  static constexpr unsigned kMinusInf = 0xff80ff80u;
  __device__ __forceinline__ static void unpack(const uint4& word, float (&out)[8]) {
    const unsigned parts[4] = {word.x, word.y, word.z, word.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(parts[i] << 16);
      out[2 * i + 1] = __uint_as_float(parts[i] & 0xffff0000u);
    }
  }
};

__device__ __forceinline__ float block_max(float value, float* s_warp) {
  for (int delta = 16; delta > 0; delta >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, delta));
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = value;
  __syncthreads();
  value = s_warp[0];
  for (int w = 1; w < kThreads / 32; ++w) value = fmaxf(value, s_warp[w]);
  return value;
}

// The j-th sampled request, for greedy_period P >= 2 (request s greedy iff s % P == 0): (j / (P - 1)) * P + j % (P - 1)
// + 1.
// 32-bit: j < B <= 65535 (the grid's y). Callers skip it where greedy_period = 0, so the all-rows floors keep
// session 32's chains.
__device__ __forceinline__ unsigned sampled_request(unsigned j, unsigned greedy_period) {
  return (j / (greedy_period - 1)) * greedy_period + j % (greedy_period - 1) + 1;
}

// Grid (splits, rows), rows <= 65535: the target rows, then the draft rows of the sampled requests (every request's
// where greedy_period = 0). Block (split, y) takes the maximum of units [split, split + 1) * kThreads * kUnits of
// its row, kUnits a thread, and a block reduction through 32 bytes of shared memory, into partials[row][split]
// (row: its index among all B (2 gamma + 1) rows, so a greedy request's draft rows are left unwritten). Block
// (0, seq) also zeroes the race's pick of sequence seq.
template <typename T, int kUnits>
__global__ void __launch_bounds__(kThreads) rows_max_kernel(const uint4* __restrict__ target,
                                                            const uint4* __restrict__ draft, float* partials,
                                                            unsigned long long* picks, int64_t target_rows,
                                                            int row_units, int batch, int gamma, int greedy_period) {
  asm volatile("griddepcontrol.launch_dependents;");
  __shared__ float s_warp[kThreads / 32];
  int64_t row = blockIdx.y;
  if (greedy_period != 0 && row >= target_rows) {  // the (row - target_rows)-th drafted row of the sampled requests
    const unsigned drafted = static_cast<unsigned>(row - target_rows), g = static_cast<unsigned>(gamma);
    row = target_rows + int64_t{sampled_request(drafted / g, static_cast<unsigned>(greedy_period))} * gamma +
          drafted % g;
  }
  const uint4* source = row < target_rows ? target + row * row_units : draft + (row - target_rows) * row_units;
  const int first = blockIdx.x * kThreads * kUnits + threadIdx.x;
  // A unit past the row reads as -inf lanes, so the fold has no branch: with one around each unit's fold, ptxas sank
  // loads behind the folds before them (ac9ffe7's bf16 build issued 5 of its 8 loads up front, and the floors ran
  // 0.5-1.5 µs slower than 6807e09's, which issued 7; docs/perf-notes.md, "Session 35").
  constexpr unsigned kEmpty = Lanes<T>::kMinusInf;
  uint4 word[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    word[u] = first + u * kThreads < row_units ? __ldg(source + first + u * kThreads)
                                               : make_uint4(kEmpty, kEmpty, kEmpty, kEmpty);
  }
  float best = -INFINITY;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    float value[Lanes<T>::kCount];
    Lanes<T>::unpack(word[u], value);
#pragma unroll
    for (int i = 0; i < Lanes<T>::kCount; ++i) best = fmaxf(best, value[i]);
  }
  best = block_max(best, s_warp);
  if (threadIdx.x == 0) {
    partials[row * gridDim.x + blockIdx.x] = best;  // gridDim.x: the splits
    if (blockIdx.x == 0 && row < batch) picks[row] = 0;
  }
}

__device__ __forceinline__ unsigned ordered_bits(float value) {  // unsigned order = float order
  const unsigned bits = __float_as_uint(value);
  return bits & 0x80000000u ? ~bits : bits | 0x80000000u;
}

// Grid (chunks of kThreads * kUnits units of a row, sampled requests: every request where greedy_period = 0),
// gamma <= 32: warp 0 decides k from the row maxima, every
// thread reads kUnits units of target row k and draft row k, and the block's best key (ordered(value) << 32 | ~index,
// so the smallest index wins a tie) goes to one atomicMax. Shared memory: k and 8 keys (68 bytes).
template <typename T, int kUnits>
__global__ void __launch_bounds__(kThreads) race_kernel(const uint4* __restrict__ target,
                                                        const uint4* __restrict__ draft, const float* partials,
                                                        unsigned long long* picks, int gamma, int row_units,
                                                        int splits, int64_t target_rows, int greedy_period) {
  // the request first: its arithmetic overlaps rows_max, which the wait is for
  const int64_t seq =
      greedy_period == 0 ? blockIdx.y : sampled_request(blockIdx.y, static_cast<unsigned>(greedy_period));
  asm volatile("griddepcontrol.wait;" ::: "memory");
  __shared__ int s_row;
  __shared__ unsigned long long s_warp[kThreads / 32];
  if (threadIdx.x < 32) {
    bool reject = false;
    if (static_cast<int>(threadIdx.x) < gamma) {
      const float* t = partials + (seq * (gamma + 1) + threadIdx.x) * splits;
      const float* d = partials + (target_rows + seq * gamma + threadIdx.x) * splits;
      float t_max = -INFINITY, d_max = -INFINITY;
      for (int s = 0; s < splits; ++s) t_max = fmaxf(t_max, t[s]), d_max = fmaxf(d_max, d[s]);
      reject = t_max < d_max;
    }
    const unsigned rejected = __ballot_sync(0xffffffffu, reject);
    if (threadIdx.x == 0) s_row = rejected ? __ffs(rejected) - 1 : gamma;
  }
  __syncthreads();
  const int k = s_row;
  const uint4* t_row = target + (seq * (gamma + 1) + k) * row_units;
  const uint4* d_row = draft + (seq * gamma + k) * row_units;  // read only where k < gamma
  const int first = blockIdx.x * kThreads * kUnits + threadIdx.x;
  // Every load before the first fold, as in rows_max_kernel: with a branch around each unit's fold, ptxas issued 2 of
  // a thread's loads before its first fold (docs/perf-notes.md, "Session 35"). A unit past the row reads as -inf target
  // lanes, and the draft as 0 there and at k = gamma (t - 0 = t exactly): its keys are -inf's, which lose to any
  // number in the row, and tie with a -inf there at a larger index, so they lose that too.
  constexpr unsigned kEmpty = Lanes<T>::kMinusInf;
  uint4 t_word[kUnits], d_word[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const bool in_row = first + u * kThreads < row_units;
    t_word[u] = in_row ? __ldg(t_row + first + u * kThreads) : make_uint4(kEmpty, kEmpty, kEmpty, kEmpty);
    d_word[u] = in_row && k < gamma ? __ldg(d_row + first + u * kThreads) : make_uint4(0u, 0u, 0u, 0u);
  }
  unsigned long long best = 0;
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const int unit = first + u * kThreads;
    float t[Lanes<T>::kCount], d[Lanes<T>::kCount];
    Lanes<T>::unpack(t_word[u], t);
    Lanes<T>::unpack(d_word[u], d);
#pragma unroll
    for (int i = 0; i < Lanes<T>::kCount; ++i) {
      const unsigned index = static_cast<unsigned>(unit * Lanes<T>::kCount + i);
      const unsigned long long key = (static_cast<unsigned long long>(ordered_bits(t[i] - d[i])) << 32) | ~index;
      best = key > best ? key : best;
    }
  }
  for (int delta = 16; delta > 0; delta >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, best, delta);
    best = other > best ? other : best;
  }
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = s_warp[w] > best ? s_warp[w] : best;
    atomicMax(picks + seq, best);
  }
}

int64_t blocks_for(int64_t units, int per_thread) {
  return (units + int64_t{kThreads} * per_thread - 1) / (int64_t{kThreads} * per_thread);
}

template <int kUnits>
cudaError_t copy_with(const void* src, void* dst, int64_t units, cudaStream_t stream) {
  if (units == 0) return cudaSuccess;  // a grid of no blocks is an invalid launch
  copy_kernel<kUnits><<<static_cast<unsigned>(blocks_for(units, kUnits)), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), units);
  return cudaGetLastError();
}

template <int kUnits, bool kSpeculative>
cudaError_t gather_with(const void* draft_kv, const void* length_offset, void* packed, int64_t units,
                        int log_row_units, int log_slab_units, cudaStream_t stream) {
  if (units == 0) return cudaSuccess;
  gather_kernel<kUnits, kSpeculative><<<static_cast<unsigned>(blocks_for(units, kUnits)), kThreads, 0, stream>>>(
      static_cast<const uint4*>(draft_kv), static_cast<const longlong2*>(length_offset), static_cast<uint4*>(packed),
      units, log_row_units, log_slab_units);
  return cudaGetLastError();
}

template <typename T, int kRowsUnits, int kRaceUnits>
cudaError_t two_pass_with(const void* target, const void* draft, float* partials, unsigned long long* picks,
                          int batch, int gamma, int row_units, bool race, int greedy_period, cudaStream_t stream) {
  const int splits = static_cast<int>(blocks_for(row_units, kRowsUnits));
  const int64_t greedy = greedy_period == 0 ? 0 : (batch + greedy_period - 1) / greedy_period;  // s % P == 0
  const int64_t sampled = batch - greedy;
  const int64_t target_rows = int64_t{batch} * (gamma + 1), rows = target_rows + sampled * gamma;
  rows_max_kernel<T, kRowsUnits><<<dim3(splits, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
      static_cast<const uint4*>(target), static_cast<const uint4*>(draft), partials, picks, target_rows, row_units,
      batch, gamma, greedy_period);
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess || !race || sampled == 0) return error;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks_for(row_units, kRaceUnits)), static_cast<unsigned>(sampled));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, race_kernel<T, kRaceUnits>, static_cast<const uint4*>(target),
                            static_cast<const uint4*>(draft), static_cast<const float*>(partials), picks, gamma,
                            row_units, splits, target_rows, greedy_period);
}

}  // namespace
}  // namespace chain_floor

// ---- C entry points (ctypes); each returns a cudaError_t -----------------------------------------------------
extern "C" {

// units_per_thread: 1, 2, 4 or 8.
int chain_floor_copy(const void* src, void* dst, int64_t units, int units_per_thread, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (units_per_thread) {
    case 1: return chain_floor::copy_with<1>(src, dst, units, s);
    case 2: return chain_floor::copy_with<2>(src, dst, units, s);
    case 4: return chain_floor::copy_with<4>(src, dst, units, s);
    case 8: return chain_floor::copy_with<8>(src, dst, units, s);
    default: return cudaErrorInvalidValue;
  }
}

// length_offset: int64 [B, 2] (k_i, exclusive prefix of k); units = B * gamma * row_units.
int chain_floor_gather(const void* draft_kv, const void* length_offset, void* packed, int64_t units,
                       int log_row_units, int log_slab_units, int units_per_thread, int speculative, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  using chain_floor::gather_with;
  const int key = units_per_thread * 2 + (speculative ? 1 : 0);
  switch (key) {
    case 2: return gather_with<1, false>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    case 3: return gather_with<1, true>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    case 4: return gather_with<2, false>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    case 5: return gather_with<2, true>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    case 8: return gather_with<4, false>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    case 9: return gather_with<4, true>(draft_kv, length_offset, packed, units, log_row_units, log_slab_units, s);
    default: return cudaErrorInvalidValue;
  }
}

// bf16: 1 for bfloat16 logits, 0 for float32. rows_units_per_thread: 4 or 8; race_units_per_thread: 2 or 4.
// race 0: rows_max alone. partials: float [B (2 gamma + 1), splits]; picks: uint64 [B]. greedy_period: 0 (every row
// read, every request raced) or P >= 2 (request s greedy iff s % P == 0: its draft rows unread, its pick left 0).
int chain_floor_two_pass(const void* target, const void* draft, float* partials, unsigned long long* picks, int batch,
                         int gamma, int row_units, int bf16, int rows_units_per_thread, int race_units_per_thread,
                         int race, int greedy_period, void* stream) {
  if (gamma < 1 || gamma > 32 || greedy_period < 0 || greedy_period == 1) return cudaErrorInvalidValue;
  auto s = static_cast<cudaStream_t>(stream);
  using chain_floor::two_pass_with;
  using bf16_t = __nv_bfloat16;
  const int key = (bf16 ? 100 : 0) + rows_units_per_thread * 10 + race_units_per_thread;
  using Launch = cudaError_t (*)(const void*, const void*, float*, unsigned long long*, int, int, int, bool, int,
                                 cudaStream_t);
  Launch launch = nullptr;
  switch (key) {
    case 42: launch = two_pass_with<float, 4, 2>; break;
    case 44: launch = two_pass_with<float, 4, 4>; break;
    case 82: launch = two_pass_with<float, 8, 2>; break;
    case 84: launch = two_pass_with<float, 8, 4>; break;
    case 142: launch = two_pass_with<bf16_t, 4, 2>; break;
    case 144: launch = two_pass_with<bf16_t, 4, 4>; break;
    case 182: launch = two_pass_with<bf16_t, 8, 2>; break;
    case 184: launch = two_pass_with<bf16_t, 8, 4>; break;
    default: return cudaErrorInvalidValue;
  }
  return launch(target, draft, partials, picks, batch, gamma, row_units, race, greedy_period, s);
}

}  // extern "C"
