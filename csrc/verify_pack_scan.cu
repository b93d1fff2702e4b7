// Single-pass verify-and-pack (`fused_scan`, and `fused` above b = 16) and pack (`pack_scan`): one launch,
// no grid barrier, no reset launch, at every batch size. Design, predictions and measurements:
// docs/perf-notes.md ("Single-pass scan", then "Tiles of one wave" for the tile rule and the epoch).
//
// Grid: one block of kThreads = 256 threads per tile. A tile is `seqs_per_tile` consecutive sequences
// (small slabs) or one of `chunks_per_seq` chunks of one sequence (large slabs: the sequence's accepted
// bytes are split evenly over its chunk blocks, at least one copy round each, see chunk_of_accepted), sized
// by tile_shape so the grid is about one wave of resident blocks, each tile 8-256 KiB of worst-case KV (more
// waves at large work), so b=1 and b=65,536 both fill the GPU.
// Block i handles tile i (unless the launch takes tiles in pairs, below):
//   1. reads the launch's epoch (the high word of state[0]) while its tokens load;
//   2. finds its sequences' accepted lengths (fused: warp ballots, ceil-pow2(γ) lanes per sequence for
//      γ <= 32, one warp per sequence above; pack: loads them, clamped to [0, γ]) and scans them: in every
//      warp's registers for tiles of at most 32 sequences (one a lane), in shared memory for larger tiles;
//      chunk 0 of a group publishes the group's sum (flag AGGREGATE, or INCLUSIVE for
//      group 0) in its status word, which carries the epoch, so words of earlier launches read as
//      "not yet";
//   3. issues the loads of its accepted KV (kUnroll 16-byte vectors per thread): sources do not depend
//      on the prefix, so they are in flight during the look-back (in one wave, chunks of 64 KiB or more
//      load them after it: kLateLoadBytes);
//   4. the block looks back (Merrill & Garland 2016): thread i reads the status of group g-1-i, and the
//      sum up to the nearest INCLUSIVE word is this group's exclusive prefix; chunk 0 publishes
//      INCLUSIVE. A block waits only on lower tiles, which started no later (blocks are dispatched in
//      index order, as CUB's single-pass scan assumes);
//   5. stores the vectors at prefix * row_bytes + (chunk's first byte) + offset; chunk 0 writes packed_offsets and,
//      fused, the verify outputs;
//   6. counts itself finished in the low word of state[0]; the last block writes epoch + 1 (and kPairBit, below)
//      to the high word and zeroes the count, so the next launch on the stream starts one epoch on, without a
//      reset launch and without the host (CUDA-graph replays advance it on the device).
// Tiles in pairs (docs/perf-notes.md, "Session 45"): in a grid of several waves of tiles at the cap, a launch after
// one that accepted under half its rows (kPairBit, which the last block leaves beside the epoch) has block 2j do
// tiles 2j and 2j + 1 as one, and block 2j + 1 leave: the fixed chain of steps 2-4 is paid once for twice the
// accepted rows. Block 2j publishes both groups' words (step 2) and, after its look-back, INCLUSIVE on the second
// only: the first group's word stays AGGREGATE.
// Status words are one 64-bit value each (epoch:30 | flag:2 | value:32), read and written with
// relaxed 64-bit accesses, so no fence orders them against other data.
// Shared memory: 4 KiB of lengths (kScanMaxTileSeqs ints), 8 KiB of the copy's shift table (kShiftRows ints) + ~230
// bytes; registers: see tests/test_csrc_compile.py.
//
// The state (scan_state_elems() = 1 + kScanMaxGroups int64) is zeroed once by its owner and then reused by every launch in
// stream order; two launches that may overlap (different streams, parallel graph branches) need two
// states. The epoch field of a status word has 30 bits: a stale word could only be mistaken after
// 2^30 launches on one state without that group being written.
#include <cstdint>

#include <cuda_runtime.h>

#include "common.cuh"  // TokenType only; the device helpers below are this file's own

