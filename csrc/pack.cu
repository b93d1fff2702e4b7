// Packing kernels: copy the first k_i KV rows of every sequence into one [sum k, kv_dim] buffer.
// Rows are moved as raw bytes (row_bytes = kv_dim * 2 for fp16/bf16): packing is a bit copy.
#include "common.cuh"

namespace sdbench {
namespace {

// pack_naive: the published stand-alone packer, kept to document why it lost.
// Grid: B blocks of 256 threads, block i copies sequence i's k_i * kv_dim elements one 16-bit
// element per thread step (2-byte transactions, a quarter of a 16-byte vector's bandwidth per
// instruction), to offsets the host computed (cumsum launched, total read back: a host sync).
// Shared memory: none; registers: 32.
constexpr int kNaivePackThreads = 256;

__global__ void __launch_bounds__(kNaivePackThreads)
    pack_naive_kernel(const uint16_t* __restrict__ draft_kv, const int64_t* __restrict__ accepted_lengths,
                      const int64_t* __restrict__ packed_offsets, uint16_t* __restrict__ packed_kv, int64_t gamma,
                      int64_t row_elems) {
  const int64_t seq = blockIdx.x;
  const int64_t accepted = min(max(accepted_lengths[seq], int64_t{0}), gamma);
  const int64_t count = accepted * row_elems;
  const uint16_t* src = draft_kv + seq * gamma * row_elems;
  uint16_t* dst = packed_kv + packed_offsets[seq] * row_elems;
  for (int64_t i = threadIdx.x; i < count; i += kNaivePackThreads) dst[i] = src[i];
}

// pack, replicated driver (B <= kReplicatedMaxBatch): see dev::replicated_pack in common.cuh.
// Grid: min(SMs, B*gamma*row_bytes / 16 KiB) blocks of 1024 threads; every block loads the B
// lengths (8*B bytes, L2 hits after the first block), scans them in shared memory (4*B bytes) and
// copies an equal share of the accepted bytes with 16-byte vectors.
__global__ void __launch_bounds__(kReplicatedThreads, kReplicatedBlocksPerSm)
    pack_replicated_kernel(dev::GivenLengths lengths, const char* __restrict__ draft_kv, char* __restrict__ packed_kv,
                           int64_t* __restrict__ packed_offsets, int64_t batch, int64_t gamma, int64_t row_bytes,
                           bool aligned16) {
  dev::replicated_pack<dev::GivenLengths, kReplicatedThreads>(lengths, draft_kv, packed_kv, packed_offsets, batch,
                                                              gamma, row_bytes, aligned16);
}

// pack, cooperative driver (B > kReplicatedMaxBatch): see dev::cooperative_pack in common.cuh.
// Grid: one block of 512 threads per SM (always co-resident). Shared memory: 128 B; registers: 64.
__global__ void __launch_bounds__(kCooperativeThreads)
    pack_cooperative_kernel(dev::GivenLengths lengths, const char* __restrict__ draft_kv, char* __restrict__ packed_kv,
                            int64_t* packed_offsets, int64_t* workspace, int64_t batch, int64_t gamma,
                            int64_t row_bytes, bool aligned16) {
  dev::cooperative_pack<dev::GivenLengths, kCooperativeThreads>(lengths, draft_kv, packed_kv, packed_offsets, workspace,
                                                                batch, gamma, row_bytes, aligned16);
}

bool pack_is_replicated(int64_t batch) { return batch <= kReplicatedMaxBatch; }

int pack_cooperative_grid() {
  return cooperative_grid_size(reinterpret_cast<const void*>(&pack_cooperative_kernel), kCooperativeThreads,
                               kCooperativeBlocksPerSm);
}

}  // namespace

cudaError_t launch_pack_naive(const void* draft_kv, const int64_t* accepted_lengths, const int64_t* packed_offsets,
                              void* packed_kv, int64_t batch, int64_t gamma, int64_t row_bytes, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  pack_naive_kernel<<<static_cast<unsigned>(batch), kNaivePackThreads, 0, stream>>>(
      static_cast<const uint16_t*>(draft_kv), accepted_lengths, packed_offsets, static_cast<uint16_t*>(packed_kv),
      gamma, row_bytes / 2);
  return cudaGetLastError();
}

int64_t pack_workspace_elems(int64_t batch, int64_t, int64_t) {
  return pack_is_replicated(batch) ? 0 : pack_cooperative_grid();
}

cudaError_t launch_pack(const void* draft_kv, const int64_t* accepted_lengths, void* packed_kv,
                        int64_t* packed_offsets, int32_t* error_flags, int64_t batch, int64_t gamma, int64_t row_bytes,
                        int64_t* workspace, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  dev::GivenLengths lengths{accepted_lengths, error_flags};
  const auto* src = static_cast<const char*>(draft_kv);
  auto* dst = static_cast<char*>(packed_kv);
  bool aligned16 = is_aligned16(draft_kv, packed_kv, row_bytes);
  if (pack_is_replicated(batch)) {
    const int grid = replicated_grid_size(batch * gamma * row_bytes);
    const size_t shared_bytes = static_cast<size_t>(batch) * sizeof(int);
    pack_replicated_kernel<<<grid, kReplicatedThreads, shared_bytes, stream>>>(lengths, src, dst, packed_offsets, batch,
                                                                              gamma, row_bytes, aligned16);
    return cudaGetLastError();
  }
  void* args[] = {&lengths, &src, &dst, &packed_offsets, &workspace, &batch, &gamma, &row_bytes, &aligned16};
  return launch_cooperative(reinterpret_cast<const void*>(&pack_cooperative_kernel), pack_cooperative_grid(),
                            kCooperativeThreads, args, stream);
}

}  // namespace sdbench
