// Shared pieces of the sdbench CUDA kernels. Pure CUDA: no torch, ATen or c10 header may appear in
// csrc/*.cu (CI compiles them with nvcc against a CPU torch whose CUDA headers do not compile).
//
// Two halves:
//   1. the launcher API (host code, visible to bindings.cpp, which is compiled by the host compiler):
//      raw pointers, sizes and a cudaStream_t in, a cudaError_t out;
//   2. device helpers (only under __CUDACC__): warp-ballot verification, block scans, the
//      alignment-aware cooperative byte copy, and the two pack drivers shared by `pack` and `fused`.
//
// Conventions every kernel follows (they match sdbench/reference.py):
//   draft_tokens [B, gamma] and target_tokens [B, gamma+1], contiguous, int64 or int32;
//   accepted_lengths int64 [B]; has_mismatch bool [B]; next_tokens [B] in the token dtype;
//   draft_kv [B, gamma, kv_dim] contiguous 16-bit elements, handled as raw bytes (packing is a bit
//   copy, so fp16 and bf16 share one instantiation): row_bytes = kv_dim * 2;
//   packed_kv rows [0, sum k) in sequence order; packed_offsets int64 [B], exclusive prefix sum;
//   error_flags int32 [B] (optional: nullptr = not written), kLengthOutOfRange where a given length
//   is outside [0, gamma] (the length is clamped; sdbench/ops/input_contract.py holds the rule).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace sdbench {

enum class TokenType : int { kInt64 = 0, kInt32 = 1 };

// ---- tuning constants (measured trade-offs are in docs/perf-notes.md) -------------------------------
// Replicated driver: one block of 32 warps per SM (64 registers a thread fill the register file), so
// at B <= 32 each warp re-verifies one sequence and the re-verification is paid once per SM.
constexpr int kReplicatedThreads = 1024;
constexpr int kReplicatedBlocksPerSm = 1;
// Cooperative driver: 16 warps per block, one block per SM: a grid that is always co-resident and
// few per-block sums to exchange (64 registers would allow two; one already moves ~80% of copy
// bandwidth at b=4096).
constexpr int kCooperativeThreads = 512;
constexpr int kCooperativeBlocksPerSm = 1;
// A replicated-scan block is worth launching only when it has at least this many output bytes.
constexpr int64_t kMinSliceBytes = 16 * 1024;
// `fused` re-verifies every sequence in every block ("replicated") while that costs a block at most
// this many bytes of token reads (L2 hits after the first block); beyond it, a cooperative grid
// verifies each sequence once and exchanges per-block sums through two grid barriers.
constexpr int64_t kReplicatedMaxTokenBytes = 160 * 1024;
// `pack` keeps every block's copy of the B lengths (int64 reads) and its scan in shared memory up to
// this batch; beyond it the cooperative driver takes over.
constexpr int64_t kReplicatedMaxBatch = 4096;
// 16-byte loads each thread keeps in flight in the aligned copy: 1024 threads * 7 * 16 B = 112 KiB
// per block per memory round trip (a block's share at b=32, gamma=128, kv_dim=2048 is ~114 KiB).
// 8 would cover it in one trip but spills 32 bytes at the replicated kernel's 64-register cap.
constexpr int kCopyUnroll = 7;
// Bits of error_flags: sdbench/ops/input_contract.py (LENGTH_OUT_OF_RANGE).
constexpr int32_t kLengthOutOfRange = 2;

// ---- launchers ----------------------------------------------------------------------------------
// Each returns the launch's error (cudaGetLastError) and never synchronizes.

cudaError_t launch_empty(cudaStream_t stream);

cudaError_t launch_verify_naive(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, int64_t batch,
                                int64_t gamma, cudaStream_t stream);

cudaError_t launch_verify_ballot(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                 int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens, int64_t batch,
                                 int64_t gamma, cudaStream_t stream);

