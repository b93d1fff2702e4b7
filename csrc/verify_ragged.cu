// Greedy verification over ragged draft lengths in the flattened layout (sdbench/ops/verify_ragged):
// request i's drafts are draft_tokens[cu[i-1] .. cu[i]) and its gamma_i + 1 targets start at cu[i-1] + i.
// k_i = first position where draft != target (gamma_i when none); next_tokens[i] = its target at k_i.
//
// Grid: ceil(B / 4) blocks of 4 warps, one warp per request. Lane j compares position j of each
// 32-position chunk; a ballot finds the first mismatch, so a request costs ceil(gamma_i / 32) ballots
// whatever its acceptance. Offsets are clamped (0 <= start <= end <= T) before any load, so bad
// cu_num_draft_tokens never read out of bounds: every index stays below T (drafts) or T + B (targets).
// Shared memory: none.
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"

namespace sdbench {

cudaError_t launch_verify_ragged_ballot(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                        const int64_t* cu_num_draft_tokens, int64_t* accepted_lengths,
                                        bool* has_mismatch, void* next_tokens, int64_t batch, int64_t total,
                                        cudaStream_t stream);

namespace {

constexpr int kWarpsPerBlock = 4;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    verify_ragged_ballot_kernel(const T* __restrict__ draft_tokens, const T* __restrict__ target_tokens,
                                const int64_t* __restrict__ cu_num_draft_tokens, int64_t* __restrict__ accepted_lengths,
                                bool* __restrict__ has_mismatch, T* __restrict__ next_tokens, int64_t batch,
                                int64_t total) {
  const int lane = threadIdx.x % 32;
  const int64_t request = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (request >= batch) return;  // whole warps only: the ballots below see all 32 lanes
  int64_t start = request == 0 ? 0 : __ldg(cu_num_draft_tokens + request - 1);
  int64_t end = __ldg(cu_num_draft_tokens + request);
  start = min(max(start, int64_t{0}), total);
  end = min(max(end, start), total);
  const int64_t length = end - start;
  const T* draft = draft_tokens + start;
  const T* target = target_tokens + start + request;
  int64_t accepted = length;
  for (int64_t base = 0; base < length; base += 32) {
    const int64_t position = base + lane;
    const bool mismatch = position < length && __ldg(draft + position) != __ldg(target + position);
    const unsigned ballot = __ballot_sync(kFullMask, mismatch);
    if (ballot != 0u) {
      accepted = base + __ffs(ballot) - 1;
      break;
    }
  }
  if (lane == 0) {
    accepted_lengths[request] = accepted;
    has_mismatch[request] = accepted < length;
    next_tokens[request] = target[accepted];
  }
}

template <typename T>
cudaError_t launch_typed(const void* draft_tokens, const void* target_tokens, const int64_t* cu,
                         int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, int64_t batch,
                         int64_t total, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  const int64_t blocks = (batch + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  verify_ragged_ballot_kernel<T><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(draft_tokens), static_cast<const T*>(target_tokens), cu, accepted_lengths, has_mismatch,
      static_cast<T*>(next_tokens), batch, total);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_verify_ragged_ballot(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                        const int64_t* cu_num_draft_tokens, int64_t* accepted_lengths,
                                        bool* has_mismatch, void* next_tokens, int64_t batch, int64_t total,
                                        cudaStream_t stream) {
  return token_type == TokenType::kInt64
             ? launch_typed<int64_t>(draft_tokens, target_tokens, cu_num_draft_tokens, accepted_lengths,
                                     has_mismatch, next_tokens, batch, total, stream)
             : launch_typed<int32_t>(draft_tokens, target_tokens, cu_num_draft_tokens, accepted_lengths,
                                     has_mismatch, next_tokens, batch, total, stream);
}

}  // namespace sdbench