namespace sdbench {

// Mirrored in sdbench/ops/pack/scan_impls.py (SCAN_STATE_ELEMS = 1 + kScanMaxGroups, SCAN_MAX_BATCH).
constexpr int64_t kScanMaxGroups = 65536;  // status words: sequence groups in one launch
constexpr int64_t kScanMaxTileSeqs = 1024;  // sequences per group (shared-memory lengths)
constexpr int64_t kScanMaxBatch = kScanMaxGroups * kScanMaxTileSeqs;

// Host API (declared again in bindings.cpp). scan_state: int64 [scan_state_elems()], zeroed once.
// ScanTiling: the tile rule's knobs (tile_shape below); zero fields take the defaults.
struct ScanTiling {
  int64_t waves = 0;             // blocks aimed at: waves * resident blocks (kBlocksPerSm per SM)
  int64_t max_tile_bytes = 0;    // worst-case KV bytes of one tile, at most
  int64_t look_back_groups = 0;  // sequence groups, at most, where tiles of max_tile_bytes allow
  int64_t min_tile_bytes = 0;    // worst-case KV bytes of one tile, at least (fewer blocks for tiny work)
  int64_t fixed_chunks = 0;      // 1: a sequence's chunks copy fixed byte ranges (the rule before the even split)
  int64_t late_load_bytes = 0;   // in one wave, chunks of this much KV or more load after the look-back
  int64_t scan_mode = 0;         // 1: tiles of <= 32 sequences scan in shared memory too, as before session 33
  int64_t pairs = 0;             // tiles taken in pairs: 0 by the previous launch's acceptance, 1 never, 2 always
};
int64_t scan_state_elems() { return 1 + kScanMaxGroups; }
int64_t scan_max_batch() { return kScanMaxBatch; }
cudaError_t launch_fused_scan(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                              const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                              void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma,
                              int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream);
cudaError_t launch_pack_scan(const void* draft_kv, const int64_t* accepted_lengths, void* packed_kv,
                             int64_t* packed_offsets, int32_t* error_flags, int64_t batch, int64_t gamma,
                             int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream);

namespace scan {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 4;  // 64 registers a thread: four blocks (32 warps) resident per SM
constexpr int kWarps = kThreads / 32;
// 16-byte loads each thread keeps in flight: 256 * 8 * 16 B = 32 KiB per block per memory round trip,
// 128 KiB per SM at four resident blocks (~4 MB over 132 SMs: HBM's bandwidth-latency product).
constexpr int kUnroll = 8;
constexpr int64_t kTileBytes = int64_t{kThreads} * kUnroll * 16;
constexpr unsigned kFullMask = 0xffffffffu;

// Tiles of at most this many sequences (one a lane) scan their lengths in every warp (TileShape::warp_scan).
constexpr int kWarpScanSeqs = 32;
constexpr unsigned kAggregate = 1, kInclusive = 2;
constexpr unsigned kEpochMask = (1u << 30) - 1;
// The high word of state[0]: the launch's epoch in its low 31 bits, and kPairBit, which the previous launch's last
// block sets when that launch accepted under half its rows (finish_block): then this launch takes tiles in pairs.
constexpr unsigned kPairBit = 1u << 31, kEpochBits = kPairBit - 1u;

__device__ __forceinline__ unsigned long long pack_status(unsigned epoch, unsigned flag, unsigned value) {
  return (static_cast<unsigned long long>(epoch & kEpochMask) << 34) | (static_cast<unsigned long long>(flag) << 32) |
         value;
}
__device__ __forceinline__ unsigned status_flag(unsigned long long word) { return (word >> 32) & 3u; }
__device__ __forceinline__ unsigned status_epoch(unsigned long long word) { return static_cast<unsigned>(word >> 34); }
__device__ __forceinline__ unsigned status_value(unsigned long long word) { return static_cast<unsigned>(word); }

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* address) {
  unsigned long long value;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ void store_relaxed(unsigned long long* address, unsigned long long value) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

// floor(n / d) for 0 <= n < 2^31 as (n * magic) >> bits (Granlund and Montgomery 1994, theorem 4.2 with
// N = 31: magic = ceil(2^(31 + l) / d), l = ceil(log2 d), which is below 2^32 for every d < 2^32).
struct RowDivider {
  unsigned magic;
  int bits;
  static RowDivider of(int64_t d) {  // host; d >= 1
    int l = 0;
    while ((int64_t{1} << l) < d) ++l;
    if (l > 31) return RowDivider{0u, 0};  // never used: the table needs fewer than 2^31 units
    const unsigned long long top = 1ull << (31 + l);
    return RowDivider{static_cast<unsigned>((top + static_cast<unsigned long long>(d) - 1) / d), 31 + l};
  }
  __device__ __forceinline__ unsigned operator()(unsigned n) const {
    return static_cast<unsigned>((static_cast<unsigned long long>(n) * magic) >> bits);
  }
};

// A shape's pairing, resolved by tile_shape from ScanTiling::pairs (whose 0 is kByBit where the shape allows).
enum Pairing : int { kNever = 0, kByBit = 1, kAlways = 2 };

struct TileShape {
  int64_t batch, gamma, row_bytes;
  int64_t slab_bytes;   // gamma * row_bytes: one sequence's draft KV
  int64_t chunk_bytes;  // worst-case KV of one chunk (slab_bytes when chunks_per_seq == 1): sizes the grid
  int seqs_per_tile;    // > 1 only when chunks_per_seq == 1
  int chunks_per_seq;
  bool fixed_chunks;    // chunk c copies accepted bytes [c, c + 1) * chunk_bytes, not a 1/chunks_per_seq share
  bool late_loads;      // a chunk loads its first copy round after the look-back, not during it (tile_shape)
  bool warp_scan;       // tiles of <= kWarpScanSeqs sequences: every warp scans the lengths (tile_shape)
  RowDivider row_of;    // a destination unit's row: unit / (row_bytes / sizeof(V)), set at launch (ShiftTable)
  Pairing pairing;      // whether tiles 2j and 2j + 1 are one (tile_shape; ScanTiling::pairs is the knob)
};

// ---- lengths ----------------------------------------------------------------------------------------
// k = first position where draft != target (gamma when none), one warp; see dev::warp_accepted_length.
template <typename T>
__device__ __forceinline__ int warp_accepted_length(const T* __restrict__ draft_row, const T* __restrict__ target_row,
                                                    int gamma, int lane) {
  constexpr int kChunksInFlight = 4;
  int accepted = gamma;
  for (int base = 0; base < gamma; base += kChunksInFlight * 32) {
    bool mismatch[kChunksInFlight];
#pragma unroll
    for (int c = 0; c < kChunksInFlight; ++c) {
      const int pos = base + c * 32 + lane;
      mismatch[c] = pos < gamma && __ldg(draft_row + pos) != __ldg(target_row + pos);
    }
#pragma unroll
    for (int c = 0; c < kChunksInFlight; ++c) {
      const unsigned ballot = __ballot_sync(kFullMask, mismatch[c]);
      if (ballot != 0u && accepted == gamma) accepted = base + c * 32 + __ffs(ballot) - 1;
    }
  }
  return accepted;
}

// fused: verifies sequences [seq0, seq0 + count) into s_len; `writer` also writes the verify outputs.
template <typename T>
struct VerifiedLengths {
  const T* draft_tokens;
  const T* target_tokens;
  int64_t* accepted_lengths;
  bool* has_mismatch;
  T* next_tokens;

  __device__ __forceinline__ void verdict(int64_t seq, int accepted, int gamma) const {
    accepted_lengths[seq] = accepted;
    has_mismatch[seq] = accepted < gamma;
    next_tokens[seq] = target_tokens[seq * (gamma + 1) + accepted];
  }

  __device__ void fill(int* s_len, int64_t seq0, int count, int gamma, bool writer) const {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (gamma <= 32) {
      // ceil-pow2(gamma) lanes per sequence, 32 / width sequences per ballot: at gamma=8 a warp
      // verifies four sequences in one load and one ballot.
      const int width = gamma == 1 ? 1 : 1 << (32 - __clz(gamma - 1));
      const int per_warp = 32 / width, sub = lane / width, pos = lane % width;
      const unsigned segment = width == 32 ? kFullMask : (1u << width) - 1u;
      for (int base = warp * per_warp; base < count; base += kWarps * per_warp) {  // warp-uniform
        const int local = base + sub;
        bool mismatch = false;
        if (local < count && pos < gamma) {
          const int64_t seq = seq0 + local;
          mismatch = __ldg(draft_tokens + seq * gamma + pos) != __ldg(target_tokens + seq * (gamma + 1) + pos);
        }
        const unsigned mine = (__ballot_sync(kFullMask, mismatch) >> (sub * width)) & segment;
        if (local < count && pos == 0) {
          const int accepted = mine != 0u ? __ffs(mine) - 1 : gamma;
          s_len[local] = accepted;
          if (writer) verdict(seq0 + local, accepted, gamma);
        }
      }
    } else {
      for (int local = warp; local < count; local += kWarps) {
        const int64_t seq = seq0 + local;
        const int accepted = warp_accepted_length(draft_tokens + seq * gamma, target_tokens + seq * (gamma + 1),
                                                  gamma, lane);
        if (lane == 0) {
          s_len[local] = accepted;
          if (writer) verdict(seq, accepted, gamma);
        }
      }
    }
  }
};

// pack: the caller's lengths, clamped to [0, gamma] so a bad length cannot read or write out of bounds;
// the writer (chunk 0 of the tile) flags every length it clamped (sdbench/ops/input_contract.py).
constexpr int32_t kLengthOutOfRange = 2;  // mirrors input_contract.LENGTH_OUT_OF_RANGE

struct GivenLengths {
  const int64_t* accepted_lengths;
  int32_t* error_flags;  // [B] or nullptr
  __device__ void fill(int* s_len, int64_t seq0, int count, int gamma, bool writer) const {
    for (int local = threadIdx.x; local < count; local += kThreads) {
      const int64_t length = __ldg(accepted_lengths + seq0 + local);
      const int64_t clamped = min(max(length, int64_t{0}), static_cast<int64_t>(gamma));
      s_len[local] = static_cast<int>(clamped);
      if (writer && error_flags != nullptr) error_flags[seq0 + local] = clamped == length ? 0 : kLengthOutOfRange;
    }
  }
};

// In-place inclusive scan of count <= kScanMaxTileSeqs ints: each thread scans a run of
// ceil(count / kThreads) values, the run totals are scanned across the block. Ends with a barrier.
__device__ void block_inclusive_scan(int* data, int count, int* s_warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int per_thread = (count + kThreads - 1) / kThreads;
  const int begin = min(static_cast<int>(threadIdx.x) * per_thread, count), end = min(begin + per_thread, count);
  int run = 0;
  for (int i = begin; i < end; ++i) run += data[i];
  int inclusive = run;
#pragma unroll
  for (int delta = 1; delta < 32; delta <<= 1) {
    const int up = __shfl_up_sync(kFullMask, inclusive, delta);
    if (lane >= delta) inclusive += up;
  }
  if (lane == 31) s_warp_totals[warp] = inclusive;
  __syncthreads();
  int running = inclusive - run;
  for (int w = 0; w < warp; ++w) running += s_warp_totals[w];
  for (int i = begin; i < end; ++i) {
    running += data[i];
    data[i] = running;
  }
  __syncthreads();
}

// ---- timeline (SDBENCH_SCAN_TIMELINE builds only) ---------------------------------------------------
// csrc/tools/scan_timeline.cu builds this file with SDBENCH_SCAN_TIMELINE to see where a block's time goes;
// the extension never does (every helper below is empty there). Thread 0 of each of the first
// kTimelineBlocks blocks records, per block: [0, 4) the SM clock at kernel entry, at its verdict, after its
// look-back and after its last store is issued; 4 its SM; 5 and 6 the global timer (ns) at the first and
// last marks (it aligns blocks; the SM clock times the phases); 7 the SM clock when the look-back's first
// window was all published; 8 the block's polls that found a word not yet published; 9 the SM clock when
// the look-back started.
#ifdef SDBENCH_SCAN_TIMELINE
constexpr int kTimelineBlocks = 1 << 16, kTimelineSlots = 10;
__device__ unsigned long long g_scan_timeline[kTimelineBlocks * kTimelineSlots];
__device__ __forceinline__ void timeline_clock(int slot) {
  if (threadIdx.x == 0 && blockIdx.x < kTimelineBlocks) g_scan_timeline[blockIdx.x * kTimelineSlots + slot] = clock64();
}
__device__ __forceinline__ void timeline_mark(int mark) {
  timeline_clock(mark);
  if (threadIdx.x == 0 && blockIdx.x < kTimelineBlocks && (mark == 0 || mark == 3)) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    g_scan_timeline[blockIdx.x * kTimelineSlots + (mark == 0 ? 5 : 6)] = now;
    if (mark == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_scan_timeline[blockIdx.x * kTimelineSlots + 4] = sm;
    }
  }
}
__device__ __forceinline__ void timeline_poll() {
  if (blockIdx.x < kTimelineBlocks) atomicAdd(g_scan_timeline + blockIdx.x * kTimelineSlots + 8, 1ull);
}
#else
__device__ __forceinline__ void timeline_clock(int) {}
__device__ __forceinline__ void timeline_mark(int) {}
__device__ __forceinline__ void timeline_poll() {}
#endif

// ---- look-back ----------------------------------------------------------------------------------------
// The whole block looks back, kThreads status words a step: thread i reads group - 1 - i - kThreads*j;
// the sum up to the nearest INCLUSIVE word (groups before 0 count as an INCLUSIVE zero) is the group's
// exclusive prefix. A window of 256 groups, not a warp's 32, because at launch every block looks back
// at once and the INCLUSIVE words appear one window at a time: group g waits ~g / window steps, each an
// L2 round trip (one warp made group 255 of b = 256 walk 8 of them). Every earlier group's block has
// started (index order), and publishes its AGGREGATE before it waits on anything (in a paired launch, block 2j
// publishes groups 2j and 2j + 1's, and block 2j + 1 leaves), so the spin ends.
// Returns the same prefix to every thread; ends with a barrier.
struct LookBackScratch {
  int first_inclusive[kWarps];
  long long sum[kWarps];
};

__device__ int64_t look_back(const unsigned long long* status, int64_t group, unsigned epoch, LookBackScratch& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int64_t prefix = 0;
  timeline_clock(9);
  for (int64_t newest = group - 1;; newest -= kThreads) {
    const int64_t other = newest - static_cast<int64_t>(threadIdx.x);
    unsigned long long word = 0;
    if (other >= 0) {
      for (;;) {
        word = load_relaxed(status + other);
        if (status_flag(word) != 0u && status_epoch(word) == (epoch & kEpochMask)) break;
        timeline_poll();
        __nanosleep(32);
      }
    }
    const bool inclusive = other < 0 || status_flag(word) == kInclusive;
    const unsigned inclusive_lanes = __ballot_sync(kFullMask, inclusive);
    long long value = other >= 0 ? static_cast<long long>(status_value(word)) : 0;
    if (lane == 0) s.first_inclusive[warp] = inclusive_lanes != 0u ? warp * 32 + __ffs(inclusive_lanes) - 1 : kThreads;
    __syncthreads();
    int nearest = kThreads;  // the nearest INCLUSIVE word's thread (kThreads: none in this window)
#pragma unroll
    for (int w = 0; w < kWarps; ++w) nearest = min(nearest, s.first_inclusive[w]);
    if (newest == group - 1) timeline_clock(7);
    if (static_cast<int>(threadIdx.x) > nearest) value = 0;
#pragma unroll
    for (int delta = 16; delta > 0; delta >>= 1) value += __shfl_xor_sync(kFullMask, value, delta);
    if (lane == 0) s.sum[warp] = value;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) prefix += s.sum[w];
    __syncthreads();  // s is reused by the next step
    if (nearest < kThreads) return prefix;
  }
}

