// Where a block of the single-pass verify-and-pack kernel (csrc/verify_pack_scan.cu) spends its time.
//
//   make scan-timeline && build/scan_timeline 16384:4:0.3:128,32:8:0.3:4096 default,g256,pack,pack:g256 21
//
// A point is batch:γ:α:kv_dim (fp16 KV, int64 tokens, k ~ Binomial(γ, α), as the scale-kv grid); a variant is
// `default` or one tile-rule knob (g<groups>, m<KiB>, w<waves>, t<KiB>, l<KiB>, b1, p1, p2: ScanTiling, see
// scan_tiles.py), timing `fused`'s launch; `pack` or `pack:<knob>` times the same kernel as `pack_scan` launches it
// (the lengths given, so "verdict" is reading them). Each point runs cold (a 512 MiB reading flush before every
// launch), with only its code warm (the flush, then a one-sequence launch that brings the kernel's instructions back
// into L2) and warm, `reps` timed launches each, and prints medians over launches of:
//   span      first block's entry to the last block's last store issued (global timer, µs)
//   last*     when the last block started, had its verdict, had its prefix (µs from the first entry)
//   verdict, pre-look-back, first window, look-back, copy
//             a block's phases (median block, SM clock): entry to verdict; verdict to entering the look-back
//             (the block scan, publishing, the source tables, issuing the first KV loads); the look-back's start
//             to its first window all published; verdict to prefix; prefix to the last store issued
//   polls     reads of a status word not yet published (median block, 90th percentile)
// It times the kernel with its marks compiled in (a store per mark by one thread), not the extension's
// build: `python -m sdbench.commands.scan_tiles` gives the GPU time. Outputs are not checked here;
// tests/gpu/test_verify_pack_scan.py does that for the same source.
#define SDBENCH_SCAN_TIMELINE 1
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../verify_pack_scan.cu"

using namespace sdbench;
constexpr int kSlots = scan::kTimelineSlots;

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e = (x);                                                                 \
    if (e != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

__global__ void flush_read(const int4* data, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    acc ^= data[i].x;
  }
  if (acc == 0x12345) *sink = acc;  // never true for the flush's bytes; keeps the loads
}

static double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}
static double median(const std::vector<double>& v) { return quantile(v, 0.5); }

static std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return parts;
}

static ScanTiling tiling_of(const std::string& variant) {
  ScanTiling tiling{};
  if (variant == "default") return tiling;
  const int64_t value = std::stoll(variant.substr(1));
  switch (variant[0]) {
    case 'g': tiling.look_back_groups = value; break;
    case 'm': tiling.min_tile_bytes = value * 1024; break;
    case 'w': tiling.waves = value; break;
    case 't': tiling.max_tile_bytes = value * 1024; break;
    case 'l': tiling.late_load_bytes = value * 1024; break;
    case 'b':
      if (value != 1) {
        fprintf(stderr, "unknown variant %s (b1 only)\n", variant.c_str());
        exit(2);
      }
      tiling.scan_mode = value;
      break;
    case 'p':
      if (value != 1 && value != 2) {
        fprintf(stderr, "unknown variant %s (p1: tiles never in pairs, p2: always)\n", variant.c_str());
        exit(2);
      }
      tiling.pairs = value;
      break;
    default: fprintf(stderr, "unknown variant %s\n", variant.c_str()); exit(2);
  }
  return tiling;
}

