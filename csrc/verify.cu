// Greedy verification kernels: k_i = first position where draft != target (gamma when none).
// Outputs accepted_lengths (int64), has_mismatch (bool), next_tokens = target[i, k_i].
#include "common.cuh"

namespace sdbench {
namespace {

// naive: the divergent baseline.
// Grid: ceil(B / 128) blocks of 128 threads; thread i scans sequence i serially until the first
// mismatch, so neighbouring threads stop at different times (divergence) and their loads are strided
// by gamma (uncoalesced). Shared memory: none; registers: 19.
constexpr int kNaiveThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kNaiveThreads)
    verify_naive_kernel(const T* __restrict__ draft_tokens, const T* __restrict__ target_tokens,
                        int64_t* __restrict__ accepted_lengths, bool* __restrict__ has_mismatch,
                        T* __restrict__ next_tokens, int64_t batch, int gamma) {
  const int64_t seq = static_cast<int64_t>(blockIdx.x) * kNaiveThreads + threadIdx.x;
  if (seq >= batch) return;
  const T* draft_row = draft_tokens + seq * gamma;
  const T* target_row = target_tokens + seq * (gamma + 1);
  int accepted = 0;
  while (accepted < gamma && draft_row[accepted] == target_row[accepted]) ++accepted;
  dev::write_verdict(seq, accepted, gamma, target_row, accepted_lengths, has_mismatch, next_tokens);
}

// ballot: one warp per sequence.
// Grid: ceil(B / 4) blocks of 4 warps (small blocks spread a small batch over many SMs). Lane j
// compares position j of every 32-position chunk; ceil(gamma/32) ballots whatever the acceptance
// (flat in alpha), loads of 4 chunks in flight; lane 0 writes the three outputs.
// Shared memory: none; registers: 30-32.
constexpr int kBallotWarpsPerBlock = 4;

template <typename T>
__global__ void __launch_bounds__(kBallotWarpsPerBlock * dev::kWarpSize)
    verify_ballot_kernel(const T* __restrict__ draft_tokens, const T* __restrict__ target_tokens,
                         int64_t* __restrict__ accepted_lengths, bool* __restrict__ has_mismatch,
                         T* __restrict__ next_tokens, int64_t batch, int gamma) {
  const int64_t seq = static_cast<int64_t>(blockIdx.x) * kBallotWarpsPerBlock + threadIdx.x / dev::kWarpSize;
  if (seq >= batch) return;  // warp-uniform: the ballots below see full warps
  const int lane = threadIdx.x % dev::kWarpSize;
  const T* target_row = target_tokens + seq * (gamma + 1);
  const int accepted = dev::warp_accepted_length(draft_tokens + seq * gamma, target_row, gamma, lane);
  if (lane == 0) dev::write_verdict(seq, accepted, gamma, target_row, accepted_lengths, has_mismatch, next_tokens);
}

template <typename T>
cudaError_t launch_naive_typed(const void* draft, const void* target, int64_t* accepted_lengths, bool* has_mismatch,
                               void* next_tokens, int64_t batch, int64_t gamma, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((batch + kNaiveThreads - 1) / kNaiveThreads);
  verify_naive_kernel<T><<<blocks, kNaiveThreads, 0, stream>>>(
      static_cast<const T*>(draft), static_cast<const T*>(target), accepted_lengths, has_mismatch,
      static_cast<T*>(next_tokens), batch, static_cast<int>(gamma));
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ballot_typed(const void* draft, const void* target, int64_t* accepted_lengths, bool* has_mismatch,
                                void* next_tokens, int64_t batch, int64_t gamma, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((batch + kBallotWarpsPerBlock - 1) / kBallotWarpsPerBlock);
  verify_ballot_kernel<T><<<blocks, kBallotWarpsPerBlock * dev::kWarpSize, 0, stream>>>(
      static_cast<const T*>(draft), static_cast<const T*>(target), accepted_lengths, has_mismatch,
      static_cast<T*>(next_tokens), batch, static_cast<int>(gamma));
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_verify_naive(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, int64_t batch,
                                int64_t gamma, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return token_type == TokenType::kInt64
             ? launch_naive_typed<int64_t>(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens,
                                           batch, gamma, stream)
             : launch_naive_typed<int32_t>(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens,
                                           batch, gamma, stream);
}

cudaError_t launch_verify_ballot(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                 int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, int64_t batch,
                                 int64_t gamma, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  return token_type == TokenType::kInt64
             ? launch_ballot_typed<int64_t>(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens,
                                            batch, gamma, stream)
             : launch_ballot_typed<int32_t>(draft_tokens, target_tokens, accepted_lengths, has_mismatch, next_tokens,
                                            batch, gamma, stream);
}

}  // namespace sdbench
