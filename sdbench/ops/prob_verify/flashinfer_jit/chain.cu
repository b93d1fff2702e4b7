// FlashInfer's chain speculative sampling kernel (header-only, flashinfer/sampling.cuh) behind one
// torch op, for machines without the flashinfer Python package: built by
// sdbench/ops/prob_verify/flashinfer_impls.py with torch.utils.cpp_extension.load and the include
// folder named by SDBENCH_FLASHINFER_INCLUDE. Mirrors flashinfer's own binding
// (csrc/sampling.cu, chain_speculative_sampling): float32 probabilities, int32 ids, the counters
// added into (the kernel does `+=`), scalar seed and offset (no per-row arrays).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include <flashinfer/sampling.cuh>

void chain_speculative_sampling(at::Tensor draft_probs, at::Tensor draft_token_ids, at::Tensor target_probs,
                                at::Tensor output_token_ids, at::Tensor accepted_num, at::Tensor emitted_num,
                                bool deterministic, int64_t seed, int64_t offset) {
  TORCH_CHECK(draft_probs.is_cuda() && draft_probs.is_contiguous() && draft_probs.scalar_type() == at::kFloat,
              "draft_probs must be a contiguous float32 CUDA tensor");
  TORCH_CHECK(target_probs.is_contiguous() && target_probs.scalar_type() == at::kFloat,
              "target_probs must be a contiguous float32 tensor");
  TORCH_CHECK(draft_token_ids.is_contiguous() && draft_token_ids.scalar_type() == at::kInt,
              "draft_token_ids must be contiguous int32");
  TORCH_CHECK(output_token_ids.scalar_type() == at::kInt && accepted_num.scalar_type() == at::kInt &&
                  emitted_num.scalar_type() == at::kInt,
              "output_token_ids, accepted_num and emitted_num must be int32");
  TORCH_CHECK(draft_probs.dim() == 3 && target_probs.dim() == 3 && draft_token_ids.dim() == 2,
              "draft_probs [B, gamma, V], target_probs [B, gamma+1, V], draft_token_ids [B, gamma]");
  const auto batch = static_cast<uint32_t>(draft_probs.size(0));
  const auto gamma = static_cast<uint32_t>(draft_probs.size(1));
  const auto vocab = static_cast<uint32_t>(draft_probs.size(2));
  TORCH_CHECK(target_probs.size(0) == batch && target_probs.size(1) == gamma + 1 && target_probs.size(2) == vocab,
              "target_probs must be [B, gamma+1, V]");
  TORCH_CHECK(output_token_ids.size(0) == batch && output_token_ids.size(1) == gamma + 1,
              "output_token_ids must be [B, gamma+1]");
  const c10::cuda::CUDAGuard guard(draft_probs.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(draft_probs.device().index()).stream();
  const cudaError_t status = flashinfer::sampling::ChainSpeculativeSampling<float, int>(
      draft_probs.data_ptr<float>(), draft_token_ids.data_ptr<int>(), target_probs.data_ptr<float>(),
      output_token_ids.data_ptr<int>(), accepted_num.data_ptr<int>(), emitted_num.data_ptr<int>(), batch, gamma,
      vocab, deterministic, nullptr, static_cast<uint64_t>(seed), nullptr, static_cast<uint64_t>(offset), stream);
  TORCH_CHECK(status == cudaSuccess, "ChainSpeculativeSampling failed: ", cudaGetErrorString(status));
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("chain_speculative_sampling", &chain_speculative_sampling,
        "FlashInfer ChainSpeculativeSampling<float, int> on the current stream");
}
