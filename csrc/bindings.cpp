// The only file that knows torch: tensor checks, the current CUDA stream, dtype dispatch and the
// `sdbench::` custom-op registration. Kernels and launchers live in the pure-CUDA csrc/*.cu files.
//
// Outputs are caller-provided and mutated (alias annotations `Tensor(a!)`), so every op but
// pack_naive is allocation-free apart from the cooperative drivers' small scratch workspace (taken
// from the caching allocator: no sync, graph-capturable), and none of them synchronizes the host.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>  // at::cuda::getCurrentCUDAStream is this, without cuBLAS/cuSPARSE headers
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "common.cuh"

namespace sdbench {
namespace {

constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();  // B*gamma must fit int32 (shared scans)

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, "sdbench.", op, ": kernel launch failed: ", cudaGetErrorString(err));
}

void check_cuda_contiguous(const at::Tensor& t, const char* name, const at::Device& device) {
  TORCH_CHECK(t.is_cuda(), "sdbench: ", name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.device() == device, "sdbench: ", name, " is on ", t.device(), " but the inputs are on ", device);
  TORCH_CHECK(t.is_contiguous(), "sdbench: ", name, " must be contiguous (call .contiguous() first)");
}

void check_output(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape,
                  const at::Device& device) {
  check_cuda_contiguous(t, name, device);
  TORCH_CHECK(t.scalar_type() == dtype, "sdbench: ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.sizes() == shape, "sdbench: ", name, " must have shape ", shape, ", got ", t.sizes());
}

TokenType token_type_of(const at::Tensor& tokens) {
  return tokens.scalar_type() == at::kLong ? TokenType::kInt64 : TokenType::kInt32;
}

// draft [B, gamma] and target [B, gamma+1], same integer dtype and device; returns {B, gamma}.
std::tuple<int64_t, int64_t> check_tokens(const at::Tensor& draft, const at::Tensor& target) {
  check_cuda_contiguous(draft, "draft_tokens", draft.device());
  check_cuda_contiguous(target, "target_tokens", draft.device());
  TORCH_CHECK(draft.scalar_type() == at::kLong || draft.scalar_type() == at::kInt,
              "sdbench: draft_tokens must be int64 or int32, got ", draft.scalar_type());
  TORCH_CHECK(target.scalar_type() == draft.scalar_type(), "sdbench: target_tokens must have draft_tokens' dtype ",
              draft.scalar_type(), ", got ", target.scalar_type());
  TORCH_CHECK(draft.dim() == 2, "sdbench: draft_tokens must be [B, gamma], got shape ", draft.sizes());
  const int64_t batch = draft.size(0), gamma = draft.size(1);
  TORCH_CHECK(gamma >= 1, "sdbench: gamma (draft_tokens.size(1)) must be >= 1");
  TORCH_CHECK(target.dim() == 2 && target.size(0) == batch && target.size(1) == gamma + 1,
              "sdbench: target_tokens must be [B, gamma+1] = [", batch, ", ", gamma + 1, "], got ", target.sizes());
  TORCH_CHECK(batch * gamma <= kMaxRows, "sdbench: B*gamma = ", batch * gamma, " exceeds ", kMaxRows);
  return {batch, gamma};
}

void check_verify_outputs(const at::Tensor& draft, int64_t batch, const at::Tensor& accepted_lengths,
                          const at::Tensor& has_mismatch, const at::Tensor& next_tokens) {
  check_output(accepted_lengths, "accepted_lengths", at::kLong, {batch}, draft.device());
  check_output(has_mismatch, "has_mismatch", at::kBool, {batch}, draft.device());
  check_output(next_tokens, "next_tokens", draft.scalar_type(), {batch}, draft.device());
}

// draft_kv [B, gamma, kv_dim] fp16/bf16; returns row_bytes.
int64_t check_kv(const at::Tensor& draft_kv, int64_t batch, int64_t gamma, const at::Device& device) {
  check_cuda_contiguous(draft_kv, "draft_kv", device);
  TORCH_CHECK(draft_kv.scalar_type() == at::kHalf || draft_kv.scalar_type() == at::kBFloat16,
              "sdbench: draft_kv must be float16 or bfloat16, got ", draft_kv.scalar_type());
  TORCH_CHECK(draft_kv.dim() == 3 && draft_kv.size(0) == batch && draft_kv.size(1) == gamma,
              "sdbench: draft_kv must be [B, gamma, kv_dim] with B=", batch, ", gamma=", gamma, ", got ",
              draft_kv.sizes());
  TORCH_CHECK(draft_kv.size(2) >= 1, "sdbench: kv_dim must be >= 1");
  return draft_kv.size(2) * static_cast<int64_t>(draft_kv.element_size());
}

// packed_kv [>= B*gamma, kv_dim] (rows past sum k are left as they are), packed_offsets int64 [B].
void check_pack_outputs(const at::Tensor& draft_kv, const at::Tensor& packed_kv, const at::Tensor& packed_offsets) {
  const int64_t batch = draft_kv.size(0), gamma = draft_kv.size(1), kv_dim = draft_kv.size(2);
  check_cuda_contiguous(packed_kv, "packed_kv", draft_kv.device());
  TORCH_CHECK(packed_kv.scalar_type() == draft_kv.scalar_type(), "sdbench: packed_kv must have draft_kv's dtype ",
              draft_kv.scalar_type(), ", got ", packed_kv.scalar_type());
  TORCH_CHECK(packed_kv.dim() == 2 && packed_kv.size(0) >= batch * gamma && packed_kv.size(1) == kv_dim,
              "sdbench: packed_kv must be [B*gamma, kv_dim] = [", batch * gamma, ", ", kv_dim,
              "] (preallocated for the worst case), got ", packed_kv.sizes());
  check_output(packed_offsets, "packed_offsets", at::kLong, {batch}, draft_kv.device());
}

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// ---- ops ------------------------------------------------------------------------------------------

// `dummy` only routes the call to the CUDA kernel of its device: the dispatcher needs a tensor, and
// paying the same dispatch as the real ops keeps the launch floor comparable.
void empty_op(const at::Tensor& dummy) {
  const c10::cuda::CUDAGuard guard(dummy.device());
  check_launch(launch_empty(current_stream()), "empty");
}

using VerifyLauncher = cudaError_t (*)(TokenType, const void*, const void*, int64_t*, bool*, void*, int64_t, int64_t,
                                       cudaStream_t);

void run_verify(VerifyLauncher launcher, const char* op, const at::Tensor& draft_tokens,
                const at::Tensor& target_tokens, at::Tensor& accepted_lengths, at::Tensor& has_mismatch,
                at::Tensor& next_tokens) {
  const auto [batch, gamma] = check_tokens(draft_tokens, target_tokens);
  check_verify_outputs(draft_tokens, batch, accepted_lengths, has_mismatch, next_tokens);
  const c10::cuda::CUDAGuard guard(draft_tokens.device());
  check_launch(launcher(token_type_of(draft_tokens), draft_tokens.data_ptr(), target_tokens.data_ptr(),
                        accepted_lengths.data_ptr<int64_t>(), has_mismatch.data_ptr<bool>(), next_tokens.data_ptr(),
                        batch, gamma, current_stream()),
               op);
}

void verify_naive_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens, at::Tensor& accepted_lengths,
                     at::Tensor& has_mismatch, at::Tensor& next_tokens) {
  run_verify(launch_verify_naive, "verify_naive", draft_tokens, target_tokens, accepted_lengths, has_mismatch,
             next_tokens);
}

