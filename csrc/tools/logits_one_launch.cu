// A probe of issue #18's one-launch design from logits: pass 1 and the race in one persistent launch, each
// sequence's race starting as soon as its own rows are done, with no launch boundary between the passes.
//
// Not a shipped kernel: it answers whether a one-launch design in CUDA C++ (registers and occupancy under our
// control, unlike session 17's Triton one launch) brings the seven floor-bar misses under their bars. The
// prediction and the measurement are in docs/perf-notes.md ("Session 31"); the driver is
// sdbench/commands/logits_one_launch.py, which checks k against the reference before it times anything.
//
// The work is one list of items, taken round robin by a grid that is all resident (every block i, i + G, ...):
//   for each sequence s in order: its stats items (row r of 2γ+1, split j: span columns), then the race items of
//   sequence s - lag (chunk c of row k). A stats item folds its columns into (max, Σexp, argmax) and arrives on
//   the sequence's counter; the last arrival combines the partials, runs the accept scan, writes k and the drafts
//   and publishes row k's normalisers (`ready`). A race item waits for `ready`, keys its chunk of row k
//   (the residual max(p - q, 0) over exponential noise) and arrives; the last arrival picks the next token.
// Progress: an item waits only on items earlier in the list, and the earliest unfinished item's block is
// resident and not waiting, so the list always moves. Every counter and flag is back at zero after a launch.
#include "logits_one_launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace probe {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStatsSteps = 4;  // 16-byte loads a thread keeps in flight in a stats item (16 KiB an item)
constexpr int kMaxRows = 64;    // 2γ + 1 for γ <= 31
constexpr int32_t kStuck = 99;  // error_flags: a race item gave up waiting for its sequence
#ifndef PROBE_MIN_BLOCKS
#define PROBE_MIN_BLOCKS 4
#endif
constexpr int kMinBlocks = PROBE_MIN_BLOCKS;  // blocks an SM at the least (4: 64 registers, 3: 80)
constexpr float kInf = __builtin_huge_valf();

template <typename T>
struct Lane;
template <>
struct Lane<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ static void unpack(const uint4& v, float* out) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ static float one(const void* row, int64_t col) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(row)[col]);
  }
};
template <>
struct Lane<float> {
  static constexpr int n = 4;
  __device__ static void unpack(const uint4& v, float* out) {
    const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = f[i];
  }
  __device__ static float one(const void* row, int64_t col) { return static_cast<const float*>(row)[col]; }
};

// Philox4x32-10 (Salmon et al., SC'11).
__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
#pragma unroll
  for (int i = 0; i < 10; ++i) {
    unsigned lo0 = 0xD2511F53u * c.x, hi0 = __umulhi(0xD2511F53u, c.x);
    unsigned lo1 = 0xCD9E8D57u * c.z, hi1 = __umulhi(0xCD9E8D57u, c.z);
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}
__device__ __forceinline__ uint4 draw(const Args& a, unsigned index, unsigned s, unsigned stream) {
  return philox(make_uint4(index, s, stream, static_cast<unsigned>(a.offset)),
                make_uint2(static_cast<unsigned>(a.seed), static_cast<unsigned>(a.seed >> 32)));
}
__device__ __forceinline__ float unit_open0(unsigned x) { return ((x >> 8) + 1) * (1.0f / 16777216.0f); }  // (0, 1]

constexpr float kLog2e = 1.4426950408889634f;
// 2^x, flushing subnormals: the row statistics' and the race's exponentials (fused_logits' `_exp2` likewise)
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ bool better(float key, int arg, float best, int best_arg) {
  return key > best || (key == best && arg < best_arg);
}

// (max, first argmax) over the block; every thread gets the result. sf/si: kWarps slots.
__device__ void block_max_arg(float& m, int& arg, float* sf, int* si) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    float om = __shfl_xor_sync(~0u, m, o);
    int oa = __shfl_xor_sync(~0u, arg, o);
    if (better(om, oa, m, arg)) m = om, arg = oa;
  }
  if ((threadIdx.x & 31) == 0) sf[threadIdx.x / 32] = m, si[threadIdx.x / 32] = arg;
  __syncthreads();
  m = sf[0], arg = si[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w)
    if (better(sf[w], si[w], m, arg)) m = sf[w], arg = si[w];
  __syncthreads();
}
__device__ float block_sum(float x, float* sf) {
#pragma unroll
  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(~0u, x, o);
  if ((threadIdx.x & 31) == 0) sf[threadIdx.x / 32] = x;
  __syncthreads();
  x = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) x += sf[w];
  __syncthreads();
  return x;
}

