// Fused verify-and-pack: greedy verification plus packing of the accepted KV rows in one launch.
#include "common.cuh"

namespace sdbench {
namespace {

// fused_single_block: the published fused kernel (B <= 32).
// Grid: one block of 32 warps. Warp i verifies sequence i with ballots and writes its verify
// outputs; warp 0 turns the 32 lengths into exclusive offsets with __shfl_up_sync; then warp i copies
// its own k_i rows with 16-byte vectors. One SM moves every byte, so wide KV is bound by a single
// SM's bandwidth (the study's 3.55x loss at kv_dim=2048). Shared memory: 384 B; registers: 40.
constexpr int kSingleBlockThreads = 1024;

template <typename T>
__global__ void __launch_bounds__(kSingleBlockThreads)
    fused_single_block_kernel(const T* __restrict__ draft_tokens, const T* __restrict__ target_tokens,
                              const char* __restrict__ draft_kv, int64_t* __restrict__ accepted_lengths,
                              bool* __restrict__ has_mismatch, T* __restrict__ next_tokens,
                              char* __restrict__ packed_kv, int64_t* __restrict__ packed_offsets, int batch,
                              int gamma, int64_t row_bytes) {
  __shared__ int s_length[dev::kWarpSize];
  __shared__ int64_t s_offset[dev::kWarpSize];
  const int warp = threadIdx.x / dev::kWarpSize, lane = threadIdx.x % dev::kWarpSize;
  if (warp < batch) {
    const T* target_row = target_tokens + static_cast<int64_t>(warp) * (gamma + 1);
    const int accepted =
        dev::warp_accepted_length(draft_tokens + static_cast<int64_t>(warp) * gamma, target_row, gamma, lane);
    if (lane == 0) {
      s_length[warp] = accepted;
      dev::write_verdict(warp, accepted, gamma, target_row, accepted_lengths, has_mismatch, next_tokens);
    }
  }
  __syncthreads();
  if (warp == 0) {
    const int64_t length = lane < batch ? s_length[lane] : 0;
    const int64_t exclusive = dev::warp_inclusive_scan(length, lane) - length;
    if (lane < batch) {
      s_offset[lane] = exclusive;
      packed_offsets[lane] = exclusive;
    }
  }
  __syncthreads();
  if (warp < batch) {
    dev::copy_bytes(packed_kv + s_offset[warp] * row_bytes, draft_kv + static_cast<int64_t>(warp) * gamma * row_bytes,
                    s_length[warp] * row_bytes, lane, dev::kWarpSize);
  }
}

// fused, replicated driver (small B*gamma): see dev::replicated_pack in common.cuh.
// Grid: min(SMs, B*gamma*row_bytes / 16 KiB) blocks of 32 warps. Every block re-verifies all B
// sequences (warp w takes sequences w, w+32, ...: B*(2*gamma+1) token reads, L2 hits after the first
// block), scans the lengths in shared memory and copies its equal share of the accepted bytes with
// 16-byte vectors; block 0 writes the verify outputs and packed_offsets. No block waits on another.
// Shared memory: 4*B bytes dynamic + 256 B; registers: 64.
template <typename T>
__global__ void __launch_bounds__(kReplicatedThreads, kReplicatedBlocksPerSm)
    fused_replicated_kernel(dev::BallotLengths<T> lengths, const char* __restrict__ draft_kv,
                            char* __restrict__ packed_kv, int64_t* __restrict__ packed_offsets, int64_t batch,
                            int64_t gamma, int64_t row_bytes, bool aligned16) {
  dev::replicated_pack<dev::BallotLengths<T>, kReplicatedThreads>(lengths, draft_kv, packed_kv, packed_offsets, batch,
                                                                  gamma, row_bytes, aligned16);
}

// fused, cooperative driver (large B*gamma): see dev::cooperative_pack in common.cuh.
// Grid: one block of 16 warps per SM (always co-resident). Each sequence is verified
// once (one warp), per-block sums meet in the workspace across a grid barrier, and the copy is split
// evenly over the accepted bytes after a second barrier. Shared memory: 128 B; registers: 64.
template <typename T>
__global__ void __launch_bounds__(kCooperativeThreads)
    fused_cooperative_kernel(dev::BallotLengths<T> lengths, const char* __restrict__ draft_kv,
                             char* __restrict__ packed_kv, int64_t* packed_offsets, int64_t* workspace,
                             int64_t batch, int64_t gamma, int64_t row_bytes, bool aligned16) {
  dev::cooperative_pack<dev::BallotLengths<T>, kCooperativeThreads>(lengths, draft_kv, packed_kv, packed_offsets,
                                                                    workspace, batch, gamma, row_bytes, aligned16);
}

bool fused_is_replicated(int64_t token_bytes, int64_t batch, int64_t gamma) {
  return batch <= kReplicatedMaxBatch && batch * (2 * gamma + 1) * token_bytes <= kReplicatedMaxTokenBytes;
}

template <typename T>
int fused_cooperative_grid() {
  return cooperative_grid_size(reinterpret_cast<const void*>(&fused_cooperative_kernel<T>), kCooperativeThreads,
                               kCooperativeBlocksPerSm);
}

template <typename T>
cudaError_t launch_fused_typed(const void* draft_tokens, const void* target_tokens, const void* draft_kv,
                               int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, void* packed_kv,
                               int64_t* packed_offsets, int64_t batch, int64_t gamma, int64_t row_bytes,
                               int64_t* workspace, cudaStream_t stream) {
  dev::BallotLengths<T> lengths{static_cast<const T*>(draft_tokens), static_cast<const T*>(target_tokens),
                                accepted_lengths, has_mismatch, static_cast<T*>(next_tokens)};
  const auto* src = static_cast<const char*>(draft_kv);
  auto* dst = static_cast<char*>(packed_kv);
  bool aligned16 = is_aligned16(draft_kv, packed_kv, row_bytes);
  if (fused_is_replicated(sizeof(T), batch, gamma)) {
    const int grid = replicated_grid_size(batch * gamma * row_bytes);
    const size_t shared_bytes = static_cast<size_t>(batch) * sizeof(int);
    fused_replicated_kernel<T><<<grid, kReplicatedThreads, shared_bytes, stream>>>(
        lengths, src, dst, packed_offsets, batch, gamma, row_bytes, aligned16);
    return cudaGetLastError();
  }
  void* args[] = {&lengths, &src, &dst, &packed_offsets, &workspace, &batch, &gamma, &row_bytes, &aligned16};
  return launch_cooperative(reinterpret_cast<const void*>(&fused_cooperative_kernel<T>), fused_cooperative_grid<T>(),
                            kCooperativeThreads, args, stream);
}

template <typename T>
cudaError_t launch_single_block_typed(const void* draft_tokens, const void* target_tokens, const void* draft_kv,
                                      int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                                      void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma,
                                      int64_t row_bytes, cudaStream_t stream) {
  fused_single_block_kernel<T><<<1, kSingleBlockThreads, 0, stream>>>(
      static_cast<const T*>(draft_tokens), static_cast<const T*>(target_tokens), static_cast<const char*>(draft_kv),
      accepted_lengths, has_mismatch, static_cast<T*>(next_tokens), static_cast<char*>(packed_kv), packed_offsets,
      static_cast<int>(batch), static_cast<int>(gamma), row_bytes);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_fused_single_block(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                      const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch,
                                      void* next_tokens, void* packed_kv, int64_t* packed_offsets, int64_t batch,
                                      int64_t gamma, int64_t row_bytes, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if (batch > dev::kWarpSize) return cudaErrorInvalidValue;
  return token_type == TokenType::kInt64
             ? launch_single_block_typed<int64_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths,
                                                  has_mismatch, next_tokens, packed_kv, packed_offsets, batch, gamma,
                                                  row_bytes, stream)
             : launch_single_block_typed<int32_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths,
                                                  has_mismatch, next_tokens, packed_kv, packed_offsets, batch, gamma,
                                                  row_bytes, stream);
}

int64_t fused_workspace_elems(TokenType token_type, int64_t batch, int64_t gamma) {
  if (token_type == TokenType::kInt64) {
    return fused_is_replicated(sizeof(int64_t), batch, gamma) ? 0 : fused_cooperative_grid<int64_t>();
  }
  return fused_is_replicated(sizeof(int32_t), batch, gamma) ? 0 : fused_cooperative_grid<int32_t>();
}

cudaError_t launch_fused(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                         const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                         void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma, int64_t row_bytes,
                         int64_t* workspace, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return token_type == TokenType::kInt64
             ? launch_fused_typed<int64_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch,
                                           next_tokens, packed_kv, packed_offsets, batch, gamma, row_bytes, workspace,
                                           stream)
             : launch_fused_typed<int32_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch,
                                           next_tokens, packed_kv, packed_offsets, batch, gamma, row_bytes, workspace,
                                           stream);
}

}  // namespace sdbench