// ---- the copy -----------------------------------------------------------------------------------------
// The block's bytes are one flat run of units [0, tile_units) (units: V, 16 bytes where alignment allows)
// whose destination is contiguous: a chunk of one sequence (seqs_per_tile == 1), or the accepted rows of its
// sequences back to back. Counted from the tile's first source unit (first_seq's slab, plus the chunk's first
// byte), a unit's source is
//     unit + shift(r) * row_units,    r = the unit's row in the destination,
// with shift(r) = s * gamma - (rows accepted before s in the tile), s the sequence whose row r is: constant over a
// sequence's rows. A unit finds it one of four ways (a Source below), chosen per block:
//   - OneSequence (chunks, one-sequence tiles): shift 0, the source is the unit;
//   - SearchRowEnds (2-4 sequences): a binary search of one or two steps over the scanned row ends, 32-bit;
//   - ShiftTable (more sequences, up to kShiftRows accepted rows): shift per row in shared memory, filled after the
//     scan, and the row by one multiply-high (RowDivider): a dozen instructions a unit;
//   - SearchUnitEnds (more rows, or 2^31 units or more): a binary search per unit over the sequences' unit ends.
// Until session 14 every multi-sequence tile searched, in 64-bit byte arithmetic: ~60 SASS instructions a unit,
// issued by 32 warps an SM in step, 1-1.5 us of a 5-8 MB launch between the verdict and the look-back
// (docs/perf-notes.md, sessions 13 and 14). One-sequence tiles never entered that search, but its code beside
// their loads cost them too: 32:8:0.3:4096 (chunks of one sequence) 4.5 -> 4.1 us warm with a path of their own.
constexpr int kShiftRows = 2048;  // 8 KiB of shared memory: tiles of up to 256 KiB of 128-byte rows
static_assert(kShiftRows * sizeof(int) >= kScanMaxTileSeqs * sizeof(int64_t), "the search's unit ends fit the table");
constexpr int kSearchMaxSeqs = 4;  // tiles of 2-4 sequences search: 1-2 steps, cheaper than filling the table

