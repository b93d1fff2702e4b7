"""Seeded verification inputs and their oracle: the only place sdbench makes inputs.

A workload is fully determined by its `VerifyConfig`: the same config gives the same tokens on any
device (tokens and lengths are drawn on the CPU with a seeded generator, then moved), and the same KV
on the same device type (KV is drawn where it lives, because B·γ·kv_dim can be hundreds of MB).

Acceptance-length distributions (k_i = accepted draft tokens of sequence i, 0 ≤ k_i ≤ γ):
- `binomial`: k ~ Binomial(γ, α). The published study's generator; mean γα, and as likely to accept
  late tokens as early ones, so it overstates long runs at small α.
- `geometric`: accept each position with probability α until the first rejection, truncated at γ.
  What real speculative decoding produces; mean α(1-α^γ)/(1-α), mostly short runs at small α.
- `fixed`: every k_i equals `fixed_length`.
- `trace`: k_i drawn (seeded, with replacement) from a file of observed lengths.
- `trace-rounds`: one recorded round of the file (line seed mod #lines), k_i in the batch order it was
  recorded in (cycled to B): what a kernel sees from a real batch, neighbours and all.
- `trace-rounds-sorted`: the same round with its k_i sorted, longest first: the best ordering any
  batch reordering (e.g. `sdbench e2e --sort-by-acceptance`) could give the kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from sdbench.errors import SdbenchError

DISTRIBUTIONS = ("binomial", "geometric", "fixed", "trace", "trace-rounds", "trace-rounds-sorted")
TRACE_DISTRIBUTIONS = ("trace", "trace-rounds", "trace-rounds-sorted")
DRAFT_LENGTH_DISTRIBUTIONS = ("uniform", "full", "bimodal")  # verify_ragged's γ_i (see its workload)
TOKEN_DTYPES = {"int64": torch.int64, "int32": torch.int32}
KV_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
PROB_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_VOCAB_SIZE = 32000


@dataclass(frozen=True)
class VerifyConfig:
    """One point of a grid: everything needed to rebuild the same inputs."""

    batch_size: int
    gamma: int
    alpha: float = 0.9
    kv_dim: int = 0  # 0: no draft KV (verify-only workloads)
    dist: str = "binomial"
    fixed_length: int | None = None
    trace_path: str | None = None
    vocab_size: int = DEFAULT_VOCAB_SIZE
    token_dtype: str = "int64"
    kv_dtype: str = "float16"
    seed: int = 0
    # prob_verify only: dtype of the p / q distributions, and whether they are given as log-probs.
    prob_dtype: str = "float32"
    logprobs: bool = False
    # verify_ragged only: how the draft lengths γ_i are drawn (sdbench/ops/verify_ragged/workload.py).
    draft_lengths: str = "uniform"

    def __post_init__(self) -> None:
        validate_config(self)

    def replace(self, **changes) -> VerifyConfig:
        return dataclasses.replace(self, **changes)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the whole draft KV tensor [B, γ, kv_dim]."""
        elem = torch.empty((), dtype=KV_DTYPES[self.kv_dtype]).element_size()
        return self.batch_size * self.gamma * self.kv_dim * elem