void verify_ballot_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens, at::Tensor& accepted_lengths,
                      at::Tensor& has_mismatch, at::Tensor& next_tokens) {
  run_verify(launch_verify_ballot, "verify_ballot", draft_tokens, target_tokens, accepted_lengths, has_mismatch,
             next_tokens);
}

void check_lengths(const at::Tensor& accepted_lengths, int64_t batch, const at::Device& device) {
  check_output(accepted_lengths, "accepted_lengths", at::kLong, {batch}, device);
}

// The published packer, flaws kept: offsets by a host-launched cumsum and a .item() sync for the
// output size. Lengths are clamped to [0, gamma] first so bad input cannot write out of bounds.
std::tuple<at::Tensor, at::Tensor> pack_naive_op(const at::Tensor& draft_kv, const at::Tensor& accepted_lengths) {
  check_cuda_contiguous(draft_kv, "draft_kv", draft_kv.device());
  TORCH_CHECK(draft_kv.dim() == 3, "sdbench: draft_kv must be [B, gamma, kv_dim], got ", draft_kv.sizes());
  const int64_t batch = draft_kv.size(0), gamma = draft_kv.size(1);
  const int64_t row_bytes = check_kv(draft_kv, batch, gamma, draft_kv.device());
  check_lengths(accepted_lengths, batch, draft_kv.device());
  const c10::cuda::CUDAGuard guard(draft_kv.device());
  const at::Tensor lengths = accepted_lengths.clamp(0, gamma);
  const at::Tensor packed_offsets = at::cumsum(lengths, 0) - lengths;
  const int64_t total_rows = lengths.sum().item<int64_t>();  // host sync, as published
  at::Tensor packed_kv = at::empty({total_rows, draft_kv.size(2)}, draft_kv.options());
  check_launch(launch_pack_naive(draft_kv.data_ptr(), lengths.data_ptr<int64_t>(), packed_offsets.data_ptr<int64_t>(),
                                 packed_kv.data_ptr(), batch, gamma, row_bytes, current_stream()),
               "pack_naive");
  return {packed_kv, packed_offsets};
}