struct Shared;
__device__ bool has_draft_row(const Shared& sh);
__device__ __forceinline__ float inverse_temperature(float t) { return t > 0.0f ? 1.0f / t : 1.0f; }

struct Shared {
  float f[kWarps];
  int i[kWarps];
  float f2[kWarps];
  int i2[kWarps];
  float row_max[kMaxRows];
  float row_sum[kMaxRows];
  int row_arg[kMaxRows];
  float info[8];
  int flag;
};

// (max, Σexp, first argmax) partials folded across a warp (an empty lane holds -inf, 0).
__device__ void warp_fold(float& m, float& sum, int& arg) {
#pragma unroll
  for (int o = 16; o; o >>= 1) {
    const float om = __shfl_xor_sync(~0u, m, o), os = __shfl_xor_sync(~0u, sum, o);
    const int oa = __shfl_xor_sync(~0u, arg, o);
    if (better(om, oa, m, arg)) {
      sum = os + sum * ex2(m - om);
      m = om, arg = oa;
    } else if (om > -kInf) {
      sum += os * ex2(om - m);
    }
  }
}

__device__ bool has_draft_row(const Shared& sh) { return sh.info[4] > 0.0f; }  // info[4]: the draft's Σ, 0 at k = γ

// The last stats arrival of sequence s, the whole block: each warp folds rows' partials (a lane a split),
// then warp 0 runs the accept scan and publishes.
template <typename T>
__device__ void accept_scan(const Args& a, int s, bool greedy, Shared& sh) {
  const int rows = 2 * a.gamma + 1, lane = threadIdx.x & 31;
  __threadfence();
  for (int r = threadIdx.x / 32; r < (greedy ? a.gamma + 1 : rows); r += kWarps) {
    float m = -kInf, sum = 0.0f;
    int arg = INT_MAX;
    const int64_t base = (static_cast<int64_t>(s) * rows + r) * a.splits;
    for (int j0 = 0; j0 < a.splits; j0 += 32) {
      float pm = -kInf, ps = 0.0f;
      int pa = INT_MAX;
      if (j0 + lane < a.splits) {
        pm = __ldcg(a.part_max + base + j0 + lane), ps = __ldcg(a.part_sum + base + j0 + lane);
        pa = __ldcg(a.part_arg + base + j0 + lane);
      }
      warp_fold(pm, ps, pa);
      if (better(pm, pa, m, arg)) {
        sum = ps + sum * ex2(m - pm);
        m = pm, arg = pa;
      } else {
        sum += ps * ex2(pm - m);
      }
    }
    if (lane == 0) sh.row_max[r] = m, sh.row_sum[r] = sum, sh.row_arg[r] = arg;
  }
  __syncthreads();
  if (threadIdx.x >= 32) return;
  const float inv_t = inverse_temperature(a.target_temperature[s]);
  const float draft_t = a.draft_temperature[s];
  const float inv_d = inverse_temperature(draft_t);
  bool accepted = false, bad = false;
  int64_t x = 0;
  if (lane < a.gamma) {
    x = a.tokens[static_cast<int64_t>(s) * a.gamma + lane];
    bad = x < 0 || x >= a.vocab;
    if (!bad && greedy) {
      accepted = x == sh.row_arg[lane];
    } else if (!bad) {
      const float tl = Lane<T>::one(static_cast<const T*>(a.target) + (static_cast<int64_t>(s) * (a.gamma + 1) + lane) * a.vocab, x);
      const float p = ex2(fmaf(tl, inv_t * kLog2e, -sh.row_max[lane])) / sh.row_sum[lane];
      const int dr = a.gamma + 1 + lane;
      float q;
      if (draft_t == 0.0f) {
        q = x == sh.row_arg[dr] ? 1.0f : 0.0f;
      } else {
        const float dl = Lane<T>::one(static_cast<const T*>(a.draft) + (static_cast<int64_t>(s) * a.gamma + lane) * a.vocab, x);
        q = ex2(fmaf(dl, inv_d * kLog2e, -sh.row_max[dr])) / sh.row_sum[dr];
      }
      const float u = a.uniforms ? a.uniforms[static_cast<int64_t>(s) * a.gamma + lane]
                                 : (draw(a, lane, s, 0).x >> 8) * (1.0f / 16777216.0f);
      accepted = u * q < p;
    }
  }
  const unsigned rejected = __ballot_sync(~0u, lane < a.gamma && !accepted);
  const unsigned any_bad = __ballot_sync(~0u, bad);
  const int k = rejected ? __ffs(rejected) - 1 : a.gamma;
  int64_t* out = a.output_tokens + static_cast<int64_t>(s) * (a.gamma + 1);
  for (int j = lane; j <= a.gamma; j += 32) {
    if (j < k) out[j] = x;  // lane j < k < gamma holds x_j
    if (j > k) out[j] = -1;
  }
  if (lane == 0) {
    a.accepted_lengths[s] = k;
    a.error_flags[s] = any_bad ? 1 : 0;
    if (greedy) {
      a.next_tokens[s] = sh.row_arg[k];
      out[k] = sh.row_arg[k];
    } else {
      float* info = a.race_info + static_cast<int64_t>(s) * 8;
      const bool has_draft = k < a.gamma;
      info[0] = __int_as_float(k);
      info[1] = sh.row_max[k];
      info[2] = sh.row_sum[k];
      info[3] = has_draft ? sh.row_max[a.gamma + 1 + k] : 0.0f;
      info[4] = has_draft ? sh.row_sum[a.gamma + 1 + k] : 0.0f;
      info[5] = __int_as_float(has_draft ? sh.row_arg[a.gamma + 1 + k] : -1);
      __threadfence();
      atomicExch(a.ready + s, 1);
    }
  }
}