// The published packer: offsets come from the host side (cumsum launched by the caller, total read
// back with a sync); one block of 256 threads per sequence, one 16-bit element per thread step.
cudaError_t launch_pack_naive(const void* draft_kv, const int64_t* accepted_lengths, const int64_t* packed_offsets,
                              void* packed_kv, int64_t batch, int64_t gamma, int64_t row_bytes, cudaStream_t stream);

// int64 workspace elements `launch_pack` needs (0 on the replicated path). The workspace is scratch:
// written before it is read in every launch, so it never needs resetting.
int64_t pack_workspace_elems(int64_t batch, int64_t gamma, int64_t row_bytes);
cudaError_t launch_pack(const void* draft_kv, const int64_t* accepted_lengths, void* packed_kv,
                        int64_t* packed_offsets, int32_t* error_flags, int64_t batch, int64_t gamma, int64_t row_bytes,
                        int64_t* workspace, cudaStream_t stream);

// Requires batch <= 32.
cudaError_t launch_fused_single_block(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                      const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch,
                                      void* next_tokens, void* packed_kv, int64_t* packed_offsets, int64_t batch,
                                      int64_t gamma, int64_t row_bytes, cudaStream_t stream);

int64_t fused_workspace_elems(TokenType token_type, int64_t batch, int64_t gamma);
cudaError_t launch_fused(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                         const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                         void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma, int64_t row_bytes,
                         int64_t* workspace, cudaStream_t stream);

// Host helpers (misc.cu): multiprocessor count of the current device, cached per device.
int current_device_sm_count();
// Blocks of `kernel` (threads per block, no dynamic shared memory) that fit on the whole current
// device at once, capped at `max_per_sm` per SM: the largest legal cooperative grid.
int cooperative_grid_size(const void* kernel, int threads, int max_per_sm);

}  // namespace sdbench

#if defined(__CUDACC__)
#include <cooperative_groups.h>

namespace sdbench {
namespace dev {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpSize = 32;

__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- verification ---------------------------------------------------------------------------------
// k = index of the first position where draft != target (gamma when none), found by one warp:
// lane j compares position j of each 32-position chunk and one __ballot_sync per chunk says which
// lanes saw a mismatch; __ffs of the first non-zero ballot is the answer. Every chunk is checked
// whatever the answer (no early exit), so the time is ceil(gamma/32) ballots, flat in alpha, and the
// loads of four chunks are issued before the first ballot so their latencies overlap.
template <typename T>
__device__ __forceinline__ int warp_accepted_length(const T* __restrict__ draft_row, const T* __restrict__ target_row,
                                                    int gamma, int lane) {
  constexpr int kChunksInFlight = 4;
  int accepted = gamma;
  for (int base = 0; base < gamma; base += kChunksInFlight * kWarpSize) {
    bool mismatch[kChunksInFlight];
#pragma unroll
    for (int c = 0; c < kChunksInFlight; ++c) {
      const int pos = base + c * kWarpSize + lane;
      mismatch[c] = pos < gamma && __ldg(draft_row + pos) != __ldg(target_row + pos);
    }
#pragma unroll
    for (int c = 0; c < kChunksInFlight; ++c) {
      const unsigned ballot = __ballot_sync(kFullMask, mismatch[c]);
      if (ballot != 0u && accepted == gamma) accepted = base + c * kWarpSize + __ffs(ballot) - 1;
    }
  }
  return accepted;
}

// Writes the three verify outputs of sequence `seq` (one thread).
template <typename T>
__device__ __forceinline__ void write_verdict(int64_t seq, int accepted, int gamma, const T* __restrict__ target_row,
                                              int64_t* accepted_lengths, bool* has_mismatch, T* next_tokens) {
  accepted_lengths[seq] = accepted;
  has_mismatch[seq] = accepted < gamma;
  next_tokens[seq] = target_row[accepted];
}

// ---- block reductions and scans -----------------------------------------------------------------
__device__ __forceinline__ int64_t warp_inclusive_scan(int64_t value, int lane) {
#pragma unroll
  for (int delta = 1; delta < kWarpSize; delta <<= 1) {
    const int64_t up = __shfl_up_sync(kFullMask, value, delta);
    if (lane >= delta) value += up;
  }
  return value;
}

__device__ __forceinline__ int64_t warp_sum(int64_t value) {
#pragma unroll
  for (int delta = kWarpSize / 2; delta > 0; delta >>= 1) value += __shfl_xor_sync(kFullMask, value, delta);
  return value;
}

// Sum over the block; every thread gets it. `scratch` holds kThreads/32 values.
template <int kThreads>
__device__ __forceinline__ int64_t block_sum(int64_t value, int64_t* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  value = warp_sum(value);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  int64_t total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / kWarpSize; ++w) total += scratch[w];
  return total;
}

// Exclusive scan over the block (thread order); *block_total gets the sum. `scratch`: kThreads/32.
template <int kThreads>
__device__ __forceinline__ int64_t block_exclusive_scan(int64_t value, int64_t* block_total, int64_t* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t inclusive = warp_inclusive_scan(value, lane);
  __syncthreads();
  if (lane == kWarpSize - 1) scratch[warp] = inclusive;
  __syncthreads();
  int64_t before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kThreads / kWarpSize; ++w) {
    before += w < warp ? scratch[w] : 0;
    total += scratch[w];
  }
  *block_total = total;
  return before + inclusive - value;
}