at::Tensor workspace_for(int64_t elems, const at::Tensor& like) {
  return at::empty({elems > 0 ? elems : 1}, like.options().dtype(at::kLong));
}

// error_flags: int32 [B] written with kLengthOutOfRange where a length was clamped, or nullptr
// (`pack`, whose schema predates the flags, writes none; `pack_flagged` writes them).
void pack_into(const at::Tensor& draft_kv, const at::Tensor& accepted_lengths, at::Tensor& packed_kv,
               at::Tensor& packed_offsets, int32_t* error_flags) {
  check_cuda_contiguous(draft_kv, "draft_kv", draft_kv.device());
  TORCH_CHECK(draft_kv.dim() == 3, "sdbench: draft_kv must be [B, gamma, kv_dim], got ", draft_kv.sizes());
  const int64_t batch = draft_kv.size(0), gamma = draft_kv.size(1);
  TORCH_CHECK(batch * gamma <= kMaxRows, "sdbench: B*gamma = ", batch * gamma, " exceeds ", kMaxRows);
  const int64_t row_bytes = check_kv(draft_kv, batch, gamma, draft_kv.device());
  check_lengths(accepted_lengths, batch, draft_kv.device());
  check_pack_outputs(draft_kv, packed_kv, packed_offsets);
  const c10::cuda::CUDAGuard guard(draft_kv.device());
  const int64_t elems = pack_workspace_elems(batch, gamma, row_bytes);
  at::Tensor workspace = elems > 0 ? workspace_for(elems, draft_kv) : at::Tensor();
  check_launch(launch_pack(draft_kv.data_ptr(), accepted_lengths.data_ptr<int64_t>(), packed_kv.data_ptr(),
                           packed_offsets.data_ptr<int64_t>(), error_flags, batch, gamma, row_bytes,
                           elems > 0 ? workspace.data_ptr<int64_t>() : nullptr, current_stream()),
               "pack");
}

void pack_op(const at::Tensor& draft_kv, const at::Tensor& accepted_lengths, at::Tensor& packed_kv,
             at::Tensor& packed_offsets) {
  pack_into(draft_kv, accepted_lengths, packed_kv, packed_offsets, nullptr);
}

void pack_flagged_op(const at::Tensor& draft_kv, const at::Tensor& accepted_lengths, at::Tensor& packed_kv,
                     at::Tensor& packed_offsets, at::Tensor& error_flags) {
  check_output(error_flags, "error_flags", at::kInt, {draft_kv.size(0)}, draft_kv.device());
  pack_into(draft_kv, accepted_lengths, packed_kv, packed_offsets, error_flags.data_ptr<int32_t>());
}

struct FusedArgs {
  int64_t batch, gamma, row_bytes;
};

FusedArgs check_fused(const at::Tensor& draft_tokens, const at::Tensor& target_tokens, const at::Tensor& draft_kv,
                      const at::Tensor& accepted_lengths, const at::Tensor& has_mismatch,
                      const at::Tensor& next_tokens, const at::Tensor& packed_kv, const at::Tensor& packed_offsets) {
  const auto [batch, gamma] = check_tokens(draft_tokens, target_tokens);
  check_verify_outputs(draft_tokens, batch, accepted_lengths, has_mismatch, next_tokens);
  const int64_t row_bytes = check_kv(draft_kv, batch, gamma, draft_tokens.device());
  check_pack_outputs(draft_kv, packed_kv, packed_offsets);
  return {batch, gamma, row_bytes};
}

void fused_single_block_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens,
                           const at::Tensor& draft_kv, at::Tensor& accepted_lengths, at::Tensor& has_mismatch,
                           at::Tensor& next_tokens, at::Tensor& packed_kv, at::Tensor& packed_offsets) {
  const FusedArgs a = check_fused(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens,
                                  packed_kv, packed_offsets);
  TORCH_CHECK(a.batch <= 32, "sdbench.fused_single_block: one warp per sequence in one block needs B <= 32, got B=",
              a.batch, "; use sdbench.fused for any B");
  const c10::cuda::CUDAGuard guard(draft_tokens.device());
  check_launch(launch_fused_single_block(token_type_of(draft_tokens), draft_tokens.data_ptr(),
                                         target_tokens.data_ptr(), draft_kv.data_ptr(),
                                         accepted_lengths.data_ptr<int64_t>(), has_mismatch.data_ptr<bool>(),
                                         next_tokens.data_ptr(), packed_kv.data_ptr(),
                                         packed_offsets.data_ptr<int64_t>(), a.batch, a.gamma, a.row_bytes,
                                         current_stream()),
               "fused_single_block");
}

