"""On a CUDA device: every available verify / prob_verify implementation inside the loop.

Greedy: token-for-token equal to the target alone. Sampling: every implementation consumes the same
supplied randomness, so all must emit the tokens torch_eager emits (same prompts, same seed).
"""

from __future__ import annotations

import pytest
import torch

from sdbench.e2e.speculative import speculative_generate, target_generate
from sdbench.e2e.verifier import implementation_names, make_verifier, unavailable_reason
from tests.e2e.conftest import PROMPTS, VOCAB

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def cuda_models(pair_dir):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from sdbench.e2e.models import load_model

    return {name: load_model(pair_dir / name, name, CUDA, "float32", "eager") for name in ("target", "close")}


def _run(models, impl, temperature, batch_prompts):
    verifier = make_verifier(impl, temperature, len(batch_prompts), 4, VOCAB, CUDA)
    return speculative_generate(models["target"], models["close"], batch_prompts, gamma=4, max_new_tokens=24,
                                verifier=verifier, temperature=temperature,
                                generator=torch.Generator(device=CUDA).manual_seed(0)).tokens


@pytest.mark.parametrize("impl", implementation_names(0.0))
def test_greedy_identity_on_cuda(cuda_models, impl):
    reason = unavailable_reason(impl, 0.0, CUDA)
    if reason is not None:
        pytest.skip(f"{impl}: {reason}")
    expected = target_generate(cuda_models["target"], PROMPTS, max_new_tokens=24).tokens
    assert _run(cuda_models, impl, 0.0, PROMPTS) == expected


@pytest.mark.parametrize("impl", implementation_names(0.8))
def test_sampling_impls_agree_with_torch_eager_on_cuda(cuda_models, impl):
    reason = unavailable_reason(impl, 0.8, CUDA)
    if reason is not None:
        pytest.skip(f"{impl}: {reason}")
    if impl.startswith("flashinfer"):
        pytest.skip(f"{impl} draws its own randomness (Philox in the kernel): the loop's supplied randomness cannot "
                    "reach it, so it is checked in distribution (tests/gpu/test_prob_gpu.py), not token for token")
    prompts = PROMPTS * 8
    assert _run(cuda_models, impl, 0.8, prompts) == _run(cuda_models, "torch_eager", 0.8, prompts)