// An item of the list: a stats item (row r of sequence s, split j) or a race item (chunk j of sequence s's row k).
struct Item {
  bool stats;
  bool skip;  // a greedy request's draft row or race item: nothing to do
  int s, r, j;
};

__device__ Item decode(const Args& a, int64_t t) {
  const int64_t n_stats = static_cast<int64_t>(2 * a.gamma + 1) * a.splits, n_race = a.chunks;
  const int64_t lag = min(a.lag, a.batch), both = n_stats + n_race;
  const int64_t head = lag * n_stats, middle = (a.batch - lag) * both;
  int64_t seg, off;
  bool stats;
  if (t < head) {
    seg = t / n_stats, off = t % n_stats, stats = true;
  } else if (t < head + middle) {
    seg = lag + (t - head) / both, off = (t - head) % both, stats = off < n_stats;
    if (!stats) off -= n_stats;
  } else {
    seg = a.batch + (t - head - middle) / n_race, off = (t - head - middle) % n_race, stats = false;
  }
  Item item;
  item.stats = stats;
  if (stats) {
    item.s = static_cast<int>(seg), item.r = static_cast<int>(off / a.splits), item.j = static_cast<int>(off % a.splits);
    item.skip = item.r > a.gamma && a.target_temperature[item.s] == 0.0f;  // greedy: its draft rows are never needed
  } else {
    item.s = static_cast<int>(seg - lag), item.r = -1, item.j = static_cast<int>(off);
    item.skip = a.target_temperature[item.s] == 0.0f;  // greedy: the accept scan wrote the next token
  }
  return item;
}

template <typename T>
__device__ const T* stats_row(const Args& a, const Item& item) {
  return item.r <= a.gamma
             ? static_cast<const T*>(a.target) + (static_cast<int64_t>(item.s) * (a.gamma + 1) + item.r) * a.vocab
             : static_cast<const T*>(a.draft) + (static_cast<int64_t>(item.s) * a.gamma + item.r - a.gamma - 1) * a.vocab;
}

constexpr int kGroupBytes = kStatsSteps * kThreads * 16;  // a group: four 16-byte lanes a thread