struct Buffers {  // one verify_pack workload on the device
  int64_t *draft = nullptr, *target = nullptr, *lengths = nullptr, *next = nullptr, *offsets = nullptr;
  bool* mismatch = nullptr;
  char *kv = nullptr, *packed = nullptr;
  int64_t* state = nullptr;
  int32_t* flags = nullptr;
  Buffers(int64_t b, int64_t g, int64_t row_bytes, const std::vector<int64_t>& d, const std::vector<int64_t>& t,
          const std::vector<int64_t>& k) {
    CHECK(cudaMalloc(&draft, b * g * 8));
    CHECK(cudaMalloc(&target, b * (g + 1) * 8));
    CHECK(cudaMemcpy(draft, d.data(), b * g * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(target, t.data(), b * (g + 1) * 8, cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&lengths, b * 8));
    CHECK(cudaMemcpy(lengths, k.data(), b * 8, cudaMemcpyHostToDevice));  // pack's given lengths (fused overwrites)
    CHECK(cudaMalloc(&flags, b * 4));
    CHECK(cudaMalloc(&next, b * 8));
    CHECK(cudaMalloc(&offsets, b * 8));
    CHECK(cudaMalloc(&mismatch, b));
    CHECK(cudaMalloc(&kv, b * g * row_bytes));
    CHECK(cudaMemset(kv, 3, b * g * row_bytes));
    CHECK(cudaMalloc(&packed, b * g * row_bytes));
    CHECK(cudaMalloc(&state, scan_state_elems() * 8));
    CHECK(cudaMemset(state, 0, scan_state_elems() * 8));
  }
  ~Buffers() {
    for (void* p : {static_cast<void*>(draft), static_cast<void*>(target), static_cast<void*>(lengths),
                    static_cast<void*>(next), static_cast<void*>(offsets), static_cast<void*>(mismatch),
                    static_cast<void*>(kv), static_cast<void*>(packed), static_cast<void*>(state),
                    static_cast<void*>(flags)}) {
      cudaFree(p);
    }
  }
  // pack: the same kernel on given lengths (pack_scan), which reads k instead of verifying
  void launch(int64_t b, int64_t g, int64_t row_bytes, ScanTiling tiling, bool pack) const {
    if (pack) {
      CHECK(launch_pack_scan(kv, lengths, packed, offsets, flags, b, g, row_bytes, state, tiling, 0));
    } else {
      CHECK(launch_fused_scan(TokenType::kInt64, draft, target, kv, lengths, mismatch, next, packed, offsets, b, g,
                              row_bytes, state, tiling, 0));
    }
  }
};

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s b:γ:α:kv[,...] [variant,...] [reps]\n", argv[0]);
    return 2;
  }
  const std::vector<std::string> points = split(argv[1]);
  const std::vector<std::string> variants = split(argc > 2 ? argv[2] : "default");
  const int reps = argc > 3 ? atoi(argv[3]) : 21;
  const size_t flush_bytes = size_t{512} << 20;
  int4* flush = nullptr;
  int* sink = nullptr;
  CHECK(cudaMalloc(&flush, flush_bytes));
  CHECK(cudaMemset(flush, 1, flush_bytes));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  unsigned long long* timeline = nullptr;
  CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&timeline), scan::g_scan_timeline));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  printf("%s; µs, medians over %d launches\n", prop.name, reps);
  printf("%-20s %-10s %-4s %5s | %6s %6s %6s %6s | %7s %7s %7s %7s %6s | %s\n", "point", "variant", "L2", "grid",
         "span", "last", "lastv", "lastp", "verdict", "pre-lb", "window1", "lookbk", "copy", "polls 50/90");
  for (const std::string& point : points) {
    long long b = 0, g = 0, kv_dim = 0;
    double alpha = 0;
    if (sscanf(point.c_str(), "%lld:%lld:%lf:%lld", &b, &g, &alpha, &kv_dim) != 4 || b < 1 || g < 1 || kv_dim < 1) {
      fprintf(stderr, "bad point %s\n", point.c_str());
      return 2;
    }
    const int64_t row_bytes = kv_dim * 2;
    std::mt19937_64 rng(1234);
    std::binomial_distribution<int> accepted_of(static_cast<int>(g), alpha);
    std::vector<int64_t> draft(b * g), target(b * (g + 1)), lengths(b);
    for (int64_t i = 0; i < b; ++i) {
      const int k = accepted_of(rng);
      lengths[i] = k;
      for (int64_t j = 0; j < g; ++j) draft[i * g + j] = 1000 + j;
      for (int64_t j = 0; j <= g; ++j) target[i * (g + 1) + j] = j < k ? 1000 + j : 7;
    }
    const Buffers work(b, g, row_bytes, draft, target, lengths);
    const Buffers one(1, g, row_bytes, draft, target, lengths);  // brings the code back into L2 after a flush
    for (const std::string& variant : variants) {
      // `pack` or `pack:<knob>`: pack_scan's launch (given lengths); otherwise fused's
      const bool pack = variant == "pack" || variant.rfind("pack:", 0) == 0;
      const ScanTiling tiling = tiling_of(pack ? (variant == "pack" ? "default" : variant.substr(5)) : variant);
      const scan::TileShape shape = scan::tile_shape(b, g, row_bytes, scan::multiprocessor_count(), tiling);
      const int64_t grid = (b + shape.seqs_per_tile - 1) / shape.seqs_per_tile * shape.chunks_per_seq;
      const int64_t marked = std::min<int64_t>(grid, scan::kTimelineBlocks);
      for (const std::string l2 : {"cold", "code", "warm"}) {
        std::vector<double> span, last_start, last_verdict, last_prefix, verdict, pre, window, look_back, copy, polls,
            polls90;
        for (int r = 0; r < reps + 2; ++r) {  // two untimed launches first
          CHECK(cudaMemset(timeline, 0, marked * kSlots * 8));
          if (l2 != "warm") flush_read<<<1056, 512>>>(flush, flush_bytes / 16, sink);
          if (l2 == "code") one.launch(1, g, row_bytes, tiling, pack);
          work.launch(b, g, row_bytes, tiling, pack);
          CHECK(cudaDeviceSynchronize());
          if (r < 2) continue;
          std::vector<unsigned long long> t(marked * kSlots);
          CHECK(cudaMemcpy(t.data(), timeline, t.size() * 8, cudaMemcpyDeviceToHost));
          // ns per SM clock, from blocks that have both timers; the first entry is time 0
          std::vector<double> ratio;
          unsigned long long first = ~0ull;
          for (int64_t i = 0; i < marked; ++i) {
            const unsigned long long* s = &t[i * kSlots];
            if (s[5] != 0) first = std::min(first, s[5]);
            if (s[5] != 0 && s[6] > s[5] && s[3] > s[0]) ratio.push_back(double(s[6] - s[5]) / double(s[3] - s[0]));
          }
          const double ns = median(ratio) / 1000.0;  // µs per clock
          double end = 0, started = 0, verdicts = 0, prefixes = 0;
          std::vector<double> block_polls;
          for (int64_t i = 0; i < marked; ++i) {
            const unsigned long long* s = &t[i * kSlots];
            if (s[5] == 0) continue;
            const double entry = (s[5] - first) / 1000.0;
            started = std::max(started, entry);
            if (s[1] != 0) {
              verdicts = std::max(verdicts, entry + (s[1] - s[0]) * ns);
              verdict.push_back((s[1] - s[0]) * ns);
            }
            if (s[2] == 0) continue;  // a chunk with nothing to copy leaves before its look-back
            prefixes = std::max(prefixes, entry + (s[2] - s[0]) * ns);
            look_back.push_back((s[2] - s[1]) * ns);
            if (s[9] != 0) pre.push_back((s[9] - s[1]) * ns);
            if (s[7] != 0 && s[9] != 0) window.push_back((s[7] - s[9]) * ns);
            block_polls.push_back(static_cast<double>(s[8]));
            copy.push_back((s[3] - s[2]) * ns);
            end = std::max(end, (s[6] - first) / 1000.0);
          }
          span.push_back(end);
          last_start.push_back(started);
          last_verdict.push_back(verdicts);
          last_prefix.push_back(prefixes);
          polls.push_back(median(block_polls));
          polls90.push_back(quantile(block_polls, 0.9));
        }
        printf("%-20s %-10s %-4s %5lld | %6.2f %6.2f %6.2f %6.2f | %7.3f %7.3f %7.3f %7.3f %6.3f | %.0f / %.0f\n",
               point.c_str(), variant.c_str(), l2.c_str(), static_cast<long long>(grid), median(span), median(last_start),
               median(last_verdict), median(last_prefix), median(verdict), median(pre), median(window),
               median(look_back), median(copy), median(polls), median(polls90));
        fflush(stdout);
      }
    }
  }
  return 0;
}