void fused_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens, const at::Tensor& draft_kv,
              at::Tensor& accepted_lengths, at::Tensor& has_mismatch, at::Tensor& next_tokens, at::Tensor& packed_kv,
              at::Tensor& packed_offsets) {
  const FusedArgs a = check_fused(draft_tokens, target_tokens, draft_kv, accepted_lengths, has_mismatch, next_tokens,
                                  packed_kv, packed_offsets);
  const c10::cuda::CUDAGuard guard(draft_tokens.device());
  const TokenType token_type = token_type_of(draft_tokens);
  const int64_t elems = fused_workspace_elems(token_type, a.batch, a.gamma);
  at::Tensor workspace = elems > 0 ? workspace_for(elems, draft_kv) : at::Tensor();
  check_launch(launch_fused(token_type, draft_tokens.data_ptr(), target_tokens.data_ptr(), draft_kv.data_ptr(),
                            accepted_lengths.data_ptr<int64_t>(), has_mismatch.data_ptr<bool>(),
                            next_tokens.data_ptr(), packed_kv.data_ptr(), packed_offsets.data_ptr<int64_t>(), a.batch,
                            a.gamma, a.row_bytes, elems > 0 ? workspace.data_ptr<int64_t>() : nullptr,
                            current_stream()),
               "fused");
}

// Meta kernels (shape-only tracing, torch.compile's fake tensors): the mutating ops return nothing.
void empty_meta(const at::Tensor&) {}
void verify_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&) {}
void pack_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&) {}
void pack_flagged_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&) {}
void fused_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&,
                at::Tensor&, at::Tensor&) {}

}  // namespace
}  // namespace sdbench

TORCH_LIBRARY(sdbench, m) {
  m.def("empty(Tensor dummy) -> ()");
  m.def(
      "verify_naive(Tensor draft_tokens, Tensor target_tokens, Tensor(a!) accepted_lengths, "
      "Tensor(b!) has_mismatch, Tensor(c!) next_tokens) -> ()");
  m.def(
      "verify_ballot(Tensor draft_tokens, Tensor target_tokens, Tensor(a!) accepted_lengths, "
      "Tensor(b!) has_mismatch, Tensor(c!) next_tokens) -> ()");
  m.def("pack_naive(Tensor draft_kv, Tensor accepted_lengths) -> (Tensor, Tensor)");
  m.def("pack(Tensor draft_kv, Tensor accepted_lengths, Tensor(a!) packed_kv, Tensor(b!) packed_offsets) -> ()");
  m.def(
      "pack_flagged(Tensor draft_kv, Tensor accepted_lengths, Tensor(a!) packed_kv, Tensor(b!) packed_offsets, "
      "Tensor(c!) error_flags) -> ()");
  m.def(
      "fused_single_block(Tensor draft_tokens, Tensor target_tokens, Tensor draft_kv, Tensor(a!) accepted_lengths, "
      "Tensor(b!) has_mismatch, Tensor(c!) next_tokens, Tensor(d!) packed_kv, Tensor(e!) packed_offsets) -> ()");
  m.def(
      "fused(Tensor draft_tokens, Tensor target_tokens, Tensor draft_kv, Tensor(a!) accepted_lengths, "
      "Tensor(b!) has_mismatch, Tensor(c!) next_tokens, Tensor(d!) packed_kv, Tensor(e!) packed_offsets) -> ()");
}

TORCH_LIBRARY_IMPL(sdbench, CUDA, m) {
  m.impl("empty", &sdbench::empty_op);
  m.impl("verify_naive", &sdbench::verify_naive_op);
  m.impl("verify_ballot", &sdbench::verify_ballot_op);
  m.impl("pack_naive", &sdbench::pack_naive_op);
  m.impl("pack", &sdbench::pack_op);
  m.impl("pack_flagged", &sdbench::pack_flagged_op);
  m.impl("fused_single_block", &sdbench::fused_single_block_op);
  m.impl("fused", &sdbench::fused_op);
}

TORCH_LIBRARY_IMPL(sdbench, Meta, m) {
  m.impl("empty", &sdbench::empty_meta);
  m.impl("verify_naive", &sdbench::verify_meta);
  m.impl("verify_ballot", &sdbench::verify_meta);
  m.impl("pack", &sdbench::pack_meta);
  m.impl("pack_flagged", &sdbench::pack_flagged_meta);
  m.impl("fused_single_block", &sdbench::fused_meta);
  m.impl("fused", &sdbench::fused_meta);
}