struct OneSequence {
  __device__ __forceinline__ int64_t operator()(int64_t unit) const { return unit; }
};

struct ShiftTable {  // for tiles of fewer than 2^31 units, so 32-bit row arithmetic
  const int* s_shift;  // [accepted rows of the tile]: source row - destination row
  RowDivider row_of;
  int row_units;
  __device__ __forceinline__ int64_t operator()(int64_t unit) const {
    return unit + static_cast<int64_t>(s_shift[row_of(static_cast<unsigned>(unit))]) * row_units;
  }
};

struct SearchRowEnds {  // for tiles of fewer than 2^31 units, so 32-bit unit arithmetic
  const int* s_row_end;  // inclusive row ends of the tile's sequences
  int count, row_units;
  int64_t slab_units;
  __device__ __forceinline__ int64_t operator()(int64_t unit) const {
    const int unit32 = static_cast<int>(unit);
    int left = 0, right = count - 1;
    while (left < right) {
      const int mid = (left + right) / 2;
      if (s_row_end[mid] * row_units > unit32) right = mid; else left = mid + 1;
    }
    return left * slab_units + (unit32 - (left == 0 ? 0 : s_row_end[left - 1] * row_units));
  }
};

struct SearchUnitEnds {
  const int64_t* s_unit_end;  // the tile's sequences' accepted units, inclusive ends (fill_unit_ends)
  int count;
  int64_t slab_units;
  __device__ __forceinline__ int64_t operator()(int64_t unit) const {
    int left = 0, right = count - 1;
    while (left < right) {
      const int mid = (left + right) / 2;
      if (s_unit_end[mid] > unit) right = mid; else left = mid + 1;
    }
    return left * slab_units + (unit - (left == 0 ? 0 : s_unit_end[left - 1]));
  }
};

// shift(r) for every accepted row of the tile: ceil-pow2(gamma) threads (at most a warp) per sequence, so
// gamma = 4 fills 64 sequences a step. Few instructions on purpose: 32 warps an SM issue them in step, and the
// first version (runtime divisions by the width) cost 0.3-0.5 us at b = 1024 (session 14). Ends with a barrier.
__device__ __forceinline__ void fill_shift_table(int* s_shift, const int* s_row_end, int count, int gamma) {
  const int log_width = gamma >= 32 ? 5 : 32 - __clz(gamma - 1);  // 0 for gamma = 1
  const int width = 1 << log_width;
  for (int local = threadIdx.x >> log_width; local < count; local += kThreads >> log_width) {
    const int begin = local == 0 ? 0 : s_row_end[local - 1], end = s_row_end[local];
    const int shift = local * gamma - begin;
    for (int row = begin + (threadIdx.x & (width - 1)); row < end; row += width) s_shift[row] = shift;
  }
  __syncthreads();
}

// The search's unit ends, in the shift table's shared memory (kShiftRows ints hold kScanMaxTileSeqs int64s).
// Ends with a barrier.
__device__ __forceinline__ void fill_unit_ends(int64_t* s_unit_end, const int* s_row_end, int count, int64_t row_units) {
  for (int local = threadIdx.x; local < count; local += kThreads) {
    s_unit_end[local] = static_cast<int64_t>(s_row_end[local]) * row_units;
  }
  __syncthreads();
}

template <typename V, typename Source>
struct TileCopy {
  const V* source;  // the tile's first source unit
  V* packed;        // the tile's first destination unit, once the prefix is known
  Source source_of;
  int64_t tile_units;

  __device__ __forceinline__ void load(V (&word)[kUnroll], int64_t base) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = base + u * kThreads + threadIdx.x;
      if (unit < tile_units) word[u] = __ldg(source + source_of(unit));
    }
  }

  __device__ __forceinline__ void store(const V (&word)[kUnroll], int64_t base) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t unit = base + u * kThreads + threadIdx.x;
      if (unit < tile_units) packed[unit] = word[u];
    }
  }
};