// In-place inclusive scan of n ints in shared memory: each thread sums a contiguous run of
// ceil(n/kThreads) values, the run totals are scanned across the block, then each run is rewritten.
template <int kThreads>
__device__ void block_inclusive_scan_shared(int* data, int n, int64_t* scratch) {
  const int per_thread = static_cast<int>(ceil_div(n, kThreads));
  const int begin = min(static_cast<int>(threadIdx.x) * per_thread, n);
  const int end = min(begin + per_thread, n);
  int run = 0;
  for (int i = begin; i < end; ++i) run += data[i];
  int64_t total;
  int running = static_cast<int>(block_exclusive_scan<kThreads>(run, &total, scratch));
  for (int i = begin; i < end; ++i) {
    running += data[i];
    data[i] = running;
  }
  __syncthreads();
}

// ---- cooperative byte copy ----------------------------------------------------------------------
// Copies n bytes; threads tid, tid+nthreads, ... of a group share the work. Every address and length
// is even (16-bit KV elements). Source and destination are equally aligned modulo sizeof(V): a head
// of 16-bit words brings the destination to V alignment, the body moves V-sized words (16-byte
// vectors on the common path), four loads in flight per thread before the first store, and a tail
// of 16-bit words finishes.
template <typename V>
__device__ __forceinline__ void copy_words(char* __restrict__ dst, const char* __restrict__ src, int64_t n, int tid,
                                           int nthreads) {
  constexpr int64_t kWord = sizeof(V);
  const int64_t misalign = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst) % kWord);
  const int64_t head = min(n, (kWord - misalign) % kWord);
  const int64_t body = (n - head) / kWord;
  const int64_t tail_begin = head + body * kWord;
  const auto* src16 = reinterpret_cast<const uint16_t*>(src);
  auto* dst16 = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = tid; 2 * i < head; i += nthreads) dst16[i] = __ldg(src16 + i);
  for (int64_t i = tail_begin / 2 + (nthreads - 1 - tid); 2 * i < n; i += nthreads) dst16[i] = __ldg(src16 + i);

  const V* src_words = reinterpret_cast<const V*>(src + head);
  V* dst_words = reinterpret_cast<V*>(dst + head);
  constexpr int kUnroll = 4;
  const int64_t stride = nthreads;
  // Guarded loads instead of a remainder loop: a remainder iteration would wait one full memory
  // latency per word.
  for (int64_t i = tid; i < body; i += kUnroll * stride) {
    V word[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < body) word[u] = __ldg(src_words + i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * stride < body) dst_words[i + u * stride] = word[u];
    }
  }
}