// ==== BEGIN fused_scan / pack_scan (csrc/verify_pack_scan.cu; issue #17) ===========================
// Appended as one block so that edits above and here do not collide. The single-pass kernels keep
// their look-back flags and launch epoch in a caller-owned int64 `scan_state` [scan_state_elems()],
// zeroed once and reused by every call in stream order (one state per stream that may run them).
namespace sdbench {

struct ScanTiling {  // mirrors csrc/verify_pack_scan.cu: the tile rule's knobs, zero = default
  int64_t waves = 0;
  int64_t max_tile_bytes = 0;
  int64_t look_back_groups = 0;
  int64_t min_tile_bytes = 0;
  int64_t fixed_chunks = 0;
  int64_t late_load_bytes = 0;
  int64_t scan_mode = 0;
  int64_t pairs = 0;
};
int64_t scan_state_elems();
int64_t scan_max_batch();
cudaError_t launch_fused_scan(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                              const void* draft_kv, int64_t* accepted_lengths, bool* has_mismatch, void* next_tokens,
                              void* packed_kv, int64_t* packed_offsets, int64_t batch, int64_t gamma,
                              int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream);
cudaError_t launch_pack_scan(const void* draft_kv, const int64_t* accepted_lengths, void* packed_kv,
                             int64_t* packed_offsets, int32_t* error_flags, int64_t batch, int64_t gamma,
                             int64_t row_bytes, int64_t* scan_state, ScanTiling tiling, cudaStream_t stream);

namespace {

// The tile rule's knobs (benchmarks vary them): 0 = the default; bounded so no product overflows.
ScanTiling check_tiling(int64_t waves, int64_t max_tile_bytes, int64_t look_back_groups, int64_t min_tile_bytes,
                        int64_t fixed_chunks, int64_t late_load_bytes, int64_t scan_mode, int64_t pairs) {
  constexpr int64_t kMaxWaves = 1024, kMaxBytes = int64_t{1} << 40, kMaxGroups = 65536;
  TORCH_CHECK(waves >= 0 && waves <= kMaxWaves, "sdbench: tile_waves must be in [0, ", kMaxWaves, "], got ", waves);
  TORCH_CHECK(max_tile_bytes >= 0 && max_tile_bytes <= kMaxBytes, "sdbench: tile_max_bytes must be in [0, 2^40], got ",
              max_tile_bytes);
  TORCH_CHECK(min_tile_bytes >= 0 && min_tile_bytes <= kMaxBytes, "sdbench: tile_min_bytes must be in [0, 2^40], got ",
              min_tile_bytes);
  TORCH_CHECK(look_back_groups >= 0 && look_back_groups <= kMaxGroups, "sdbench: look_back_groups must be in [0, ",
              kMaxGroups, "], got ", look_back_groups);
  TORCH_CHECK(fixed_chunks == 0 || fixed_chunks == 1, "sdbench: fixed_chunks must be in {0, 1}, got ", fixed_chunks);
  TORCH_CHECK(late_load_bytes >= 0 && late_load_bytes <= kMaxBytes,
              "sdbench: late_load_bytes must be in [0, 2^40], got ", late_load_bytes);
  TORCH_CHECK(scan_mode == 0 || scan_mode == 1, "sdbench: scan_mode must be in {0, 1}, got ", scan_mode);
  TORCH_CHECK(pairs >= 0 && pairs <= 2, "sdbench: pairs must be in {0, 1, 2}, got ", pairs);
  return ScanTiling{waves,        max_tile_bytes,  look_back_groups, min_tile_bytes,
                    fixed_chunks, late_load_bytes, scan_mode,        pairs};
}

void check_scan_state(const at::Tensor& scan_state, int64_t batch, const at::Device& device) {
  check_output(scan_state, "scan_state", at::kLong, {scan_state_elems()}, device);
  TORCH_CHECK(batch <= scan_max_batch(), "sdbench: the single-pass scan handles B <= ", scan_max_batch(), ", got B=",
              batch, "; use sdbench.fused / sdbench.pack");
}

void fused_scan_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens, const at::Tensor& draft_kv,
                   at::Tensor& accepted_lengths, at::Tensor& has_mismatch, at::Tensor& next_tokens,
                   at::Tensor& packed_kv, at::Tensor& packed_offsets, at::Tensor& scan_state, int64_t tile_waves,
                   int64_t tile_max_bytes, int64_t look_back_groups, int64_t tile_min_bytes,
                   int64_t fixed_chunks, int64_t late_load_bytes, int64_t scan_mode, int64_t pairs) {
  const auto [batch, gamma] = check_tokens(draft_tokens, target_tokens);
  check_output(accepted_lengths, "accepted_lengths", at::kLong, {batch}, draft_tokens.device());
  check_output(has_mismatch, "has_mismatch", at::kBool, {batch}, draft_tokens.device());
  check_output(next_tokens, "next_tokens", draft_tokens.scalar_type(), {batch}, draft_tokens.device());
  const int64_t row_bytes = check_kv(draft_kv, batch, gamma, draft_tokens.device());
  check_pack_outputs(draft_kv, packed_kv, packed_offsets);
  check_scan_state(scan_state, batch, draft_tokens.device());
  const c10::cuda::CUDAGuard guard(draft_tokens.device());
  check_launch(launch_fused_scan(token_type_of(draft_tokens), draft_tokens.data_ptr(), target_tokens.data_ptr(),
                                 draft_kv.data_ptr(), accepted_lengths.data_ptr<int64_t>(),
                                 has_mismatch.data_ptr<bool>(), next_tokens.data_ptr(), packed_kv.data_ptr(),
                                 packed_offsets.data_ptr<int64_t>(), batch, gamma, row_bytes,
                                 scan_state.data_ptr<int64_t>(),
                                 check_tiling(tile_waves, tile_max_bytes, look_back_groups, tile_min_bytes,
                                              fixed_chunks, late_load_bytes, scan_mode, pairs),
                                 current_stream()),
               "fused_scan");
}

void pack_scan_op(const at::Tensor& draft_kv, const at::Tensor& accepted_lengths, at::Tensor& packed_kv,
                  at::Tensor& packed_offsets, at::Tensor& error_flags, at::Tensor& scan_state, int64_t tile_waves,
                  int64_t tile_max_bytes, int64_t look_back_groups, int64_t tile_min_bytes,
                  int64_t fixed_chunks, int64_t late_load_bytes, int64_t scan_mode, int64_t pairs) {
  check_cuda_contiguous(draft_kv, "draft_kv", draft_kv.device());
  TORCH_CHECK(draft_kv.dim() == 3, "sdbench: draft_kv must be [B, gamma, kv_dim], got ", draft_kv.sizes());
  const int64_t batch = draft_kv.size(0), gamma = draft_kv.size(1);
  TORCH_CHECK(gamma >= 1, "sdbench: gamma (draft_kv.size(1)) must be >= 1");
  TORCH_CHECK(batch * gamma <= kMaxRows, "sdbench: B*gamma = ", batch * gamma, " exceeds ", kMaxRows);
  const int64_t row_bytes = check_kv(draft_kv, batch, gamma, draft_kv.device());
  check_output(accepted_lengths, "accepted_lengths", at::kLong, {batch}, draft_kv.device());
  check_pack_outputs(draft_kv, packed_kv, packed_offsets);
  check_output(error_flags, "error_flags", at::kInt, {batch}, draft_kv.device());
  check_scan_state(scan_state, batch, draft_kv.device());
  const c10::cuda::CUDAGuard guard(draft_kv.device());
  check_launch(launch_pack_scan(draft_kv.data_ptr(), accepted_lengths.data_ptr<int64_t>(), packed_kv.data_ptr(),
                                packed_offsets.data_ptr<int64_t>(), error_flags.data_ptr<int32_t>(), batch, gamma,
                                row_bytes, scan_state.data_ptr<int64_t>(),
                                check_tiling(tile_waves, tile_max_bytes, look_back_groups, tile_min_bytes, fixed_chunks,
                                              late_load_bytes, scan_mode, pairs),
                                current_stream()),
               "pack_scan");
}

void fused_scan_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&,
                     at::Tensor&, at::Tensor&, at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t, int64_t) {}