// The low word of state[0] counts the launch's finished blocks; the last one moves the epoch on and
// zeroes the count, so the next launch in stream order (a CUDA-graph replay too) starts one epoch on.
// Counted at the end, after the block read the epoch and looked back: when the count is full, no
// block of this launch can still read either. Thread 0; the block's stores need not have landed.
// The last block also sets kPairBit for the next launch when this one accepted under half its rows: the last
// group's INCLUSIVE word holds them, read as the look-back reads a word: polled until it is this epoch's. Outputs
// never depend on the bit (it only groups tiles), and every block of a launch reads the one value, written before
// the launch's first block reads the epoch.
__device__ __forceinline__ void finish_block(unsigned long long* scan_state, unsigned high, const TileShape& shape) {
  if (threadIdx.x == 0) {
    const unsigned long long done = atomicAdd(scan_state, 1ull);
    if ((done & 0xffffffffull) == gridDim.x - 1u) {
      const unsigned epoch = high & kEpochBits;
      const int64_t last_group = gridDim.x / shape.chunks_per_seq - 1;
      // Every launch publishes its last group's INCLUSIVE word before the block that publishes it (block 2j in a
      // paired launch) counts itself, so this polls until it is this epoch's, as the look-back polls a group's word.
      const unsigned long long* last_word = scan_state + 1 + last_group;
      unsigned long long word = load_relaxed(last_word);
      while (status_flag(word) != kInclusive || status_epoch(word) != (epoch & kEpochMask)) {
        __nanosleep(32);
        word = load_relaxed(last_word);
      }
      const unsigned pair = 2 * static_cast<int64_t>(status_value(word)) < shape.batch * shape.gamma ? kPairBit : 0u;
      atomicExch(scan_state, static_cast<unsigned long long>(((epoch + 1u) & kEpochBits) | pair) << 32);
    }
  }
}

// The bytes [begin, begin + bytes) of a sequence's accepted KV that its chunk copies. The grid is sized on
// worst-case KV (the lengths come after the launch), so at fixed offsets a sequence accepting 30% of its
// slab left most of its chunk blocks idle and the first few copying whole chunks of several rounds
// (b = 32, γ = 128, α = 0.3, kv 4096: 5 of 16 chunks copied 64 KiB each). By default the accepted bytes
// are split evenly over as many chunks as give each at least one copy round (kThreads * kUnroll units):
// a block loads its first round during its look-back (or right after it, kLateLoadBytes), so more rounds
// cost latency and fewer bytes save none, while every chunk that copies must look back (one with nothing
// to copy leaves before it; an even split over all chunks made b = 256, γ = 32, α = 0.3, kv 1024 1.15x
// slower). fixed_chunks keeps the fixed offsets for comparison.
template <typename V>
__device__ __forceinline__ void chunk_of_accepted(const TileShape& shape, int64_t chunk, int64_t accepted_bytes,
                                                  int64_t& begin, int64_t& bytes) {
  if (shape.fixed_chunks) {
    begin = chunk * shape.chunk_bytes;
    bytes = min(max(accepted_bytes - begin, int64_t{0}), shape.chunk_bytes);
    return;
  }
  const int64_t units = accepted_bytes / static_cast<int64_t>(sizeof(V));  // row_bytes is a multiple of sizeof(V)
  const int64_t share = (units + shape.chunks_per_seq - 1) / shape.chunks_per_seq;
  const int64_t per_chunk = max((share + kThreads - 1) / kThreads * kThreads, int64_t{kThreads} * kUnroll);
  const int64_t first = min(chunk * per_chunk, units);
  begin = first * static_cast<int64_t>(sizeof(V));
  bytes = (min(first + per_chunk, units) - first) * static_cast<int64_t>(sizeof(V));
}

