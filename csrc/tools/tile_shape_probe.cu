// The tile rule of csrc/verify_pack_scan.cu (tile_shape) for given shapes, on the host: no GPU needed.
//
//   nvcc -std=c++17 -I csrc csrc/tools/tile_shape_probe.cu -o build/tile_shape_probe
//   build/tile_shape_probe 132 256:32:8192 32:128:8192:late=32768 256:32:8192:waves=2
//
// First the SM count, then points batch:γ:row_bytes with optional :knob=value (ScanTiling's fields: waves,
// max_tile_bytes, look_back_groups, min_tile_bytes, fixed_chunks, late_load_bytes as `late`, scan_mode, pairs). One
// line a point:
//   <point> chunks_per_seq=<n> seqs_per_tile=<n> chunk_bytes=<n> warp_scan=<0|1> late_loads=<0|1> pairs=<0|1|2>
// tests/test_csrc_compile.py checks the rule's documented cases with it (CI has nvcc and no GPU).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "../verify_pack_scan.cu"

using namespace sdbench;

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s sms batch:gamma:row_bytes[:knob=value...] ...\n", argv[0]);
    return 2;
  }
  const int sms = std::atoi(argv[1]);
  for (int i = 2; i < argc; ++i) {
    const std::string point = argv[i];
    int64_t numbers[3] = {0, 0, 0};
    ScanTiling tiling{};
    size_t start = 0;
    for (int field = 0; start <= point.size(); ++field) {
      const size_t colon = point.find(':', start);
      const std::string part = point.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (field < 3) {
        numbers[field] = std::stoll(part);
      } else {
        const size_t equals = part.find('=');
        const std::string knob = part.substr(0, equals);
        const int64_t value = std::stoll(part.substr(equals + 1));
        if (knob == "waves") tiling.waves = value;
        else if (knob == "max_tile_bytes") tiling.max_tile_bytes = value;
        else if (knob == "look_back_groups") tiling.look_back_groups = value;
        else if (knob == "min_tile_bytes") tiling.min_tile_bytes = value;
        else if (knob == "fixed_chunks") tiling.fixed_chunks = value;
        else if (knob == "late") tiling.late_load_bytes = value;
        else if (knob == "scan_mode") tiling.scan_mode = value;
        else if (knob == "pairs") tiling.pairs = value;
        else {
          fprintf(stderr, "unknown knob %s\n", knob.c_str());
          return 2;
        }
      }
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    const scan::TileShape shape = scan::tile_shape(numbers[0], numbers[1], numbers[2], sms, tiling);
    printf("%s chunks_per_seq=%d seqs_per_tile=%d chunk_bytes=%lld warp_scan=%d late_loads=%d pairs=%d\n",
           point.c_str(), shape.chunks_per_seq, shape.seqs_per_tile, static_cast<long long>(shape.chunk_bytes),
           shape.warp_scan ? 1 : 0, shape.late_loads ? 1 : 0, static_cast<int>(shape.pairing));
  }
  return 0;
}