void pack_scan_meta(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, int64_t,
                    int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t) {}

}  // namespace
}  // namespace sdbench

TORCH_LIBRARY_FRAGMENT(sdbench, m) {
  m.def(
      "fused_scan(Tensor draft_tokens, Tensor target_tokens, Tensor draft_kv, Tensor(a!) accepted_lengths, "
      "Tensor(b!) has_mismatch, Tensor(c!) next_tokens, Tensor(d!) packed_kv, Tensor(e!) packed_offsets, "
      "Tensor(f!) scan_state, int tile_waves=0, int tile_max_bytes=0, int look_back_groups=0, "
      "int tile_min_bytes=0, int fixed_chunks=0, int late_load_bytes=0, int scan_mode=0, int pairs=0) -> ()");
  m.def(
      "pack_scan(Tensor draft_kv, Tensor accepted_lengths, Tensor(a!) packed_kv, Tensor(b!) packed_offsets, "
      "Tensor(c!) error_flags, Tensor(d!) scan_state, int tile_waves=0, int tile_max_bytes=0, "
      "int look_back_groups=0, int tile_min_bytes=0, int fixed_chunks=0, int late_load_bytes=0, "
      "int scan_mode=0, int pairs=0) -> ()");
}

TORCH_LIBRARY_IMPL(sdbench, CUDA, m) {
  m.impl("fused_scan", &sdbench::fused_scan_op);
  m.impl("pack_scan", &sdbench::pack_scan_op);
}