template <typename Lengths, typename V, bool kLateLoads, bool kWarpScan>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    scan_pack_kernel(Lengths lengths, const char* __restrict__ draft_kv, char* __restrict__ packed_kv,
                     int64_t* __restrict__ packed_offsets, unsigned long long* scan_state, TileShape shape,
                     bool writes_verdict) {
  __shared__ int s_row_end[kScanMaxTileSeqs];
  __shared__ __align__(8) int s_shift[kShiftRows];  // or kScanMaxTileSeqs int64 unit ends (SearchUnitEnds)
  __shared__ int s_warp_totals[kWarps];
  __shared__ int s_ends[kWarpScanSeqs];  // warp_scan: the inclusive row ends, from warp 0
  __shared__ unsigned s_epoch;
  __shared__ LookBackScratch s_look_back;

  // The tile is blockIdx.x: a block waits only on lower tiles, which the GPU dispatched no later (blocks
  // start in index order; CUB's single-pass scan relies on the same). Thread 0 reads this launch's
  // epoch while the tokens load; it does not change before every block of the launch has finished.
  if (threadIdx.x == 0) s_epoch = static_cast<unsigned>(load_relaxed(scan_state) >> 32);
  const int64_t tile = blockIdx.x;
  const int group = static_cast<int>(tile / shape.chunks_per_seq);
  const int chunk = static_cast<int>(tile % shape.chunks_per_seq);
  const int64_t first_seq = static_cast<int64_t>(group) * shape.seqs_per_tile;
  int count = static_cast<int>(min(static_cast<int64_t>(shape.seqs_per_tile), shape.batch - first_seq));
  const int gamma = static_cast<int>(shape.gamma);
  const bool publisher = chunk == 0;
  unsigned long long* status = scan_state + 1;

  // Tiles in pairs (docs/perf-notes.md, "Session 45"; shapes of whole-sequence tiles only, tile_shape): when this
  // launch pairs, block 2j verifies and copies tiles 2j and 2j + 1 as one, and block 2j + 1 leaves. Block 2j starts
  // on its own sequences at once and learns the decision from the epoch word, loaded beside its tokens; block 2j + 1
  // waits for that word, one L2 round trip, before it verifies anything.
  if (shape.pairing != kNever && (tile & 1) != 0) {
    __syncthreads();
    if (shape.pairing == kAlways || (s_epoch & kPairBit) != 0u) {
      finish_block(scan_state, s_epoch, shape);
      return;
    }
  }
  timeline_mark(0);
  lengths.fill(s_row_end, first_seq, count, gamma, publisher && writes_verdict);
  __syncthreads();
  timeline_mark(1);
  const unsigned epoch = s_epoch & kEpochBits;
  // paired: this block's tile and the next group's, whose lengths go after its own in s_row_end (the same test as
  // the odd block's above, written out: as a helper function it changed the generated code)
  const int first_count = count;
  const bool paired =
      shape.pairing != kNever && (shape.pairing == kAlways || (s_epoch & kPairBit) != 0u) && tile + 1 < gridDim.x;
  if (paired) {  // whole-sequence tiles only (tile_shape), so this block is its group's publisher
    count += static_cast<int>(min(static_cast<int64_t>(shape.seqs_per_tile), shape.batch - first_seq - first_count));
    lengths.fill(s_row_end + first_count, first_seq + first_count, count - first_count, gamma, writes_verdict);
    __syncthreads();
  }
  const int last_group = group + (paired ? 1 : 0);  // published INCLUSIVE after the look-back
  // Tiles of at most 32 sequences: every warp scans the lengths in registers (lane i: sequence i), so the
  // publish waits for no further barrier, and a one-sequence tile's loads neither (docs/perf-notes.md, "Session
  // 33"). s_row_end keeps the lengths there; warp 0 writes the row ends to s_ends, read after a barrier by tiles
  // of two or more sequences only.
  int tile_rows, first_rows;      // the tile's accepted rows, and those of its first group (a pair's two differ)
  if constexpr (kWarpScan) {
    const int lane = threadIdx.x % 32;
    int row_end = lane < count ? s_row_end[lane] : 0;
#pragma unroll
    for (int delta = 1; delta < 32; delta <<= 1) {
      const int up = __shfl_up_sync(kFullMask, row_end, delta);
      if (lane >= delta) row_end += up;
    }
    tile_rows = __shfl_sync(kFullMask, row_end, 31);
    first_rows = __shfl_sync(kFullMask, row_end, first_count - 1);
    if (threadIdx.x < 32) s_ends[lane] = row_end;
  } else {
    block_inclusive_scan(s_row_end, count, s_warp_totals);
    tile_rows = s_row_end[count - 1];
    first_rows = s_row_end[first_count - 1];
  }
  const int* row_ends = kWarpScan ? s_ends : s_row_end;  // inclusive, per sequence of the tile
  if (publisher && threadIdx.x == 0) {
    // a pair publishes both its groups' sums; group 0's are INCLUSIVE at once
    const unsigned flag = group == 0 ? kInclusive : kAggregate;
    if (paired) store_relaxed(status + group, pack_status(epoch, flag, static_cast<unsigned>(first_rows)));
    store_relaxed(status + last_group,  // group 0's pair: INCLUSIVE, the whole tile's rows
                  pack_status(epoch, flag,
                              static_cast<unsigned>(paired && group != 0 ? tile_rows - first_rows : tile_rows)));
  }

  const int64_t accepted_bytes = static_cast<int64_t>(tile_rows) * shape.row_bytes;
  int64_t source_chunk = 0, tile_bytes = accepted_bytes;
  if (shape.seqs_per_tile == 1) chunk_of_accepted<V>(shape, chunk, accepted_bytes, source_chunk, tile_bytes);
  if (!publisher && tile_bytes == 0) {  // nothing of this sequence's accepted rows is left to this chunk
    finish_block(scan_state, s_epoch, shape);
    return;
  }

  const int64_t unit_bytes = sizeof(V);  // row_bytes, slab_bytes and chunk starts are multiples of it
  const int64_t tile_units = tile_bytes / unit_bytes, row_units = shape.row_bytes / unit_bytes;
  const V* source = reinterpret_cast<const V*>(draft_kv + first_seq * shape.slab_bytes + source_chunk);
  // From the first load to the last store, for one way of finding a unit's source (chosen per block below).
  auto copy_tile = [&](auto source_of) {
    TileCopy<V, decltype(source_of)> copy{source, nullptr, source_of, tile_units};
    V word[kUnroll];
    if constexpr (!kLateLoads) copy.load(word, 0);  // in flight during the look-back

    const int64_t prefix = group == 0 ? 0 : look_back(status, group, epoch, s_look_back);
    timeline_mark(2);
    if (publisher && group != 0 && threadIdx.x == 0) {
      store_relaxed(status + last_group, pack_status(epoch, kInclusive, static_cast<unsigned>(prefix + tile_rows)));
    }
    if (publisher) {
      // row_ends[local - 1] for local >= 1 only: tiles of 2+ sequences passed the barrier before copy_tile (s_ends)
      for (int local = threadIdx.x; local < count; local += kThreads) {
        packed_offsets[first_seq + local] = prefix + (local == 0 ? 0 : row_ends[local - 1]);
      }
    }
    copy.packed = reinterpret_cast<V*>(packed_kv + prefix * shape.row_bytes + source_chunk);
    int64_t base = 0;
    if constexpr (!kLateLoads) {
      copy.store(word, 0);
      base = kThreads * kUnroll;
    }
    for (; base < tile_units; base += kThreads * kUnroll) {
      copy.load(word, base);
      copy.store(word, base);
    }
  };
  const bool units32 = tile_units < (int64_t{1} << 31);  // 32-bit row and unit arithmetic
  if (count == 1) {
    copy_tile(OneSequence{});
  } else {
    if constexpr (kWarpScan) __syncthreads();  // s_ends, from warp 0
    if (units32 && count <= kSearchMaxSeqs) {
      copy_tile(SearchRowEnds{row_ends, count, static_cast<int>(row_units), shape.slab_bytes / unit_bytes});
    } else if (units32 && tile_rows <= kShiftRows) {
      fill_shift_table(s_shift, row_ends, count, gamma);
      copy_tile(ShiftTable{s_shift, shape.row_of, static_cast<int>(row_units)});
    } else {
      int64_t* s_unit_end = reinterpret_cast<int64_t*>(s_shift);
      fill_unit_ends(s_unit_end, row_ends, count, row_units);
      copy_tile(SearchUnitEnds{s_unit_end, count, shape.slab_bytes / unit_bytes});
    }
  }
  timeline_mark(3);
  finish_block(scan_state, s_epoch, shape);
}