def validate_config(cfg: VerifyConfig) -> None:
    """Raise SdbenchError naming the bad value and the fix."""
    if cfg.batch_size < 1:
        raise SdbenchError(f"batch size must be >= 1, got {cfg.batch_size}")
    if cfg.gamma < 1:
        raise SdbenchError(f"gamma (draft length) must be >= 1, got {cfg.gamma}")
    if not 0.0 <= cfg.alpha <= 1.0:
        raise SdbenchError(f"alpha (acceptance rate) must be in [0, 1], got {cfg.alpha}")
    if cfg.kv_dim < 0:
        raise SdbenchError(f"kv_dim must be >= 1 (or 0 for no KV), got {cfg.kv_dim}")
    if cfg.vocab_size < 2:
        raise SdbenchError(f"vocab size must be >= 2 so a target token can disagree, got {cfg.vocab_size}")
    if cfg.dist not in DISTRIBUTIONS:
        raise SdbenchError(f"unknown distribution {cfg.dist!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    if cfg.token_dtype not in TOKEN_DTYPES:
        raise SdbenchError(f"token dtype must be one of {', '.join(TOKEN_DTYPES)}, got {cfg.token_dtype!r}")
    if cfg.kv_dtype not in KV_DTYPES:
        raise SdbenchError(f"KV dtype must be one of {', '.join(KV_DTYPES)}, got {cfg.kv_dtype!r}")
    if cfg.draft_lengths not in DRAFT_LENGTH_DISTRIBUTIONS:
        raise SdbenchError(f"draft lengths must be one of {', '.join(DRAFT_LENGTH_DISTRIBUTIONS)}, got {cfg.draft_lengths!r}")
    if cfg.prob_dtype not in PROB_DTYPES:
        raise SdbenchError(f"probability dtype must be one of {', '.join(PROB_DTYPES)}, got {cfg.prob_dtype!r}")
    if cfg.token_dtype == "int32" and cfg.vocab_size > 2**31 - 1:
        raise SdbenchError("vocab size does not fit int32 tokens; use --token-dtype int64")
    if cfg.dist == "fixed":
        if cfg.fixed_length is None or not 0 <= cfg.fixed_length <= cfg.gamma:
            raise SdbenchError(
                f"the fixed distribution needs 0 <= fixed_length <= gamma={cfg.gamma}, got {cfg.fixed_length}"
            )
    if cfg.dist in TRACE_DISTRIBUTIONS:
        if cfg.trace_path is None:
            raise SdbenchError("the trace distribution needs a trace file (--trace PATH)")
        read_trace(cfg.trace_path, cfg.gamma)  # a missing file or a length > γ fails here, not mid-sweep


def read_trace(path: str | Path, gamma: int) -> torch.Tensor:
    """Observed accepted lengths from a text file (integers separated by whitespace or commas)."""
    trace_file = Path(path)
    if not trace_file.is_file():
        raise SdbenchError(f"trace file {str(trace_file)!r} does not exist")
    text = trace_file.read_text().replace(",", " ").split()
    try:
        lengths = [int(word) for word in text]
    except ValueError as err:
        raise SdbenchError(f"trace file {str(trace_file)!r} holds a non-integer: {err}") from None
    if not lengths:
        raise SdbenchError(f"trace file {str(trace_file)!r} holds no lengths")
    too_long = [k for k in lengths if k > gamma or k < 0]
    if too_long:
        raise SdbenchError(
            f"trace file {str(trace_file)!r} holds length {too_long[0]} outside [0, gamma={gamma}]; "
            "use a larger --gamma or filter the trace"
        )
    return torch.tensor(lengths, dtype=torch.int64)


def read_trace_rounds(path: str | Path, gamma: int) -> list[torch.Tensor]:
    """The file's rounds: one line each (the k_i of that round's sequences, in batch order); blank lines
    are skipped. Validated like read_trace."""
    read_trace(path, gamma)  # the same errors for a missing file, a non-integer or a length outside [0, γ]
    rounds = [torch.tensor([int(word) for word in line.replace(",", " ").split()], dtype=torch.int64)
              for line in Path(path).read_text().splitlines() if line.split()]
    return rounds


def sample_accepted_lengths(cfg: VerifyConfig, generator: torch.Generator) -> torch.Tensor:
    """k_i for each sequence, int64 [B] on the CPU, drawn from cfg.dist."""
    batch, gamma = cfg.batch_size, cfg.gamma
    if cfg.dist == "binomial":
        counts = torch.full((batch,), float(gamma), dtype=torch.float64)
        probs = torch.full((batch,), cfg.alpha, dtype=torch.float64)
        return torch.binomial(counts, probs, generator=generator).to(torch.int64)
    if cfg.dist == "geometric":
        accepted = torch.rand((batch, gamma), generator=generator, dtype=torch.float64) < cfg.alpha
        return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    if cfg.dist == "fixed":
        return torch.full((batch,), int(cfg.fixed_length), dtype=torch.int64)
    if cfg.dist != "trace":
        rounds = read_trace_rounds(cfg.trace_path, gamma)
        recorded = rounds[cfg.seed % len(rounds)]
        lengths = recorded.repeat(-(-batch // recorded.numel()))[:batch]
        return lengths.sort(descending=True).values if cfg.dist == "trace-rounds-sorted" else lengths
    observed = read_trace(cfg.trace_path, gamma)
    picks = torch.randint(0, observed.numel(), (batch,), generator=generator)
    return observed[picks]


def expected_accepted_length(cfg: VerifyConfig) -> float:
    """E[k_i] under cfg's distribution (what a dispatcher can know without reading tensors)."""
    if cfg.dist == "binomial":
        return cfg.gamma * cfg.alpha
    if cfg.dist == "geometric":
        if cfg.alpha >= 1.0:
            return float(cfg.gamma)
        return cfg.alpha * (1.0 - cfg.alpha**cfg.gamma) / (1.0 - cfg.alpha)
    if cfg.dist == "fixed":
        return float(cfg.fixed_length)
    if cfg.dist != "trace":
        rounds = read_trace_rounds(cfg.trace_path, cfg.gamma)
        recorded = rounds[cfg.seed % len(rounds)]
        return float(recorded.repeat(-(-cfg.batch_size // recorded.numel()))[: cfg.batch_size].double().mean())
    return float(read_trace(cfg.trace_path, cfg.gamma).double().mean())


@dataclass
class VerifyWorkload:
    """Inputs of one verification step plus the oracle answer."""

    config: VerifyConfig
    draft_tokens: torch.Tensor  # [B, γ]
    target_tokens: torch.Tensor  # [B, γ+1]; agrees with the draft before k_i, differs at k_i
    accepted_lengths: torch.Tensor  # [B] int64, the oracle
    draft_kv: torch.Tensor | None  # [B, γ, kv_dim] or None when kv_dim == 0

    @property
    def device(self) -> torch.device:
        return self.draft_tokens.device


def make_verify_workload(cfg: VerifyConfig, device: str | torch.device = "cpu") -> VerifyWorkload:
    """Build the seeded inputs for cfg on device. Fresh random tokens everywhere (never zeros)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    batch, gamma, vocab = cfg.batch_size, cfg.gamma, cfg.vocab_size
    accepted_lengths = sample_accepted_lengths(cfg, gen)

    draft = torch.randint(0, vocab, (batch, gamma), generator=gen, dtype=torch.int64)
    target = torch.randint(0, vocab, (batch, gamma + 1), generator=gen, dtype=torch.int64)
    positions = torch.arange(gamma).expand(batch, gamma)
    agree = positions < accepted_lengths[:, None]
    target[:, :gamma] = torch.where(agree, draft, target[:, :gamma])
    # At the first rejection the target must differ: shift the draft token by a non-zero amount.
    shift = torch.randint(1, vocab, (batch,), generator=gen, dtype=torch.int64)
    rejected = accepted_lengths < gamma
    rows = torch.nonzero(rejected).squeeze(1)
    cols = accepted_lengths[rejected]
    target[rows, cols] = (draft[rows, cols] + shift[rejected]) % vocab

    token_dtype = TOKEN_DTYPES[cfg.token_dtype]
    draft_kv = None
    if cfg.kv_dim > 0:
        device_type = torch.device(device).type
        kv_gen = torch.Generator(device=device).manual_seed(cfg.seed + 1) if device_type != "cpu" else gen
        draft_kv = torch.randn(
            (batch, gamma, cfg.kv_dim), generator=kv_gen, device=device, dtype=torch.float32
        ).to(KV_DTYPES[cfg.kv_dtype])
    return VerifyWorkload(
        config=cfg,
        draft_tokens=draft.to(device=device, dtype=token_dtype),
        target_tokens=target.to(device=device, dtype=token_dtype),
        accepted_lengths=accepted_lengths.to(device),
        draft_kv=draft_kv,
    )
