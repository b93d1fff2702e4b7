// A probe of issue #18's one-launch design from logits (csrc/tools/logits_one_launch.cu): its arguments.
// Pure C++ (no CUDA, no torch): included by the .cu and by the probe's torch wrapper
// (sdbench/commands/logits_one_launch.py).
#pragma once

#include <cstdint>

namespace probe {

struct Args {
  const void* target;               // [B, gamma+1, V] bf16 or fp32
  const void* draft;                // [B, gamma, V]
  const int64_t* tokens;            // [B, gamma]
  const float* target_temperature;  // [B], 0 = greedy
  const float* draft_temperature;   // [B]
  const float* uniforms;            // [B, gamma], or null: Philox (fast randomness)
  const float* noise;               // [B, V] exponential noise, or null: Philox
  int batch, gamma, vocab;
  int splits, span;    // stats items: `splits` a row, `span` columns each (whole 16 KiB groups)
  int chunks, chunk;   // the race's items: `chunks` a sequence, `chunk` columns each
  int lag;             // a sequence's race items follow the stats items of `lag` later sequences
  uint64_t seed, offset;
  // state: zero before a launch and zero again after it (graph-safe without a reset launch)
  float* part_max;  // [B, 2*gamma+1, splits]
  float* part_sum;
  int* part_arg;
  unsigned* arrivals;       // [B] stats items arrived
  unsigned* race_arrivals;  // [B] race items arrived
  int* ready;               // [B] k and row k's normalisers published
  float* race_info;         // [B, 8]
  float* race_key;          // [B, chunks] each chunk's best residual key
  int* race_arg;
  float* fallback_key;      // [B, chunks] each chunk's best fallback key (no positive residual anywhere)
  int* fallback_arg;
  // outputs
  int64_t* accepted_lengths;  // [B]
  int64_t* next_tokens;       // [B]
  int64_t* output_tokens;     // [B, gamma+1]
  int32_t* error_flags;       // [B]
};

}  // namespace probe

extern "C" int probe_blocks_per_sm(int bf16);
extern "C" int probe_launch(probe::Args args, int bf16, int grid, void* stream);