// ---- host ---------------------------------------------------------------------------------------------
// Tile size: one wave of resident blocks over the GPU, each tile at most max_tile_bytes of worst-case KV.
// A block pays a chain of dependent round trips (tokens, ballot and scan, KV load, look-back) before
// its first store; four waves of blocks each copying one 32 KiB round kept HBM idle for most of that
// chain (~2.8 TB/s), one wave of tiles four times larger streams at ~3.3 (H200, cold L2: b = 1024,
// γ = 32, kv 1024: 42.6 -> 36.3 us; b = 1024, γ = 8, α = 0.3, kv 4096: 22.0 -> 17.2).
// Tiles of whole sequences round the sequence count up where the cap allows, so their groups stay
// within one wave (row chunks round up per sequence and can spill a little past it).
// Past 256 KiB a tile's fixed cost is paid over enough bytes (512 KiB tiles were 2% slower at
// b = 65,536, γ = 32, kv 128, and 1 MiB tiles 8% in an earlier build: fewer blocks, longer tails).
// Small work still gets one sequence per block (every SM verifies and copies; a block of 32 sequences
// on one SM was 1.3x slower than fused at b = 32), unless its tiles would hold less than kMinTileBytes.
// ScanTiling's fields are the rule's knobs; a zero field takes its default (scan_tiles benchmarks them).
// Shapes only: no data, no sync.
constexpr int kWavesOfBlocks = 1;
constexpr int64_t kMaxTileBytes = 8 * kTileBytes;  // 8 copy rounds of 32 KiB per block at most
// At most this many sequence groups where tiles allow: the look-back reads 256 groups a step, and a
// group's INCLUSIVE word waits on its predecessors' (a chain of 4096 one-sequence groups took 34 us
// against 10 us with 64 groups when a warp looked back 32 groups a step).
constexpr int64_t kLookBackGroups = 4096;
// At least this much worst-case KV per tile: tiny work in a few blocks, not hundreds of one-row tiles that
// each pay the whole chain and a look-back (b = 1024, γ = 4, kv 64: 7.6 -> 3.9 us; 16 KiB won at
// γ = 8-32 but cost 10% at b = 32, γ = 8, kv 128).
constexpr int64_t kMinTileBytes = 8 * 1024;
// In a grid of one wave of resident blocks or less, chunks of a sequence of at least this much worst-case KV load
// their first copy round after the look-back, not during it (docs/perf-notes.md, "Session 18"; CUPTI GPU time,
// H200). With 32 KiB of KV loads in flight per block, the look-back's status reads returned 1-2.7 us later. Late
// loads were 1-14% faster at chunks of 64-128 KiB (b = 256, γ = 32, kv 4096 and γ = 128, kv 1024; b = 32,
// γ = 128, kv 4096), mixed at 32 KiB chunks (-3% to +5%), level to 1.6% slower at the 256 KiB chunks of grids of
// several waves, and 2-16% slower at whole tiles of 64-128 KiB (b = 1024, kv 1024-4096). Those keep the early loads.
constexpr int64_t kLateLoadBytes = 64 * 1024;

ScanTiling resolved(ScanTiling tiling) {
  if (tiling.waves <= 0) tiling.waves = kWavesOfBlocks;
  if (tiling.max_tile_bytes <= 0) tiling.max_tile_bytes = kMaxTileBytes;
  tiling.max_tile_bytes = (tiling.max_tile_bytes + kTileBytes - 1) / kTileBytes * kTileBytes;  // whole rounds
  if (tiling.look_back_groups <= 0) tiling.look_back_groups = kLookBackGroups;
  if (tiling.min_tile_bytes <= 0) tiling.min_tile_bytes = kMinTileBytes;
  if (tiling.late_load_bytes <= 0) tiling.late_load_bytes = kLateLoadBytes;
  return tiling;
}

int multiprocessor_count() {
  static int cached[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int count = 0;
    cached[device] = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && count > 0
                         ? count : 132;
  }
  return cached[device];
}

TileShape tile_shape(int64_t batch, int64_t gamma, int64_t row_bytes, int sms, ScanTiling tiling) {
  tiling = resolved(tiling);
  TileShape shape{batch, gamma, row_bytes, gamma * row_bytes, gamma * row_bytes, 1, 1, tiling.fixed_chunks != 0,
                  false, tiling.scan_mode == 0};
  const int64_t target_blocks = int64_t{sms} * kBlocksPerSm * tiling.waves;
  const int64_t total_bytes = batch * shape.slab_bytes;
  int64_t tile_bytes = (total_bytes + target_blocks - 1) / target_blocks;
  tile_bytes = tile_bytes > tiling.min_tile_bytes ? tile_bytes : tiling.min_tile_bytes;
  tile_bytes = tile_bytes < tiling.max_tile_bytes ? tile_bytes : tiling.max_tile_bytes;
  // worst-case chunks are whole copy rounds (multiples of kTileBytes): they size the grid, and fixed_chunks'
  // ranges start co-aligned; the default split starts chunks at multiples of kThreads units, aligned too
  const int64_t chunk_bytes = tile_bytes <= kTileBytes ? kTileBytes : (tile_bytes + kTileBytes - 1) / kTileBytes * kTileBytes;
  // A slab of at most two copy rounds stays whole once the sequences alone give every SM a block: chunking it
  // doubled the blocks that verify and look back for ~one round of bytes each (b = 256, γ = 8, kv 4096, warm:
  // α = 0.3 7.65 -> 6.21 µs whole, α = 0.9 10.8 -> 8.8; at b = 32, 32 whole slabs were slower, 4.54 -> 4.93).
  const bool whole_slab =
      shape.slab_bytes <= 2 * kTileBytes && shape.slab_bytes <= tiling.max_tile_bytes && batch >= sms;
  if (batch <= kScanMaxGroups && shape.slab_bytes > chunk_bytes && !whole_slab) {
    shape.chunk_bytes = chunk_bytes;
    shape.chunks_per_seq = static_cast<int>((shape.slab_bytes + chunk_bytes - 1) / chunk_bytes);
    const int64_t one_wave = int64_t{sms} * kBlocksPerSm;  // whatever waves the tiles aim at: measured at one
    shape.late_loads = shape.chunk_bytes >= tiling.late_load_bytes && batch * shape.chunks_per_seq <= one_wave;
    return shape;
  }
  // Round up where the cap allows (tile_bytes ~ total / target_blocks, so at most target_blocks groups),
  // else down: a tile never exceeds max_tile_bytes unless B itself needs more sequences per group (or the
  // two-sequence tiles of large slabs just below; tiles in pairs, further below, join two tiles at launch).
  const int64_t rounded_up = (tile_bytes + shape.slab_bytes - 1) / shape.slab_bytes;
  int64_t seqs = rounded_up * shape.slab_bytes <= tiling.max_tile_bytes ? rounded_up : tile_bytes / shape.slab_bytes;
  // One whole sequence per tile, its slab over half the cap, where pairs still fill nine tenths of a wave: at
  // low acceptance such a tile copies ~2 rounds a chain (b = 16,384, γ = 128, α = 0.3, kv 1024: 731 us
  // against 668 for the best two-step); two sequences a tile pay the chain once for both (689 us; 2009 ->
  // 2001 us at α = 0.9). Measured from b = 1024 up (0.97 waves of pairs); fewer pairs would idle SMs.
  if (seqs <= 1 && 2 * shape.slab_bytes > tiling.max_tile_bytes && 5 * batch >= 9 * target_blocks) seqs = 2;
  const int64_t for_chain = (batch + tiling.look_back_groups - 1) / tiling.look_back_groups;
  const int64_t by_bytes = tiling.max_tile_bytes / shape.slab_bytes > 1 ? tiling.max_tile_bytes / shape.slab_bytes : 1;
  const int64_t chain_seqs = for_chain < by_bytes ? for_chain : by_bytes;
  seqs = seqs > chain_seqs ? seqs : chain_seqs;
  const int64_t needed = (batch + kScanMaxGroups - 1) / kScanMaxGroups;
  seqs = seqs > needed ? seqs : needed;
  seqs = seqs < 1 ? 1 : (seqs > kScanMaxTileSeqs ? kScanMaxTileSeqs : seqs);
  shape.seqs_per_tile = static_cast<int>(seqs);
  shape.warp_scan = shape.warp_scan && seqs <= kWarpScanSeqs;
  // Tiles in pairs where the launch before accepted under half its rows (docs/perf-notes.md, "Session 45"): in a grid
  // of more than `waves` waves of tiles at the cap, a block's fixed chain (tokens, verdict, look-back) is paid for
  // ~2.4 copy rounds at α = 0.3; tiles of twice the cap were 1-6% faster there and up to 3.3% slower at α = 0.9
  // (scale-kv/experiments/tile-size-at-low-acceptance/). A pair must still fit its scan (32 sequences a warp scan)
  // and be two tiles of at most the cap each (not the two-sequence tiles of large slabs above).
  // Not with fixed_chunks: a one-sequence tile copies at most one slab there (chunk_of_accepted), not a pair's two.
  const bool pairable = 2 * seqs <= (shape.warp_scan ? kWarpScanSeqs : kScanMaxTileSeqs) &&
                        seqs * shape.slab_bytes <= tiling.max_tile_bytes && !shape.fixed_chunks;
  if (pairable && tiling.pairs == 2) shape.pairing = kAlways;
  if (pairable && tiling.pairs == 0 && total_bytes > target_blocks * tiling.max_tile_bytes) shape.pairing = kByBit;
  return shape;
}