template <typename T>
__device__ int item_groups(const Args& a, const Item& item) {
  constexpr int cols = kGroupBytes / sizeof(T);
  const int c0 = item.j * a.span, c1 = min(a.vocab, c0 + a.span);
  return (c1 - c0 + cols - 1) / cols;
}

// Issue group g's loads of a stats item (four 16-byte lanes a thread), folded a group later.
template <typename T>
__device__ void group_loads(const Args& a, const Item& item, int g, uint4 (&v)[kStatsSteps]) {
  constexpr int N = Lane<T>::n;
  if (!item.stats || item.skip) return;
  const T* row = stats_row<T>(a, item);
  const int c0 = item.j * a.span + g * (kGroupBytes / static_cast<int>(sizeof(T)));
  const int c1 = min(a.vocab, (item.j + 1) * a.span);
#pragma unroll
  for (int t = 0; t < kStatsSteps; ++t) {
    const int col = c0 + (t * kThreads + threadIdx.x) * N;
    if (col < c1) v[t] = __ldg(reinterpret_cast<const uint4*>(row + col));
  }
}

// A thread's running (max, Σ2^(z - max), first argmax) over the groups of a stats item, z in log2 units.
struct Fold {
  float m, sum;
  int arg;
};

template <typename T>
__device__ void fold_group(const Args& a, const Item& item, int g, const uint4 (&v)[kStatsSteps], float inv,
                           bool greedy, bool need_arg, Fold& f) {
  constexpr int N = Lane<T>::n;
  const int c0 = item.j * a.span + g * (kGroupBytes / static_cast<int>(sizeof(T)));
  const int c1 = min(a.vocab, (item.j + 1) * a.span);
  // the max over raw logits, scaled once (inv > 0); the argmax only where a greedy row needs it
  float gm = -kInf;
  int garg = INT_MAX;
#pragma unroll
  for (int t = 0; t < kStatsSteps; ++t) {
    const int col = c0 + (t * kThreads + threadIdx.x) * N;
    if (col < c1) {
      float z[N];
      Lane<T>::unpack(v[t], z);
      if (need_arg) {
#pragma unroll
        for (int e = 0; e < N; ++e)
          if (z[e] > gm) gm = z[e], garg = col + e;
      } else {
#pragma unroll
        for (int e = 0; e < N; ++e) gm = fmaxf(gm, z[e]);
      }
    }
  }
  gm *= inv;
  if (gm > f.m) {  // columns grow with g: a tie keeps the earlier argmax
    if (!greedy) f.sum *= ex2(f.m - gm);
    f.m = gm, f.arg = garg;
  }
  if (greedy) return;
#pragma unroll
  for (int t = 0; t < kStatsSteps; ++t) {
    const int col = c0 + (t * kThreads + threadIdx.x) * N;
    if (col < c1) {
      float z[N];
      Lane<T>::unpack(v[t], z);
#pragma unroll
      for (int e = 0; e < N; ++e) f.sum += ex2(fmaf(z[e], inv, -f.m));
    }
  }
}

// A stats item's last group folded: the block's partial, the arrival, and (the last arrival) the accept scan.
template <typename T>
__device__ void finish_stats(const Args& a, const Item& item, Fold f, bool greedy, Shared& sh) {
  const int s = item.s, r = item.r, j = item.j, rows = 2 * a.gamma + 1;
  float m = f.m;
  int arg = f.arg;
  block_max_arg(m, arg, sh.f, sh.i);
  float sum = 0.0f;
  if (!greedy) sum = block_sum(f.m > -kInf ? f.sum * ex2(f.m - m) : 0.0f, sh.f2);
  if (threadIdx.x == 0) {
    const int64_t at = (static_cast<int64_t>(s) * rows + r) * a.splits + j;
    a.part_max[at] = m, a.part_sum[at] = sum, a.part_arg[at] = arg;
    __threadfence();
    const unsigned expected = (greedy ? a.gamma + 1 : rows) * a.splits;
    const bool last = atomicAdd(a.arrivals + s, 1u) + 1 == expected;
    if (last) a.arrivals[s] = 0;  // every arrival of this launch is in
    sh.flag = last;
  }
  __syncthreads();
  const bool last = sh.flag;
  __syncthreads();
  if (last) accept_scan<T>(a, s, greedy, sh);
  __syncthreads();
}

