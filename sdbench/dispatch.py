"""The runtime dispatcher behind `verify_pack(..., impl="auto")`: whichever implementation wins at this size.

Rule (from the profile matching the current GPU, see sdbench.thresholds): accepted KV bytes
B · E[k] · kv_dim · elem_size fall in one of the profile's segments [low, high), each naming the
implementation that won there (a τ profile is two segments: [0, τ) -> small_impl, [τ, ∞) -> large_impl).
E[k] = expected_alpha · γ comes from the caller (or the previous step's mean): the decision reads
shapes and that number only, never a tensor's contents, so it adds no host sync. Decisions are cached
per (device, shape, α), so the hot path is one dict lookup.

When the segment's implementation cannot take the shape (fused_single_block needs B <= 32) or cannot run
on the device, the next one that can is used: the rule's other implementations, nearest segment first
(larger sizes before smaller), then `fused` (one launch, any B), then the eager reference.

With no profile for this GPU it falls back, warning once per GPU name, to DEFAULT_PROFILE: always `fused`,
the one-launch verify-and-pack that takes any B and never syncs. (The published study's L40S pair —
fused_single_block below τ ≈ 5 MB, ballot + draft_kv[mask] above — would put one SM on the small side,
342 µs against 47.9 µs for `fused` at b=32, γ=128, kv=2048 on the H100, and a host sync on the large
side.) `sdbench calibrate-tau` on the GPU writes its own profile.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass

from sdbench import thresholds
from sdbench.errors import SdbenchError
from sdbench.thresholds import Profile, format_bytes

ANY_SHAPE_IMPL = "fused"  # one launch, any B, no host sync: the last resort before the eager reference
DEFAULT_PROFILE = Profile(
    gpu_name="any GPU without a profile", gpu_cc="", segment_upper_bytes=[math.inf], segment_impls=[ANY_SHAPE_IMPL],
    note="the default when no profile matches: always fused (one launch, any B, no host sync)",
)
DEFAULT_SOURCE = "built-in default (always fused: one launch, any B, no host sync)"
CPU_IMPL = "torch_eager"


@dataclass(frozen=True)
class Decision:
    impl: str
    reason: str
    kv_bytes: float  # estimated accepted KV bytes
    profile: Profile
    profile_source: str  # the profile's file, or DEFAULT_SOURCE
    fallbacks: tuple[str, ...] = ()  # the next ones that take the shape, should impl be unavailable on the device


def estimate_accepted_kv_bytes(batch_size: int, gamma: int, kv_dim: int, kv_elem_size: int,
                               expected_alpha: float) -> float:
    """B · E[k] · kv_dim · elem_size with E[k] = α · γ (α: expected accepted fraction of the draft)."""
    return batch_size * expected_alpha * gamma * kv_dim * kv_elem_size


def _shape_reason(impl_name: str, batch_size: int, gamma: int, kv_dim: int, kv_dtype: str) -> str | None:
    """Why the registered implementation cannot take this shape; None when it can or is not registered
    here (whether it can run on this device is `choose`'s question)."""
    from sdbench import registry
    from sdbench.ops.workload import VerifyConfig

    for impl in registry.implementations("verify_pack"):
        if impl.name == impl_name:
            config = VerifyConfig(batch_size=batch_size, gamma=gamma, kv_dim=kv_dim, kv_dtype=kv_dtype)
            return impl.supports(config)
    return None


def fallback_order(profile: Profile, index: int) -> list[str]:
    """The implementations to try when segment index's cannot take a shape: the rule's others, nearest
    segment first (the larger-size neighbour before the smaller), then a τ profile's large side, then fused."""
    impls = [impl for _, _, impl in profile.segments()]
    order = []
    for distance in range(1, len(impls)):
        order += [impls[i] for i in (index + distance, index - distance) if 0 <= i < len(impls)]
    if not profile.per_size:
        order.append(profile.large_impl)
    order.append(ANY_SHAPE_IMPL)
    picked = impls[index]
    return [name for position, name in enumerate(order) if name != picked and name not in order[:position]]


def decide(batch_size: int, gamma: int, kv_dim: int, kv_elem_size: int, expected_alpha: float,
           profile: Profile, profile_source: str = "", kv_dtype: str = "float16") -> Decision:
    """The profile's rule for this shape (device-independent; see `choose` for availability)."""
    kv_bytes = estimate_accepted_kv_bytes(batch_size, gamma, kv_dim, kv_elem_size, expected_alpha)
    index = profile.segment_index(kv_bytes)
    low, high, impl = profile.segments()[index]
    why = f"{format_bytes(kv_bytes)} of accepted KV in [{format_bytes(low)}, {format_bytes(high)}) -> {impl}"
    if not profile.per_size:
        why += f" (τ = {format_bytes(profile.tau_bytes)} on {profile.gpu_name})"
    alternatives = fallback_order(profile, index)
    takers = [name for name in alternatives if _shape_reason(name, batch_size, gamma, kv_dim, kv_dtype) is None]
    cannot = _shape_reason(impl, batch_size, gamma, kv_dim, kv_dtype)
    if cannot:
        # The first alternative that takes the shape; when none does, the next segment's, as the τ rule
        # always chose (the API then refuses the shape with that implementation's reason).
        replacement = takers[0] if takers else alternatives[0] if alternatives else impl
        why = f"{why}, but {impl} cannot run it ({cannot}): {replacement}"
        impl = replacement
    return Decision(impl, why, kv_bytes, profile, profile_source, tuple(name for name in takers if name != impl))


# --- the profile of the current GPU ---------------------------------------------------------------
_warned_gpus: set[str] = set()


def reset() -> None:
    """Forget cached profiles, decisions and warnings (tests; after writing a new profile)."""
    _warned_gpus.clear()
    profile_for_gpu.cache_clear()
    _device_identity.cache_clear()
    _cached_choice.cache_clear()
    _availability.cache_clear()


@functools.cache
def profile_for_gpu(gpu_name: str, gpu_cc: str = "") -> tuple[Profile, str]:
    """(profile, where it came from) for a GPU; DEFAULT_PROFILE with a one-time warning if none matches."""
    directory = thresholds.profiles_dir()
    found = thresholds.match_profile(thresholds.load_profiles(directory), gpu_name, gpu_cc)
    if found is not None:
        return found, str(directory / f"{found.slug}.toml")
    if gpu_name not in _warned_gpus:
        _warned_gpus.add(gpu_name)
        warnings.warn(
            f"sdbench: no profile for {gpu_name!r} (CC {gpu_cc or '?'}) in {directory}; the dispatcher uses the "
            f"{DEFAULT_SOURCE}. Run `sdbench calibrate-tau` on this GPU to write one.",
            stacklevel=3,
        )
    return DEFAULT_PROFILE, DEFAULT_SOURCE


@functools.cache
def _device_identity(device_index: int) -> tuple[str, str]:
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return torch.cuda.get_device_name(device_index), f"{major}.{minor}"


@functools.cache
def _availability(impl_name: str, device: str) -> str | None:
    from sdbench import registry

    try:
        impl = registry.get("verify_pack", impl_name)
    except ValueError as err:
        return str(err)
    return impl.unavailable_reason(device)


@functools.lru_cache(maxsize=4096)
def _cached_choice(device: str, batch_size: int, gamma: int, kv_dim: int, kv_elem_size: int,
                   expected_alpha: float, kv_dtype: str) -> Decision:
    import torch

    if torch.device(device).type != "cuda":
        return Decision(CPU_IMPL, "CPU tensors run the eager PyTorch reference", 0.0, DEFAULT_PROFILE, "")
    index = torch.device(device).index
    gpu_name, gpu_cc = _device_identity(index if index is not None else torch.cuda.current_device())
    profile, source = profile_for_gpu(gpu_name, gpu_cc)
    decision = decide(batch_size, gamma, kv_dim, kv_elem_size, expected_alpha, profile, source, kv_dtype)
    chain = [decision.impl, *decision.fallbacks, CPU_IMPL]
    why = decision.reason
    for name in chain:
        missing = _availability(name, device)
        if missing is None:
            return Decision(name, why, decision.kv_bytes, profile, source)
        why = f"{why}; {name} unavailable here ({missing})"
    return Decision(CPU_IMPL, why, decision.kv_bytes, profile, source)


def choose(device, batch_size: int, gamma: int, kv_dim: int, kv_elem_size: int, expected_alpha: float,
           kv_dtype: str = "float16") -> Decision:
    """The implementation `verify_pack(impl="auto")` runs for this shape on device (cached)."""
    return _cached_choice(str(device), batch_size, gamma, kv_dim, kv_elem_size, round(float(expected_alpha), 3),
                          kv_dtype)


def explain(batch_size: int | None, gamma: int | None, alpha: float | None, kv_dim: int | None,
            kv_dtype: str = "float16", gpu_name: str | None = None, dist: str = "binomial") -> tuple[Decision, list[str]]:
    """The decision for a workload and every fact it rests on, for `sdbench list --dispatch`.

    alpha is the acceptance rate of dist (binomial: E[k] = α·γ; geometric: α(1 − α^γ)/(1 − α)).
    """
    import torch

    missing = [name for name, value in (("--b", batch_size), ("--gamma", gamma), ("--alpha", alpha),
                                        ("--kv-dim", kv_dim)) if value is None]
    if missing:
        raise SdbenchError(f"--dispatch needs the workload: {' '.join(missing)} "
                           "(e.g. --b 32 --gamma 128 --alpha 0.9 --kv-dim 2048)")
    if kv_dim < 1:
        raise SdbenchError(f"--kv-dim must be >= 1 (verify_pack moves KV), got {kv_dim}")

    from sdbench.ops.workload import KV_DTYPES, VerifyConfig, expected_accepted_length

    config = VerifyConfig(batch_size=batch_size, gamma=gamma, alpha=alpha, kv_dim=kv_dim, kv_dtype=kv_dtype, dist=dist)
    expected_k = expected_accepted_length(config)
    elem_size = torch.empty((), dtype=KV_DTYPES[kv_dtype]).element_size()
    lines = []
    on_gpu = gpu_name is None and torch.cuda.is_available()
    if on_gpu:
        gpu_name, gpu_cc = _device_identity(torch.cuda.current_device())
        lines.append(f"GPU: {gpu_name} (CC {gpu_cc})")
    elif gpu_name is None:
        gpu_cc = ""
        lines.append("no CUDA device here: showing the rule of the profile a GPU would use (pick one with --gpu NAME)")
    else:
        gpu_cc = ""
        lines.append(f"GPU: {gpu_name} (given with --gpu)")
    if gpu_name is None:
        profile, source = DEFAULT_PROFILE, DEFAULT_SOURCE
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profile, source = profile_for_gpu(gpu_name, gpu_cc)
    lines.append(f"profile: {source}" + (f" (no profile matches {gpu_name!r})" if source == DEFAULT_SOURCE and gpu_name
                                         else ""))
    lines.append(f"rule: {profile.rule()}")
    if profile.tau_high_bytes != math.inf or profile.tau_low_bytes > 0:
        lines.append(f"τ band: {format_bytes(profile.tau_low_bytes)} to {format_bytes(profile.tau_high_bytes)}")
    lines.append(f"E[k] = {expected_k:.3g} of γ = {gamma} ({dist}, α = {alpha:g}); accepted KV = B · E[k] · kv_dim · "
                 f"elem = {batch_size} · {expected_k:.3g} · {kv_dim} · {elem_size} = "
                 f"{format_bytes(batch_size * expected_k * kv_dim * elem_size)}")
    decision = decide(batch_size, gamma, kv_dim, elem_size, expected_k / gamma, profile, source, kv_dtype)
    if on_gpu:
        device = f"cuda:{torch.cuda.current_device()}"
        chosen = choose(device, batch_size, gamma, kv_dim, elem_size, expected_k / gamma, kv_dtype)
        if chosen.impl != decision.impl:
            decision = chosen
    lines.append(f"decision: {decision.impl} ({decision.reason})")
    return decision, lines