TORCH_LIBRARY_IMPL(sdbench, Meta, m) {
  m.impl("fused_scan", &sdbench::fused_scan_meta);
  m.impl("pack_scan", &sdbench::pack_scan_meta);
}
// ==== END fused_scan / pack_scan ===================================================================

// ==== BEGIN verify_ragged (csrc/verify_ragged.cu; issue #16) =======================================
// Flattened ragged layout: draft_tokens [T], target_tokens [T + B], cu_num_draft_tokens int64 [B].
namespace sdbench {

cudaError_t launch_verify_ragged_ballot(TokenType token_type, const void* draft_tokens, const void* target_tokens,
                                        const int64_t* cu_num_draft_tokens, int64_t* accepted_lengths,
                                        bool* has_mismatch, void* next_tokens, int64_t batch, int64_t total,
                                        cudaStream_t stream);

namespace {

void verify_ragged_ballot_op(const at::Tensor& draft_tokens, const at::Tensor& target_tokens,
                             const at::Tensor& cu_num_draft_tokens, at::Tensor& accepted_lengths,
                             at::Tensor& has_mismatch, at::Tensor& next_tokens) {
  const at::Device device = draft_tokens.device();
  check_cuda_contiguous(draft_tokens, "draft_tokens", device);
  check_cuda_contiguous(target_tokens, "target_tokens", device);
  check_cuda_contiguous(cu_num_draft_tokens, "cu_num_draft_tokens", device);
  TORCH_CHECK(draft_tokens.scalar_type() == at::kLong || draft_tokens.scalar_type() == at::kInt,
              "sdbench: draft_tokens must be int64 or int32, got ", draft_tokens.scalar_type());
  TORCH_CHECK(target_tokens.scalar_type() == draft_tokens.scalar_type(),
              "sdbench: target_tokens must have draft_tokens' dtype ", draft_tokens.scalar_type());
  TORCH_CHECK(cu_num_draft_tokens.scalar_type() == at::kLong && cu_num_draft_tokens.dim() == 1,
              "sdbench: cu_num_draft_tokens must be int64 [B], got ", cu_num_draft_tokens.scalar_type(), " ",
              cu_num_draft_tokens.sizes());
  const int64_t batch = cu_num_draft_tokens.size(0), total = draft_tokens.numel();
  TORCH_CHECK(draft_tokens.dim() == 1 && target_tokens.dim() == 1 && target_tokens.numel() == total + batch,
              "sdbench: draft_tokens must be [T] and target_tokens [T + B] = [", total + batch, "], got ",
              draft_tokens.sizes(), " and ", target_tokens.sizes());
  check_verify_outputs(draft_tokens, batch, accepted_lengths, has_mismatch, next_tokens);
  const c10::cuda::CUDAGuard guard(device);
  check_launch(launch_verify_ragged_ballot(token_type_of(draft_tokens), draft_tokens.data_ptr(),
                                           target_tokens.data_ptr(), cu_num_draft_tokens.data_ptr<int64_t>(),
                                           accepted_lengths.data_ptr<int64_t>(), has_mismatch.data_ptr<bool>(),
                                           next_tokens.data_ptr(), batch, total, current_stream()),
               "verify_ragged_ballot");
}

void verify_ragged_ballot_meta(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&,
                               at::Tensor&) {}

}  // namespace
}  // namespace sdbench

TORCH_LIBRARY_FRAGMENT(sdbench, m) {
  m.def(
      "verify_ragged_ballot(Tensor draft_tokens, Tensor target_tokens, Tensor cu_num_draft_tokens, "
      "Tensor(a!) accepted_lengths, Tensor(b!) has_mismatch, Tensor(c!) next_tokens) -> ()");
}

TORCH_LIBRARY_IMPL(sdbench, CUDA, m) { m.impl("verify_ragged_ballot", &sdbench::verify_ragged_ballot_op); }

TORCH_LIBRARY_IMPL(sdbench, Meta, m) { m.impl("verify_ragged_ballot", &sdbench::verify_ragged_ballot_meta); }
// ==== END verify_ragged ============================================================================

// ==== BEGIN asbs_loop (csrc/asbs_loop.cu; issue #16) ===============================================
// The launch-once ASBS loop: state tensors are the caller's (sdbench/asbs/device.py) and persist across
// launches; `rounds` bounds what one launch runs.