template <typename T>
__device__ void race_item(const Args& a, const Item& item, Shared& sh) {
  constexpr int N = Lane<T>::n;
  const int s = item.s, c = item.j;
  if (threadIdx.x == 0) {
    volatile int* flag = a.ready + s;
    // a bounded wait (~0.1 s): a probe bug shows as a wrong output and a flag, never as a hung device
    for (int spins = 0; *flag == 0; ++spins) {
      if (spins == (1 << 22)) {
        a.error_flags[s] = kStuck;
        break;
      }
      __nanosleep(32);
    }
    __threadfence();
#pragma unroll
    for (int i = 0; i < 6; ++i) sh.info[i] = __ldcg(a.race_info + static_cast<int64_t>(s) * 8 + i);
  }
  __syncthreads();
  const int k = __float_as_int(sh.info[0]), draft_arg = __float_as_int(sh.info[5]);
  // log2 units; st and sd are the reciprocals of the normalisers
  const float mt = sh.info[1], st = 1.0f / sh.info[2], md = sh.info[3], sd = has_draft_row(sh) ? 1.0f / sh.info[4] : 0.0f;
  const bool has_draft = k < a.gamma, draft_greedy = a.draft_temperature[s] == 0.0f;
  const float inv_t = inverse_temperature(a.target_temperature[s]) * kLog2e;
  const float inv_d = inverse_temperature(a.draft_temperature[s]) * kLog2e;
  const T* trow = static_cast<const T*>(a.target) + (static_cast<int64_t>(s) * (a.gamma + 1) + k) * a.vocab;
  const T* drow = static_cast<const T*>(a.draft) + (static_cast<int64_t>(s) * a.gamma + min(k, a.gamma - 1)) * a.vocab;
  const int c0 = c * a.chunk, c1 = min(a.vocab, c0 + a.chunk);
  float best = -kInf, fallback = -kInf;
  int best_arg = INT_MAX, fallback_arg = INT_MAX;
  for (int col = c0 + threadIdx.x * N; col < c1; col += kThreads * N) {
    float tz[N], dz[N], e[N];
    Lane<T>::unpack(*reinterpret_cast<const uint4*>(trow + col), tz);
    if (has_draft && !draft_greedy) Lane<T>::unpack(*reinterpret_cast<const uint4*>(drow + col), dz);
    if (a.noise) {
#pragma unroll
      for (int i = 0; i < N; ++i) e[i] = a.noise[static_cast<int64_t>(s) * a.vocab + col + i];
    } else {
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const uint4 bits = draw(a, (col + i) / 4, s, 1);
        e[i] = -__logf(unit_open0(bits.x)), e[i + 1] = -__logf(unit_open0(bits.y));
        e[i + 2] = -__logf(unit_open0(bits.z)), e[i + 3] = -__logf(unit_open0(bits.w));
      }
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float p = ex2(fmaf(tz[i], inv_t, -mt)) * st;
      float q = 0.0f;
      if (has_draft) q = draft_greedy ? (col + i == draft_arg ? 1.0f : 0.0f) : ex2(fmaf(dz[i], inv_d, -md)) * sd;
      const float residual = fmaxf(p - q, 0.0f);
      const float key = residual > 0.0f ? __fdividef(residual, e[i]) : -1.0f;
      const float fkey = p > 0.0f ? __fdividef(p, e[i]) : -e[i];
      if (key > best) best = key, best_arg = col + i;
      if (fkey > fallback) fallback = fkey, fallback_arg = col + i;
    }
  }
  block_max_arg(best, best_arg, sh.f, sh.i);
  block_max_arg(fallback, fallback_arg, sh.f2, sh.i2);
  if (threadIdx.x == 0) {
    const int64_t at = static_cast<int64_t>(s) * a.chunks + c;
    a.race_key[at] = best, a.race_arg[at] = best_arg;
    a.fallback_key[at] = fallback, a.fallback_arg[at] = fallback_arg;
    __threadfence();
    const bool last = atomicAdd(a.race_arrivals + s, 1u) + 1 == static_cast<unsigned>(a.chunks);
    if (last) {
      a.race_arrivals[s] = 0;
      a.ready[s] = 0;  // every race item of s has read it
    }
    sh.flag = last;
  }
  __syncthreads();
  const bool last = sh.flag;
  __syncthreads();
  if (last) {
    __threadfence();
    float b = -kInf, f = -kInf;
    int ba = INT_MAX, fa = INT_MAX;
    for (int i = threadIdx.x; i < a.chunks; i += kThreads) {
      const int64_t x = static_cast<int64_t>(s) * a.chunks + i;
      const float kk = __ldcg(a.race_key + x), fk = __ldcg(a.fallback_key + x);
      const int ka = __ldcg(a.race_arg + x), fka = __ldcg(a.fallback_arg + x);
      if (better(kk, ka, b, ba)) b = kk, ba = ka;
      if (better(fk, fka, f, fa)) f = fk, fa = fka;
    }
    block_max_arg(b, ba, sh.f, sh.i);
    block_max_arg(f, fa, sh.f2, sh.i2);
    if (threadIdx.x == 0) {
      const int token = b >= 0.0f ? ba : fa;  // residual keys are >= 0 where any residual is positive
      a.next_tokens[s] = token;
      a.output_tokens[static_cast<int64_t>(s) * (a.gamma + 1) + k] = token;
    }
  }
  __syncthreads();
}