__device__ __forceinline__ void copy_bytes(char* dst, const char* src, int64_t n, int tid, int nthreads) {
  const uintptr_t relative = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  if ((relative & 15u) == 0u) {
    copy_words<uint4>(dst, src, n, tid, nthreads);
  } else if ((relative & 7u) == 0u) {
    copy_words<uint2>(dst, src, n, tid, nthreads);
  } else if ((relative & 3u) == 0u) {
    copy_words<uint32_t>(dst, src, n, tid, nthreads);
  } else {
    copy_words<uint16_t>(dst, src, n, tid, nthreads);
  }
}

// Copies bytes [lo, hi) of the packed output, which may span several sequences: sequence s owns
// packed rows [rows.begin(s), rows.end(s)) and its source rows start at s * gamma. The first sequence
// is found by binary search on rows.end (non-decreasing); every thread of the block runs the same
// loop, so there is no divergence between the block's threads.
template <typename Rows>
__device__ void copy_packed_slice(const Rows& rows, int64_t batch, int64_t gamma, int64_t row_bytes,
                                  const char* __restrict__ draft_kv, char* __restrict__ packed_kv, int64_t lo,
                                  int64_t hi) {
  int64_t left = 0, right = batch - 1;
  while (left < right) {
    const int64_t mid = (left + right) / 2;
    if (rows.end(mid) * row_bytes > lo) right = mid; else left = mid + 1;
  }
  for (int64_t seq = left; seq < batch; ++seq) {
    const int64_t seq_lo = rows.begin(seq) * row_bytes;
    if (seq_lo >= hi) break;
    const int64_t from = max(lo, seq_lo);
    const int64_t to = min(hi, rows.end(seq) * row_bytes);
    if (from < to) {
      copy_bytes(packed_kv + from, draft_kv + seq * gamma * row_bytes + (from - seq_lo), to - from,
                 threadIdx.x, blockDim.x);
    }
  }
}