namespace sdbench {

struct AsbsParams {
  uint32_t seed;
  int rounds;
  int history_rounds;
  float alpha, high, low;
  int min_block, mid_block, max_block, pressure_cap;
  int page_size;
  int64_t capacity_pages;
  int adaptive;
  int kv_dim;
  int max_len;
};

cudaError_t launch_asbs_loop(float* ema, int32_t* block, int32_t* committed, const int32_t* target_len,
                             const int32_t* phase_start, const int32_t* phase_value, int32_t* history,
                             int32_t* round_state, void* kv, int64_t batch, const AsbsParams& params,
                             cudaStream_t stream);

namespace {

void asbs_loop_op(at::Tensor& ema, at::Tensor& block, at::Tensor& committed, const at::Tensor& target_len,
                  const at::Tensor& phase_start, const at::Tensor& phase_value, at::Tensor& history,
                  at::Tensor& round_state, at::Tensor& kv, int64_t seed, int64_t rounds, double alpha, double high,
                  double low, int64_t min_block, int64_t mid_block, int64_t max_block, int64_t pressure_cap,
                  int64_t page_size, int64_t capacity_pages, bool adaptive) {
  const at::Device device = ema.device();
  const int64_t batch = ema.numel();
  check_output(ema, "ema", at::kFloat, {batch}, device);
  check_output(block, "block", at::kInt, {batch}, device);
  check_output(committed, "committed", at::kInt, {batch}, device);
  check_output(target_len, "target_len", at::kInt, {batch}, device);
  check_output(phase_start, "phase_start", at::kInt, {batch, 4}, device);
  check_output(phase_value, "phase_value", at::kInt, {batch, 4}, device);
  check_cuda_contiguous(history, "history", device);
  TORCH_CHECK(history.scalar_type() == at::kInt && history.dim() == 2 && history.size(0) == batch,
              "sdbench: history must be int32 [B, rounds]");
  check_output(round_state, "round_state", at::kInt, {1}, device);
  check_cuda_contiguous(kv, "kv", device);
  TORCH_CHECK(kv.scalar_type() == at::kHalf && (kv.numel() == 0 || (kv.dim() == 3 && kv.size(0) == batch)),
              "sdbench: kv must be float16 [B, max_len, kv_dim] (or empty for none)");
  TORCH_CHECK(max_block <= 32 && min_block >= 1 && min_block <= mid_block && mid_block <= max_block,
              "sdbench: block sizes must satisfy 1 <= min <= mid <= max <= 32");
  TORCH_CHECK(rounds >= 0 && rounds <= (1 << 30), "sdbench: rounds must be in [0, 2^30]");
  AsbsParams params{static_cast<uint32_t>(seed), static_cast<int>(rounds), static_cast<int>(history.size(1)),
                    static_cast<float>(alpha), static_cast<float>(high), static_cast<float>(low),
                    static_cast<int>(min_block), static_cast<int>(mid_block), static_cast<int>(max_block),
                    static_cast<int>(pressure_cap), static_cast<int>(page_size), capacity_pages, adaptive ? 1 : 0,
                    kv.numel() == 0 ? 0 : static_cast<int>(kv.size(2)), kv.numel() == 0 ? 0 : static_cast<int>(kv.size(1))};
  const c10::cuda::CUDAGuard guard(device);
  check_launch(launch_asbs_loop(ema.data_ptr<float>(), block.data_ptr<int32_t>(), committed.data_ptr<int32_t>(),
                                target_len.data_ptr<int32_t>(), phase_start.data_ptr<int32_t>(),
                                phase_value.data_ptr<int32_t>(), history.data_ptr<int32_t>(),
                                round_state.data_ptr<int32_t>(),
                                kv.numel() == 0 ? nullptr : kv.data_ptr(), batch,
                                params, current_stream()),
               "asbs_loop");
}

void asbs_loop_meta(at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    at::Tensor&, at::Tensor&, at::Tensor&, int64_t, int64_t, double, double, double, int64_t, int64_t,
                    int64_t, int64_t, int64_t, int64_t, bool) {}

}  // namespace
}  // namespace sdbench

TORCH_LIBRARY_FRAGMENT(sdbench, m) {
  m.def(
      "asbs_loop(Tensor(a!) ema, Tensor(b!) block, Tensor(c!) committed, Tensor target_len, Tensor phase_start, "
      "Tensor phase_value, Tensor(d!) history, Tensor(e!) round_state, Tensor(f!) kv, int seed, int rounds, "
      "float alpha, float high, float low, int min_block, int mid_block, int max_block, int pressure_cap, "
      "int page_size, int capacity_pages, bool adaptive) -> ()");
}

TORCH_LIBRARY_IMPL(sdbench, CUDA, m) { m.impl("asbs_loop", &sdbench::asbs_loop_op); }

TORCH_LIBRARY_IMPL(sdbench, Meta, m) { m.impl("asbs_loop", &sdbench::asbs_loop_meta); }
// ==== END asbs_loop ================================================================================
