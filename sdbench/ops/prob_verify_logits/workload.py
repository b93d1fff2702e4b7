"""prob_verify_logits' inputs: target and draft logits, per-request temperatures, drafts, randomness.

Logits are generated on the device one position at a time (b=512, γ=16, V=151936 float32 is 5 GB of
target logits: no CPU generation, no float64 temporaries). The target logits at each position are
N(0, 1)·PROB_LOGIT_SCALE; the draft's are the target's plus N(0, 1)·draft_noise·PROB_LOGIT_SCALE,
so draft_noise sets the acceptance (0: the draft is the target). Temperatures cycle over
`temperatures` across the batch (0.0 = greedy), the draft using the request's own temperature.
Draft tokens are drawn from q (argmax where the draft temperature is 0).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify.reference import RULES
from sdbench.ops.prob_verify.workload import PROB_LOGIT_SCALE, RandomizedInputs
from sdbench.ops.workload import PROB_DTYPES, TOKEN_DTYPES

MIXED_TEMPERATURES = (0.0, 0.7, 1.0, 1.3)  # greedy and sampled requests in one batch


@dataclass(frozen=True)
class LogitsConfig:
    """One point of the from-logits grid: everything needed to rebuild the same inputs."""

    batch_size: int
    gamma: int
    vocab_size: int = 32000
    logits_dtype: str = "float32"  # float32 | bfloat16
    temperatures: tuple[float, ...] = MIXED_TEMPERATURES  # cycled over the batch; 0.0 = greedy
    draft_noise: float = 0.5  # draft logits = target + N(0, draft_noise²)·scale
    rule: str = "token"  # token | block
    token_dtype: str = "int64"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.gamma < 1:
            raise SdbenchError(f"batch size and gamma must be >= 1, got B={self.batch_size}, gamma={self.gamma}")
        if self.vocab_size < 2:
            raise SdbenchError(f"vocab size must be >= 2, got {self.vocab_size}")
        if self.logits_dtype not in PROB_DTYPES:
            raise SdbenchError(f"logits dtype must be one of {', '.join(PROB_DTYPES)}, got {self.logits_dtype!r}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise SdbenchError(f"temperatures must be a non-empty list of values >= 0, got {self.temperatures}")
        if self.draft_noise < 0:
            raise SdbenchError(f"draft_noise must be >= 0, got {self.draft_noise}")
        if self.rule not in RULES:
            raise SdbenchError(f"rule must be one of {', '.join(RULES)} (--rule token|block), got {self.rule!r}")
        if self.token_dtype not in TOKEN_DTYPES:
            raise SdbenchError(f"token dtype must be one of {', '.join(TOKEN_DTYPES)}, got {self.token_dtype!r}")

    def replace(self, **changes) -> LogitsConfig:
        return dataclasses.replace(self, **changes)

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=PROB_DTYPES[self.logits_dtype]).element_size()


@dataclass
class LogitsWorkload(RandomizedInputs):
    """Inputs of one verification step from logits. Randomness as in ProbWorkload: `supplied`
    (uniforms and exponential noise are read: parity) or `fast` (in-kernel Philox from seed, offset)."""

    config: LogitsConfig
    draft_tokens: torch.Tensor  # [B, γ] token dtype
    target_logits: torch.Tensor  # [B, γ+1, V] logits dtype
    draft_logits: torch.Tensor  # [B, γ, V] logits dtype
    target_temperature: torch.Tensor  # [B] float32, 0 = greedy
    draft_temperature: torch.Tensor  # [B] float32, 0 = greedy
    uniforms: torch.Tensor  # [B, γ] float32 in [0, 1)
    exponential_noise: torch.Tensor  # [B, V] float32 > 0
    randomness: str = "supplied"
    offset: int = 0


def as_logits_config(cfg) -> LogitsConfig:
    """A LogitsConfig as it is, or one built from a VerifyConfig (batch, γ, V, prob_dtype, seed)."""
    if isinstance(cfg, LogitsConfig):
        return cfg
    return LogitsConfig(batch_size=cfg.batch_size, gamma=cfg.gamma, vocab_size=cfg.vocab_size,
                        logits_dtype=cfg.prob_dtype, token_dtype=cfg.token_dtype, seed=cfg.seed)


def request_temperatures(cfg: LogitsConfig, device: torch.device) -> torch.Tensor:
    """float32 [B]: cfg.temperatures cycled over the batch."""
    cycle = torch.tensor(cfg.temperatures, dtype=torch.float32)
    return cycle[torch.arange(cfg.batch_size) % len(cfg.temperatures)].to(device)


def make_logits_workload(cfg, device: str | torch.device = "cpu") -> LogitsWorkload:
    """Seeded logits, drafts and randomness for cfg, generated on device one position at a time
    (peak: the stored logits plus a few [B, V] float32 temporaries)."""
    cfg = as_logits_config(cfg)
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    dtype = PROB_DTYPES[cfg.logits_dtype]
    temperature = request_temperatures(cfg, device)
    target = torch.empty((batch, gamma + 1, vocab), dtype=dtype, device=device)
    draft = torch.empty((batch, gamma, vocab), dtype=dtype, device=device)
    draft_tokens = torch.empty((batch, gamma), dtype=torch.int64, device=device)
    greedy = (temperature == 0)[:, None]
    inverse = torch.where(temperature > 0, 1.0 / temperature.clamp_min(1e-30), 1.0)[:, None]
    for position in range(gamma + 1):
        logits = torch.randn((batch, vocab), generator=gen, device=device) * PROB_LOGIT_SCALE
        target[:, position] = logits.to(dtype)
        if position < gamma:
            noise = torch.randn((batch, vocab), generator=gen, device=device)
            logits = (logits + noise.mul_(cfg.draft_noise * PROB_LOGIT_SCALE)).to(dtype)
            draft[:, position] = logits
            q = (logits.float() * inverse).softmax(dim=1)
            sampled = torch.multinomial(q, 1, generator=gen).squeeze(1)
            draft_tokens[:, position] = torch.where(greedy[:, 0], logits.float().argmax(dim=1), sampled)
    return _finish_logits_workload(cfg, target, draft, draft_tokens, temperature, gen)


def logits_workload_from_logits(target_logits: torch.Tensor, draft_logits: torch.Tensor,
                                cfg: LogitsConfig) -> LogitsWorkload:
    """A workload over given logits [B, γ+1, V] and [B, γ, V] (exactness tests): cfg's temperatures
    (cycled), seed (drafts from q, randomness) and dtypes; its B, γ and V must match the tensors."""
    batch, rows, vocab = target_logits.shape
    if (batch, rows - 1, vocab) != (cfg.batch_size, cfg.gamma, cfg.vocab_size):
        raise SdbenchError(f"target logits have shape {tuple(target_logits.shape)} but cfg says B={cfg.batch_size}, "
                           f"gamma={cfg.gamma}, V={cfg.vocab_size} (they must be [B, gamma+1, V])")
    if tuple(draft_logits.shape) != (batch, rows - 1, vocab):
        raise SdbenchError(f"draft logits have shape {tuple(draft_logits.shape)}, expected {(batch, rows - 1, vocab)}")
    device = target_logits.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    dtype = PROB_DTYPES[cfg.logits_dtype]
    target, draft = target_logits.to(dtype).contiguous(), draft_logits.to(dtype).contiguous()
    temperature = request_temperatures(cfg, device)
    inverse = torch.where(temperature > 0, 1.0 / temperature.clamp_min(1e-30), 1.0)[:, None]
    draft_tokens = torch.empty((batch, cfg.gamma), dtype=torch.int64, device=device)
    for position in range(cfg.gamma):
        logits = draft[:, position].float()
        sampled = torch.multinomial((logits * inverse).softmax(dim=1), 1, generator=gen).squeeze(1)
        draft_tokens[:, position] = torch.where(temperature == 0, logits.argmax(dim=1), sampled)
    return _finish_logits_workload(cfg, target, draft, draft_tokens, temperature, gen)


def logits_workload_from_probs(draft_tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                               uniforms: torch.Tensor, exponential_noise: torch.Tensor, *, rule: str = "block",
                               logprobs: bool = False, logits_dtype: str = "float32") -> LogitsWorkload:
    """The from-logits step over given probabilities p [B, γ+1, V] and q [B, γ, V] (log-probs when
    logprobs): logits = log p at temperature 1, since softmax(log p) = p — how a probability caller
    reaches a from-logits rule (block verification runs in `fused_logits`, not in prob `fused`), and
    how the exactness tests feed the kernel prefix-dependent models. Supplied randomness as given."""
    batch, gamma = draft_tokens.shape
    vocab = target_probs.shape[2]

    def as_logits(values: torch.Tensor) -> torch.Tensor:
        values = values.double() if logprobs else values.double().log()
        return values.to(PROB_DTYPES[logits_dtype]).contiguous()

    token_dtype = next(name for name, dtype in TOKEN_DTYPES.items() if dtype == draft_tokens.dtype)
    cfg = LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=logits_dtype, temperatures=(1.0,), rule=rule,
                       token_dtype=token_dtype)
    ones = torch.ones(batch, dtype=torch.float32, device=draft_tokens.device)
    return LogitsWorkload(config=cfg, draft_tokens=draft_tokens, target_logits=as_logits(target_probs),
                          draft_logits=as_logits(draft_probs), target_temperature=ones, draft_temperature=ones.clone(),
                          uniforms=uniforms.float().contiguous(), exponential_noise=exponential_noise.float().contiguous())


def _finish_logits_workload(cfg, target, draft, draft_tokens, temperature, gen) -> LogitsWorkload:
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    uniforms = torch.rand((batch, gamma), generator=gen, device=target.device)
    noise = torch.empty((batch, vocab), device=target.device).exponential_(generator=gen)
    noise.clamp_min_(torch.finfo(torch.float32).tiny)
    return LogitsWorkload(
        config=cfg, draft_tokens=draft_tokens.to(TOKEN_DTYPES[cfg.token_dtype]), target_logits=target,
        draft_logits=draft, target_temperature=temperature, draft_temperature=temperature.clone(),
        uniforms=uniforms, exponential_noise=noise,
    )


# --- roofline and the benchmark grid -----------------------------------------------------------
def logits_read_floor_bytes(cfg: LogitsConfig) -> int:
    """The issue's read floor: every target and draft logit once (the softmax normalisers need every row a
    rejection could stop at, and the scan needs them all before it knows k). Under the token rule a greedy
    request's draft rows are not needed at all (reference.py), so a design may read less than this
    (`design_bytes` counts what each reads). Temperatures, token ids, uniforms and outputs (< 0.1%) are not
    counted."""
    return cfg.batch_size * (2 * cfg.gamma + 1) * cfg.vocab_size * cfg.element_bytes


def design_bytes(cfg: LogitsConfig, design: str, randomness: str = "fast") -> dict[str, int]:
    """Bytes each design reads and writes, per step (the roofline numerators), as
    {"read": ..., "written": ...}. Designs:

    - `fused_logits` (sdbench, 2 launches): every logit once, except (the token rule) the γ draft rows of a
      request whose target is greedy, which greedy verification never needs; then, for a request whose target is
      sampled, the stopping row k's target row and (below γ) draft row again (2 rows, worst case), plus supplied
      noise. With cfg.rule "block" every draft row is read, and the residual-mass pass reads target and draft rows
      1..γ-1 again for every request whose target is sampled (a greedy target needs no mass), as the race reads
      rows k (2 rows, worst case) of those requests only.
    - `vllm_v2_style` (4 launches): the token rule's logit reads (its pass 1 is fused_logits' own kernel), plus the
      per-block partials written and read back and the per-block race winners (small).
    - `softmax_then_prob` (eager, FlashInfer, prob `fused`): the logits read, float32 probabilities
      written ([B, 2γ+1, V]·4), then the probability sampler's reads (2 scalars per draft, 2 rows at k).
    """
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    floor = logits_read_floor_bytes(cfg)
    row_bytes = vocab * cfg.element_bytes
    noise = batch * vocab * 4 + batch * gamma * 4 if randomness == "supplied" else 0
    sampled = sum(1 for b in range(batch) if cfg.temperatures[b % len(cfg.temperatures)] > 0)
    # the token rule's reads: greedy requests' draft rows skipped in pass 1, sampled requests' rows k read again
    token_reads = floor - (batch - sampled) * gamma * row_bytes + sampled * 2 * row_bytes + noise
    if design == "fused_logits":
        if cfg.rule == "block":
            mass = sampled * 2 * (gamma - 1) * row_bytes
            return {"read": floor + mass + sampled * 2 * row_bytes + noise, "written": 0}
        return {"read": token_reads, "written": 0}
    if design == "vllm_v2_style":
        partials = batch * (2 * gamma + 1) * -(-vocab // VLLM_BLOCK) * 12
        return {"read": token_reads + partials, "written": partials}
    if design == "softmax_then_prob":
        probs = batch * (2 * gamma + 1) * vocab * 4
        return {"read": floor + batch * 2 * vocab * 4 + batch * gamma * 8 + noise, "written": probs}
    raise SdbenchError(f"unknown design {design!r}; choose fused_logits, vllm_v2_style or softmax_then_prob")


VLLM_BLOCK = 8192  # columns per program in the vLLM-v2-style stats and resample kernels

GRID_BATCHES = (1, 32, 128, 512)
GRID_GAMMAS = (4, 8, 16)
GRID_VOCABS = (32000, 128256, 151936)
GRID_DTYPES = ("bfloat16", "float32")


def benchmark_grid(rule: str = "token", seed: int = 0) -> Iterator[LogitsConfig]:
    """The issue's grid: b ∈ {1, 32, 128, 512} × γ ∈ {4, 8, 16} × V ∈ {32000, 128256, 151936} × bf16/fp32
    (72 points; the lead times each cold and warm L2)."""
    points = itertools.product(GRID_BATCHES, GRID_GAMMAS, GRID_VOCABS, GRID_DTYPES)
    for index, (batch, gamma, vocab, dtype) in enumerate(points):
        yield LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=dtype, rule=rule, seed=seed + index)