// The common case, every sequence's range 16-byte co-aligned (row_bytes % 16 == 0, 16-byte aligned
// tensors): the slice [lo, hi) is one flat run of 16-byte vectors. Thread t moves vectors
// lo/16 + t + j*blockDim, kUnroll loads in flight before the first store, so a block's whole slice
// (up to kUnroll * 16 KiB) costs one memory latency instead of one per sequence it touches; each
// vector's sequence is found by walking forward from one binary search (no division).
template <int kUnroll, typename Rows>
__device__ void copy_packed_slice_aligned(const Rows& rows, int64_t batch, int64_t gamma, int64_t row_bytes,
                                          const char* __restrict__ draft_kv, char* __restrict__ packed_kv,
                                          int64_t lo, int64_t hi) {
  const int64_t stride = blockDim.x, last = hi / 16;
  int64_t vector = lo / 16 + threadIdx.x;
  if (vector >= last) return;
  int64_t left = 0, right = batch - 1;
  while (left < right) {
    const int64_t mid = (left + right) / 2;
    if (rows.end(mid) * row_bytes > vector * 16) right = mid; else left = mid + 1;
  }
  int64_t seq = left;
  int64_t seq_lo = rows.begin(seq) * row_bytes, seq_hi = rows.end(seq) * row_bytes;
  auto* out = reinterpret_cast<uint4*>(packed_kv);
  for (; vector < last; vector += kUnroll * stride) {
    uint4 word[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t offset = (vector + u * stride) * 16;
      if (offset < hi) {
        while (offset >= seq_hi) {
          ++seq;
          seq_lo = seq_hi;  // begin(seq + 1) == end(seq)
          seq_hi = rows.end(seq) * row_bytes;
        }
        word[u] = __ldg(reinterpret_cast<const uint4*>(draft_kv + seq * gamma * row_bytes + (offset - seq_lo)));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if ((vector + u * stride) * 16 < hi) out[vector + u * stride] = word[u];
    }
  }
}

template <typename Rows>
__device__ __forceinline__ void copy_slice(const Rows& rows, int64_t batch, int64_t gamma, int64_t row_bytes,
                                           bool aligned16, const char* __restrict__ draft_kv,
                                           char* __restrict__ packed_kv, int64_t lo, int64_t hi) {
  if (aligned16) {
    copy_packed_slice_aligned<kCopyUnroll>(rows, batch, gamma, row_bytes, draft_kv, packed_kv, lo, hi);
  } else {
    copy_packed_slice(rows, batch, gamma, row_bytes, draft_kv, packed_kv, lo, hi);
  }
}

// Every block's output slice: equal shares of the bytes actually accepted, 16-byte aligned starts.
__device__ __forceinline__ int64_t slice_bytes_for(int64_t total_bytes) {
  return ceil_div(ceil_div(total_bytes, gridDim.x), 16) * 16;
}

// ---- length sources ---------------------------------------------------------------------------------
// The two pack drivers below are shared by `pack` (lengths given) and `fused` (lengths found by warp
// ballots). A source provides:
//   fill_shared(s_len, batch, gamma, writer): every block's copy of all B lengths (writer: block 0
//       also writes the verify outputs);
//   produce(lo, hi, gamma): the lengths of sequences [lo, hi) (fused: verified once, outputs
//       written), returning this thread's partial sum;
//   length(seq): read a length back after produce (grid-synchronised).

struct GivenLengths {
  const int64_t* accepted_lengths;  // caller's k_i, clamped to [0, gamma] so a bad input cannot read out of bounds
  int32_t* error_flags;             // [B] or nullptr: kLengthOutOfRange where k_i was clamped

  // Written once per sequence, next to its packed offset.
  __device__ __forceinline__ void flag(int64_t seq, int64_t gamma) const {
    if (error_flags != nullptr) {
      const int64_t given = accepted_lengths[seq];
      error_flags[seq] = (given < 0 || given > gamma) ? kLengthOutOfRange : 0;
    }
  }

  __device__ __forceinline__ int64_t length(int64_t seq, int64_t gamma) const {
    return min(max(accepted_lengths[seq], int64_t{0}), gamma);
  }
  __device__ void fill_shared(int* s_len, int64_t batch, int64_t gamma, bool) const {
    for (int64_t seq = threadIdx.x; seq < batch; seq += blockDim.x) s_len[seq] = static_cast<int>(length(seq, gamma));
  }
  __device__ int64_t produce(int64_t lo, int64_t hi, int64_t gamma) const {
    int64_t partial = 0;
    for (int64_t seq = lo + threadIdx.x; seq < hi; seq += blockDim.x) partial += length(seq, gamma);
    return partial;
  }
};

template <typename T>
struct BallotLengths {
  const T* draft_tokens;
  const T* target_tokens;
  int64_t* accepted_lengths;  // written in this launch, read back after a grid barrier: no __ldg
  bool* has_mismatch;
  T* next_tokens;

  __device__ __forceinline__ int verify(int64_t seq, int64_t gamma, int lane) const {
    return warp_accepted_length(draft_tokens + seq * gamma, target_tokens + seq * (gamma + 1),
                                static_cast<int>(gamma), lane);
  }
  __device__ __forceinline__ int64_t length(int64_t seq, int64_t) const { return accepted_lengths[seq]; }
  __device__ __forceinline__ void flag(int64_t, int64_t) const {}  // verified lengths are in [0, gamma]
  __device__ void fill_shared(int* s_len, int64_t batch, int64_t gamma, bool writer) const {
    const int lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
    for (int64_t seq = threadIdx.x / kWarpSize; seq < batch; seq += warps) {
      const int accepted = verify(seq, gamma, lane);
      if (lane == 0) {
        s_len[seq] = accepted;
        if (writer) {
          write_verdict(seq, accepted, static_cast<int>(gamma), target_tokens + seq * (gamma + 1), accepted_lengths,
                        has_mismatch, next_tokens);
        }
      }
    }
  }
  __device__ int64_t produce(int64_t lo, int64_t hi, int64_t gamma) const {
    const int lane = threadIdx.x % kWarpSize, warps = blockDim.x / kWarpSize;
    int64_t partial = 0;
    for (int64_t seq = lo + threadIdx.x / kWarpSize; seq < hi; seq += warps) {
      const int accepted = verify(seq, gamma, lane);
      if (lane == 0) {
        write_verdict(seq, accepted, static_cast<int>(gamma), target_tokens + seq * (gamma + 1), accepted_lengths,
                      has_mismatch, next_tokens);
        partial += accepted;
      }
    }
    return partial;
  }
};

// ---- driver 1: replicated scan -----------------------------------------------------------------------
// Grid: G = min(SMs, max bytes / 16 KiB) blocks of kThreads = 1024 (1-D). Each block obtains all B
// lengths into shared memory (pack: loads them; fused: re-verifies every sequence with warp ballots),
// scans them in place, then copies its equal share of the accepted bytes (binary search for the first
// sequence, 16-byte vectors). No block waits on another: nothing to reset, graph-capturable. Block 0
// also writes packed_offsets (and, for fused, the verify outputs).
// Shared memory: 4 * B bytes dynamic (B <= 4096: 16 KiB) + 256 B; registers: 64 (ptxas report).
struct SharedRows {
  const int* s_end;  // inclusive prefix sums of the lengths
  __device__ __forceinline__ int64_t begin(int64_t seq) const { return seq == 0 ? 0 : s_end[seq - 1]; }
  __device__ __forceinline__ int64_t end(int64_t seq) const { return s_end[seq]; }
};

template <typename Lengths, int kThreads>
__device__ __forceinline__ void replicated_pack(const Lengths& lengths, const char* __restrict__ draft_kv,
                                                char* __restrict__ packed_kv, int64_t* __restrict__ packed_offsets,
                                                int64_t batch, int64_t gamma, int64_t row_bytes, bool aligned16) {
  extern __shared__ int s_end[];
  __shared__ int64_t s_scratch[kThreads / kWarpSize];
  lengths.fill_shared(s_end, batch, gamma, blockIdx.x == 0);
  __syncthreads();
  block_inclusive_scan_shared<kThreads>(s_end, static_cast<int>(batch), s_scratch);
  const SharedRows rows{s_end};
  if (blockIdx.x == 0) {
    for (int64_t seq = threadIdx.x; seq < batch; seq += kThreads) {
      packed_offsets[seq] = rows.begin(seq);
      lengths.flag(seq, gamma);
    }
  }
  const int64_t total_bytes = static_cast<int64_t>(s_end[batch - 1]) * row_bytes;
  const int64_t slice = slice_bytes_for(total_bytes);
  const int64_t lo = blockIdx.x * slice;
  const int64_t hi = min(lo + slice, total_bytes);
  if (lo < hi) copy_slice(rows, batch, gamma, row_bytes, aligned16, draft_kv, packed_kv, lo, hi);
}

// ---- driver 2: cooperative grid -------------------------------------------------------------------
// Grid: the largest co-resident grid (one block of kThreads = 512 per SM), launched cooperatively.
// Phase 1: block j produces the lengths of its contiguous range of sequences (fused: each verified
//   once, by one warp) and writes their sum to workspace[j].
// Phase 2 (after grid.sync): block j adds the sums of blocks < j and scans its own range into
//   packed_offsets.
// Phase 3 (after grid.sync): every block copies its equal share of the accepted bytes, finding its
//   first sequence by binary search over packed_offsets.
// The workspace is written before it is read in every launch (no reset); the grid barrier is the
// driver's. Shared memory: 128 B static; registers: 64 (ptxas report). Used when B or B*gamma is too
// large to replicate.
template <typename Lengths>
struct GlobalRows {
  const int64_t* packed_offsets;  // written earlier in this launch: plain loads, not __ldg
  Lengths lengths;
  int64_t gamma;
  __device__ __forceinline__ int64_t begin(int64_t seq) const { return packed_offsets[seq]; }
  __device__ __forceinline__ int64_t end(int64_t seq) const { return packed_offsets[seq] + lengths.length(seq, gamma); }
};

template <typename Lengths, int kThreads>
__device__ __forceinline__ void cooperative_pack(const Lengths& lengths, const char* __restrict__ draft_kv,
                                                 char* __restrict__ packed_kv, int64_t* packed_offsets,
                                                 int64_t* workspace, int64_t batch, int64_t gamma,
                                                 int64_t row_bytes, bool aligned16) {
  namespace cg = cooperative_groups;
  __shared__ int64_t s_scratch[kThreads / kWarpSize];
  const int64_t blocks = gridDim.x, block = blockIdx.x;
  const int64_t lo = block * batch / blocks, hi = (block + 1) * batch / blocks;

  const int64_t block_total = block_sum<kThreads>(lengths.produce(lo, hi, gamma), s_scratch);
  if (threadIdx.x == 0) workspace[block] = block_total;
  cg::this_grid().sync();

  int64_t before = 0, all = 0;
  for (int64_t other = threadIdx.x; other < blocks; other += kThreads) {
    const int64_t sum = workspace[other];
    all += sum;
    before += other < block ? sum : 0;
  }
  before = block_sum<kThreads>(before, s_scratch);
  all = block_sum<kThreads>(all, s_scratch);
  for (int64_t base = lo; base < hi; base += kThreads) {
    const int64_t seq = base + threadIdx.x;
    const int64_t length = seq < hi ? lengths.length(seq, gamma) : 0;
    int64_t chunk_total;
    const int64_t exclusive = block_exclusive_scan<kThreads>(length, &chunk_total, s_scratch);
    if (seq < hi) {
      packed_offsets[seq] = before + exclusive;
      lengths.flag(seq, gamma);
    }
    before += chunk_total;
  }
  cg::this_grid().sync();

  const int64_t total_bytes = all * row_bytes;
  const int64_t slice = slice_bytes_for(total_bytes);
  const int64_t slice_lo = block * slice;
  const int64_t slice_hi = min(slice_lo + slice, total_bytes);
  if (slice_lo < slice_hi) {
    const GlobalRows<Lengths> rows{packed_offsets, lengths, gamma};
    copy_slice(rows, batch, gamma, row_bytes, aligned16, draft_kv, packed_kv, slice_lo, slice_hi);
  }
}

}  // namespace dev

// Host side of the replicated driver: blocks worth launching for at most max_bytes of output.
inline int replicated_grid_size(int64_t max_bytes) {
  const int64_t cap = static_cast<int64_t>(kReplicatedBlocksPerSm) * current_device_sm_count();
  const int64_t wanted = (max_bytes + kMinSliceBytes - 1) / kMinSliceBytes;
  return static_cast<int>(wanted < 1 ? 1 : (wanted > cap ? cap : wanted));
}

// The flat 16-byte copy applies when every sequence's range is co-aligned with its destination.
inline bool is_aligned16(const void* draft_kv, const void* packed_kv, int64_t row_bytes) {
  return row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(draft_kv) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(packed_kv) % 16 == 0;
}

inline cudaError_t launch_cooperative(const void* kernel, int grid, int threads, void** args, cudaStream_t stream) {
  return cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(threads), args, 0, stream);
}

}  // namespace sdbench
#endif  // __CUDACC__
