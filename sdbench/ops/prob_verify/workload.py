"""prob_verify's inputs: target and draft distributions, drafts drawn from q, and the randomness.

The shared config (VerifyConfig: batch, γ, α, vocabulary, dtypes, seed) lives in sdbench.ops.workload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from sdbench.errors import SdbenchError
from sdbench.ops.workload import PROB_DTYPES, TOKEN_DTYPES, VerifyConfig

# --- prob_verify: probabilistic (Leviathan) verification ---------------------------------------
# p [B, γ+1, V] is the target's distribution at every draft position plus the bonus position; q
# [B, γ, V] is the draft's. The draft at position i is a mixture q_i = w·p_i + (1-w)·r_i of the
# target and an independent distribution r_i (a softmax of its own logits), so the acceptance
# probability Σ_x min(p_i, q_i) = w + (1-w)·c_i with c_i = Σ_x min(p_i, r_i), because
# min(p, w·p + (1-w)·r) = w·p + (1-w)·min(p, r). Solving per row for w = (α - c_i) / (1 - c_i)
# realises Σ min(p_i, q_i) = max(α, c_i) exactly (before rounding to the stored dtype). With logits
# N(0, 1)·PROB_LOGIT_SCALE, c_i is ~0.007 at V=32000 and ~0.006 at V=152064 (so α is met from
# ~0.01 up) and ~0.1 at V=16, where small α is clamped up to c_i. `realised_acceptance` records
# the mean of Σ min(p, q) over the stored (rounded) distributions.

PROB_LOGIT_SCALE = 4.0  # top token ~0.23 at V=32000, entropy ~4.2 nats: a peaked LLM-like target
RANDOMNESS_MODES = ("supplied", "fast")


class RandomizedInputs:
    """What every probabilistic workload (ProbWorkload, the logits one, the ragged one) shares: its device, its
    seed and its inputs in another randomness mode. Each has `config`, `draft_tokens`, `randomness` and `offset`."""

    @property
    def device(self) -> torch.device:
        return self.draft_tokens.device

    @property
    def seed(self) -> int:
        return self.config.seed

    def with_randomness(self, randomness: str, offset: int = 0):
        """The same inputs in another randomness mode (tensors are shared, not copied)."""
        return with_randomness(self, randomness, offset)


@dataclass
class ProbWorkload(RandomizedInputs):
    """Inputs of one probabilistic verification step.

    Randomness has two modes. `supplied` (parity): every implementation consumes `uniforms` (the
    accept tests) and `exponential_noise` (the residual / bonus race), so a kernel and the
    reference agree draw for draw. `fast` (timing): implementations draw their own randomness from
    (seed, offset) — a counter-based Philox inside the Triton kernels, keyed by sequence and
    position / vocabulary index — and no B×V noise is read; same seed and offset give the same
    tokens, but there is no reference to compare them with (exactness is tested in distribution).
    """

    config: VerifyConfig
    draft_tokens: torch.Tensor  # [B, γ] token dtype, drawn from q
    target_probs: torch.Tensor  # p [B, γ+1, V] prob dtype; log-probs when config.logprobs
    draft_probs: torch.Tensor  # q [B, γ, V] prob dtype; log-probs when config.logprobs
    uniforms: torch.Tensor  # [B, γ] float32 in [0, 1): accept draft i iff u·q < p
    exponential_noise: torch.Tensor  # [B, V] float32 > 0: residual / bonus token = argmax w / E
    realised_acceptance: float  # mean over (b, i < γ) of Σ_x min(p, q) of the stored distributions
    randomness: str = "supplied"
    offset: int = 0  # fast mode: the Philox offset (a per-step counter in a real engine)


def with_randomness(workload, randomness: str, offset: int = 0):
    """workload (a RandomizedInputs dataclass) in another randomness mode, its tensors shared."""
    if randomness not in RANDOMNESS_MODES:
        raise SdbenchError(f"randomness must be one of {', '.join(RANDOMNESS_MODES)}, got {randomness!r}")
    if offset < 0:
        raise SdbenchError(f"the fast-mode offset must be >= 0, got {offset}")
    return dataclasses.replace(workload, randomness=randomness, offset=offset)


def decode_probs(values: torch.Tensor, logprobs: bool) -> torch.Tensor:
    """Stored p or q as float32 probabilities (float32 arithmetic even for bfloat16 storage)."""
    return values.float().exp() if logprobs else values.float()


def _encode_probs(probs: torch.Tensor, cfg: VerifyConfig) -> torch.Tensor:
    stored = probs.log() if cfg.logprobs else probs
    return stored.to(PROB_DTYPES[cfg.prob_dtype])


def make_prob_workload(cfg: VerifyConfig, device: str | torch.device = "cpu") -> ProbWorkload:
    """Seeded p, q, drafts and randomness for cfg, generated on device, one position at a time.

    Peak memory is the stored p and q plus a few [B, V] float32 temporaries. The same config gives
    the same workload on the same device type (CPU and CUDA generators differ).
    """
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    prob_dtype = PROB_DTYPES[cfg.prob_dtype]
    target = torch.empty((batch, gamma + 1, vocab), dtype=prob_dtype, device=device)
    draft = torch.empty((batch, gamma, vocab), dtype=prob_dtype, device=device)
    for position in range(gamma + 1):
        p = _random_softmax(batch, vocab, gen, device)
        target[:, position] = _encode_probs(p, cfg)
        if position < gamma:
            r = _random_softmax(batch, vocab, gen, device)
            overlap = torch.minimum(p, r).sum(dim=1, keepdim=True)
            weight = ((cfg.alpha - overlap) / (1.0 - overlap).clamp_min(1e-12)).clamp(0.0, 1.0)
            draft[:, position] = _encode_probs(weight * p + (1.0 - weight) * r, cfg)
    return _finish_prob_workload(cfg, target, draft, gen)


def prob_workload_from_distributions(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, cfg: VerifyConfig
) -> ProbWorkload:
    """A workload over given float probabilities p [B, γ+1, V] and q [B, γ, V] (exactness tests).

    cfg supplies the storage (prob_dtype, logprobs, token_dtype) and the seed for drafts and
    randomness; its batch_size, gamma and vocab_size must match the tensors.
    """
    batch, rows, vocab = target_probs.shape
    if (batch, rows - 1, vocab) != (cfg.batch_size, cfg.gamma, cfg.vocab_size):
        raise SdbenchError(
            f"p has shape {tuple(target_probs.shape)} but cfg says B={cfg.batch_size}, "
            f"gamma={cfg.gamma}, V={cfg.vocab_size} (p must be [B, gamma+1, V])"
        )
    if tuple(draft_probs.shape) != (batch, rows - 1, vocab):
        raise SdbenchError(f"q has shape {tuple(draft_probs.shape)}, expected {(batch, rows - 1, vocab)}")
    gen = torch.Generator(device=target_probs.device).manual_seed(cfg.seed)
    return _finish_prob_workload(cfg, _encode_probs(target_probs.float(), cfg), _encode_probs(draft_probs.float(), cfg), gen)


def _random_softmax(batch: int, vocab: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    logits = torch.randn((batch, vocab), generator=gen, device=device) * PROB_LOGIT_SCALE
    return logits.softmax(dim=1)


def _finish_prob_workload(
    cfg: VerifyConfig, target: torch.Tensor, draft: torch.Tensor, gen: torch.Generator
) -> ProbWorkload:
    """Draw the draft tokens from the stored q, then the parity randomness, and measure acceptance."""
    device = target.device
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    draft_tokens = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    overlap_total = 0.0
    for position in range(gamma):
        q = decode_probs(draft[:, position], cfg.logprobs)
        p = decode_probs(target[:, position], cfg.logprobs)
        draft_tokens[:, position] = torch.multinomial(q, 1, generator=gen).squeeze(1)
        overlap_total += float(torch.minimum(p, q).sum(dtype=torch.float64))
    uniforms = torch.rand((batch, gamma), generator=gen, device=device)
    # An exact zero would turn w / E into inf or NaN: exponential_ may return 0 for a uniform of 1.
    noise = torch.empty((batch, vocab), device=device).exponential_(generator=gen)
    noise.clamp_min_(torch.finfo(torch.float32).tiny)
    return ProbWorkload(
        config=cfg,
        draft_tokens=draft_tokens.to(TOKEN_DTYPES[cfg.token_dtype]),
        target_probs=target,
        draft_probs=draft,
        uniforms=uniforms,
        exponential_noise=noise,
        realised_acceptance=overlap_total / (batch * gamma),
    )


def prob_bytes(cfg: VerifyConfig, bonus_fraction: float | None = None, randomness: str = "fast",
               draft_lengths: list[int] | None = None) -> int:
    """The bytes prob_verify must read: the roofline numerator.

    Two scalars (p and q at the draft token) per draft token, then for each sequence one p row and
    one q row of V at its first rejection, or p alone at the bonus position when all γ were
    accepted. bonus_fraction is the share of sequences that accept everything: α^γ (independent
    accept tests at rate cfg.alpha) by default; 0.0 gives the worst case, every sequence rejecting
    (the issue's floor: ~8.2 MB at B=32, γ=8, V=32000 float32). Supplied randomness adds the
    uniforms and one noise row per sequence. Token ids and the outputs (< 0.1%) are not counted.
    draft_lengths (prob_verify_ragged: γ_i per request) replaces γ for every request: Σ γ_i draft
    tokens, and a default bonus share of mean(α^γ_i) (a request with γ_i = 0 reads its bonus row only).
    """
    if randomness not in RANDOMNESS_MODES:
        raise SdbenchError(f"randomness must be one of {', '.join(RANDOMNESS_MODES)}, got {randomness!r}")
    batch, vocab = cfg.batch_size, cfg.vocab_size
    lengths = [cfg.gamma] * batch if draft_lengths is None else list(draft_lengths)
    if bonus_fraction is None:
        bonus_fraction = (cfg.alpha**cfg.gamma if draft_lengths is None
                          else sum(cfg.alpha**length for length in lengths) / batch)
    elem = torch.empty((), dtype=PROB_DTYPES[cfg.prob_dtype]).element_size()
    drafts = sum(lengths)
    scalars = drafts * 2 * elem
    rows = batch * vocab * elem * (2.0 * (1.0 - bonus_fraction) + bonus_fraction)
    total = scalars + rows
    if randomness == "supplied":
        total += drafts * 4 + batch * vocab * 4
    return int(round(total))