// The widest unit that divides every offset: row and chunk starts are multiples of row_bytes and 16.
int unit_bytes(const void* draft_kv, const void* packed_kv, int64_t row_bytes) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(draft_kv) | reinterpret_cast<uintptr_t>(packed_kv) |
                         static_cast<uintptr_t>(row_bytes);
  return bits % 16 == 0 ? 16 : (bits % 8 == 0 ? 8 : (bits % 4 == 0 ? 4 : 2));
}

template <typename Lengths, typename V>
cudaError_t launch_with(const Lengths& lengths, const void* draft_kv, void* packed_kv, int64_t* packed_offsets,
                        int64_t* scan_state, const TileShape& shape, bool writes_verdict, cudaStream_t stream) {
  const int64_t groups = (shape.batch + shape.seqs_per_tile - 1) / shape.seqs_per_tile;
  const int64_t grid = groups * shape.chunks_per_seq;
  if (groups > kScanMaxGroups || grid > 0x7fffffff) return cudaErrorInvalidValue;
  TileShape with_rows = shape;
  with_rows.row_of = RowDivider::of(shape.row_bytes / static_cast<int64_t>(sizeof(V)));
  // The load order and the scan are template arguments. As a runtime branch, the load order made the 8- and 16-byte
  // fused kernels spill, and so did the scan with session 33's first (dropped) sources; a template keeps each kernel
  // to one scan's code.
  auto* kernel = shape.late_loads ? (shape.warp_scan ? scan_pack_kernel<Lengths, V, true, true>
                                                     : scan_pack_kernel<Lengths, V, true, false>)
                                  : (shape.warp_scan ? scan_pack_kernel<Lengths, V, false, true>
                                                     : scan_pack_kernel<Lengths, V, false, false>);
  kernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
      lengths, static_cast<const char*>(draft_kv), static_cast<char*>(packed_kv), packed_offsets,
      reinterpret_cast<unsigned long long*>(scan_state), with_rows, writes_verdict);
  return cudaGetLastError();
}

template <typename Lengths>
cudaError_t launch_any_unit(const Lengths& lengths, const void* draft_kv, void* packed_kv, int64_t* packed_offsets,
                            int64_t batch, int64_t gamma, int64_t row_bytes, int64_t* scan_state,
                            bool writes_verdict, ScanTiling tiling, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  if (batch > kScanMaxBatch || gamma < 1 || row_bytes < 2 || row_bytes % 2 != 0) return cudaErrorInvalidValue;
  const TileShape shape = tile_shape(batch, gamma, row_bytes, multiprocessor_count(), tiling);
  switch (unit_bytes(draft_kv, packed_kv, row_bytes)) {
    case 16:
      return launch_with<Lengths, uint4>(lengths, draft_kv, packed_kv, packed_offsets, scan_state, shape,
                                         writes_verdict, stream);
    case 8:
      return launch_with<Lengths, uint2>(lengths, draft_kv, packed_kv, packed_offsets, scan_state, shape,
                                         writes_verdict, stream);
    case 4:
      return launch_with<Lengths, uint32_t>(lengths, draft_kv, packed_kv, packed_offsets, scan_state, shape,
                                            writes_verdict, stream);
    default:
      return launch_with<Lengths, uint16_t>(lengths, draft_kv, packed_kv, packed_offsets, scan_state, shape,
                                            writes_verdict, stream);
  }
}

template <typename T>
cudaError_t launch_fused_scan_typed(const void* draft_tokens, const void* target_tokens, const void* draft_kv,
                                    int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                                    void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma,
                                    int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream) {
  const VerifiedLengths<T> lengths{static_cast<const T*>(draft_tokens), static_cast<const T*>(target_tokens),
                                   accepted_lengths, has_mismatch, static_cast<T*>(next_tokens)};
  return launch_any_unit(lengths, draft_kv, packed_kv, packed_offsets, batch, gamma, row_bytes, scan_state, true,
                         tiling, stream);
}

}  // namespace
}  // namespace scan

cudaError_t launch_fused_scan(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                              const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                              void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma,
                              int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream) {
  return token_type == TokenType::kInt64
             ? scan::launch_fused_scan_typed<int64_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths,
                                                      has_mismatch, next_tokens, packed_kv, packed_offsets, batch,
                                                      gamma, row_bytes, scan_state, tiling, stream)
             : scan::launch_fused_scan_typed<int32_t>(draft_tokens, target_tokens, draft_kv, accepted_lengths,
                                                      has_mismatch, next_tokens, packed_kv, packed_offsets, batch,
                                                      gamma, row_bytes, scan_state, tiling, stream);
}

cudaError_t launch_pack_scan(const void* draft_kv, const int64_t* accepted_lengths, void* packed_kv,
                             int64_t* packed_offsets, int32_t* error_flags, int64_t batch, int64_t gamma,
                             int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream) {
  // writes_verdict: the tile's writer writes the error flags (pack has no verify outputs)
  return scan::launch_any_unit(scan::GivenLengths{accepted_lengths, error_flags}, draft_kv, packed_kv,
                               packed_offsets, batch, gamma, row_bytes, scan_state, true, tiling, stream);
}

}  // namespace sdbench