template <typename T>
__device__ void run(const Args& a) {
  __shared__ Shared sh;
  const int64_t total = static_cast<int64_t>(a.batch) * ((2 * a.gamma + 1) * a.splits + a.chunks);
  int64_t t = blockIdx.x;
  if (t >= total) return;
  Item item = decode(a, t);
  int g = 0;
  uint4 v[kStatsSteps], next_v[kStatsSteps];
  group_loads<T>(a, item, 0, v);
  Fold f{-kInf, 0.0f, INT_MAX};
  while (t < total) {
    // where the list goes next: this stats item's next group, else the block's next item
    Item next = item;
    int64_t next_t = t;
    int next_g = g + 1;
    const bool item_done = !item.stats || item.skip || next_g >= item_groups<T>(a, item);
    if (item_done) {
      next_t = t + gridDim.x, next_g = 0;
      if (next_t < total) next = decode(a, next_t);
    }
    // its loads go out before this group's fold and arrival: their DRAM trip overlaps them
    if (next_t < total) group_loads<T>(a, next, next_g, next_v);
    if (!item.skip) {
      if (item.stats) {
        const bool is_target = item.r <= a.gamma;
        const float inv = inverse_temperature(is_target ? a.target_temperature[item.s] : a.draft_temperature[item.s]) * kLog2e;
        const bool greedy = a.target_temperature[item.s] == 0.0f;
        const bool need_arg = is_target ? greedy : a.draft_temperature[item.s] == 0.0f;  // one-hot rows
        fold_group<T>(a, item, g, v, inv, greedy, need_arg, f);
        if (item_done) {
          finish_stats<T>(a, item, f, greedy, sh);
          f = Fold{-kInf, 0.0f, INT_MAX};
        }
      } else {
        race_item<T>(a, item, sh);
      }
    }
    item = next, t = next_t, g = next_g;
#pragma unroll
    for (int i = 0; i < kStatsSteps; ++i) v[i] = next_v[i];
  }
}

}  // namespace probe

extern "C" __global__ void __launch_bounds__(probe::kThreads, probe::kMinBlocks) _one_launch_probe_bf16_kernel(probe::Args a) {
  probe::run<__nv_bfloat16>(a);
}
extern "C" __global__ void __launch_bounds__(probe::kThreads, probe::kMinBlocks) _one_launch_probe_fp32_kernel(probe::Args a) {
  probe::run<float>(a);
}

extern "C" int probe_blocks_per_sm(int bf16) {
  int blocks = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, bf16 ? _one_launch_probe_bf16_kernel : _one_launch_probe_fp32_kernel, probe::kThreads, 0);
  return blocks;
}

extern "C" int probe_launch(probe::Args args, int bf16, int grid, void* stream) {
  if (bf16) {
    _one_launch_probe_bf16_kernel<<<grid, probe::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  } else {
    _one_launch_probe_fp32_kernel<<<grid, probe::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  }
  return static_cast<int>(cudaGetLastError());
}
