"""Per-GPU calibration profiles: `profiles/<gpu-slug>.toml`, written by `sdbench calibrate-tau`.

A profile is small and flat (one TOML table of scalars and one-line lists), so it is written by hand here
and read with tomllib (Python >= 3.11) or the tiny parser below on 3.10: no dependency for 20 lines.

Its rule takes one of two forms. A per-size rule (written by `calibrate-tau` racing several
implementations): `segment_upper_bytes = [b1, b2, ..., inf]` and `segment_impls = [i0, i1, ...]`, i.e.
accepted KV in [0, b1) -> i0, [b1, b2) -> i1, ... A two-implementation rule (the first profiles, and
`calibrate-tau --small/--large`): `tau_bytes`, `small_impl` below it, `large_impl` above. A file holds
one form, never both; `Profile.segments()` gives either as segments, which is all the dispatcher reads.
The dispatcher (`sdbench.dispatch`) matches the current GPU to a profile by name, then by compute
capability plus model (e.g. two H100 80GB variants share a profile only when no exact one exists).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sdbench.errors import SdbenchError, writable_folder

PROFILE_VERSION = 1
PROFILES_ENV = "SDBENCH_PROFILES"


@dataclass(frozen=True)
class Profile:
    """What calibrate-tau measured on one GPU, and the dispatcher rule it implies.

    Per-size rule (segment_impls given): accepted KV bytes (B · E[k] · kv_dim · elem_size) in
    [segment_upper_bytes[i-1], segment_upper_bytes[i]) -> segment_impls[i] (the first segment starts at 0,
    the last ends at inf). Two-implementation rule (no segments): bytes < tau_bytes -> small_impl, else
    large_impl; tau_bytes = inf: the small-work implementation won at every measured size; 0: it never won.
    """

    gpu_name: str
    tau_bytes: float = math.inf
    small_impl: str = "fused_single_block"
    large_impl: str = "ballot+pack_torch"
    segment_upper_bytes: list[float] = field(default_factory=list)  # ascending, the last inf
    segment_impls: list[str] = field(default_factory=list)  # one per segment, none for a τ rule
    gpu_cc: str = ""
    gpu_sms: int = 0
    driver: str = ""
    tau_low_bytes: float = 0.0  # bootstrap confidence band on tau
    tau_high_bytes: float = math.inf
    view: str = "wall"  # the timing view the rule was fitted on
    launch_floor_us: float = 0.0
    copy_bandwidth_gbps: float = 0.0  # device-to-device copy, bytes read + written per second
    copy_bandwidth_source: str = ""  # "cuda events" or "max achieved in the results"
    configs: int = 0  # configs every raced implementation was measured on
    misclassified: int = 0  # of those, configs where the rule picks one that is not the fastest
    candidates: list[str] = field(default_factory=list)  # the implementations raced (per-size rule)
    date: str = ""
    sdbench_version: str = ""
    source_run_ids: list[str] = field(default_factory=list)
    note: str = ""
    profile_version: int = PROFILE_VERSION

    @property
    def slug(self) -> str:
        return gpu_slug(self.gpu_name)

    @property
    def per_size(self) -> bool:
        """A per-size (segment) rule rather than a τ rule."""
        return bool(self.segment_impls)

    def segments(self) -> tuple[tuple[float, float, str], ...]:
        """The rule as (low_bytes, high_bytes, impl) segments covering [0, inf), in order."""
        if self.per_size:
            lows = [0.0] + [float(bound) for bound in self.segment_upper_bytes[:-1]]
            return tuple(zip(lows, (float(bound) for bound in self.segment_upper_bytes), self.segment_impls, strict=True))
        if math.isinf(self.tau_bytes):
            return ((0.0, math.inf, self.small_impl),)
        if self.tau_bytes <= 0:
            return ((0.0, math.inf, self.large_impl),)
        return ((0.0, self.tau_bytes, self.small_impl), (self.tau_bytes, math.inf, self.large_impl))

    def segment_index(self, kv_bytes: float) -> int:
        """Which segment holds kv_bytes (its upper bound is exclusive)."""
        uppers = [high for _, high, _ in self.segments()]
        return min(bisect.bisect_right(uppers, kv_bytes), len(uppers) - 1)

    def rule(self) -> str:
        """The one-line dispatcher rule, in words."""
        if self.per_size:
            segments = self.segments()
            if len(segments) == 1:
                return f"{self.gpu_name}: always {segments[0][2]} (it won at every measured size)"
            parts = [f"< {format_bytes(high)} -> {impl}" for _, high, impl in segments[:-1]]
            return f"{self.gpu_name}: accepted KV bytes {', '.join(parts)}, else {segments[-1][2]}"
        if math.isinf(self.tau_bytes):
            return f"{self.gpu_name}: always {self.small_impl} (no crossover in measured range; τ = ∞)"
        if self.tau_bytes <= 0:
            return f"{self.gpu_name}: always {self.large_impl} (no crossover in measured range; τ = 0)"
        return (
            f"{self.gpu_name}: accepted KV bytes < τ = {format_bytes(self.tau_bytes)} -> {self.small_impl}, "
            f"else {self.large_impl}"
        )


# The keys of each rule form: a file holds one form's keys, never both.
TAU_RULE_KEYS = ("tau_bytes", "small_impl", "large_impl", "tau_low_bytes", "tau_high_bytes")
SEGMENT_RULE_KEYS = ("segment_upper_bytes", "segment_impls", "candidates")


def gpu_slug(gpu_name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the profile's file name)."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")
    return slug or "unknown-gpu"


def format_bytes(n_bytes: float) -> str:
    if math.isinf(n_bytes):
        return "∞"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.3g} {unit}"
    return f"{n_bytes:.0f} B"


def profiles_dir() -> Path:
    """$SDBENCH_PROFILES, else the repository's profiles/ beside the sdbench package."""
    configured = os.environ.get(PROFILES_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / "profiles"


# --- TOML ----------------------------------------------------------------------------------------
def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to a profile")


def dumps(profile: Profile) -> str:
    lines = [
        f"# sdbench profile for {profile.gpu_name}, written by `sdbench calibrate-tau`.",
        f"# Rule: {profile.rule()}",
    ]
    skipped = TAU_RULE_KEYS if profile.per_size else SEGMENT_RULE_KEYS
    for item in dataclasses.fields(profile):
        if item.name not in skipped:
            lines.append(f"{item.name} = {_toml_value(getattr(profile, item.name))}")
    return "\n".join(lines) + "\n"


def _parse_scalar(text: str, where: str):
    text = text.strip()
    if text.startswith('"') and text.endswith('"') and len(text) >= 2:
        body = text[1:-1]
        return re.sub(r'\\(["\\n])', lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), body)
    if text in ("true", "false"):
        return text == "true"
    if text in ("inf", "+inf", "-inf", "nan"):
        return float(text)
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        raise SdbenchError(f"{where}: cannot read value {text!r}") from None


def _split_array(body: str) -> list[str]:
    items, current, quoted = [], "", False
    for char in body:
        if char == '"' and not current.endswith("\\"):
            quoted = not quoted
        if char == "," and not quoted:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item for item in items if item.strip()]


def parse_flat_toml(text: str, where: str = "profile") -> dict:
    """The subset of TOML profiles use: `key = value` lines, scalars and one-line arrays, comments."""
    values = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, rest = line.partition("=")
        if not sep:
            raise SdbenchError(f"{where}:{number}: expected `key = value`, got {line!r}")
        rest = rest.strip()
        if not rest.startswith('"') and "#" in rest:
            rest = rest.split("#", 1)[0].strip()
        if rest.startswith("["):
            if not rest.endswith("]"):
                raise SdbenchError(f"{where}:{number}: arrays must close on the same line")
            values[key.strip()] = [_parse_scalar(item, f"{where}:{number}") for item in _split_array(rest[1:-1])]
        else:
            values[key.strip()] = _parse_scalar(rest, f"{where}:{number}")
    return values


def loads(text: str, where: str = "profile") -> Profile:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        data = parse_flat_toml(text, where)
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise SdbenchError(f"{where} is not valid TOML: {err}") from None
    known = {item.name: item for item in dataclasses.fields(Profile)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise SdbenchError(f"{where}: unknown keys {', '.join(unknown)} (written by a newer sdbench?)")
    if "gpu_name" not in data:
        raise SdbenchError(f"{where}: missing 'gpu_name'; re-run `sdbench calibrate-tau`")
    if "segment_impls" in data or "segment_upper_bytes" in data:
        _check_segments(data, where)
    elif "tau_bytes" not in data:
        raise SdbenchError(f"{where}: missing 'tau_bytes' (or segment_upper_bytes and segment_impls); "
                           "re-run `sdbench calibrate-tau`")
    if data.get("profile_version", PROFILE_VERSION) != PROFILE_VERSION:
        raise SdbenchError(
            f"{where}: profile version {data['profile_version']} is not {PROFILE_VERSION}; re-run `sdbench calibrate-tau`"
        )
    for name in ("tau_bytes", "tau_low_bytes", "tau_high_bytes", "launch_floor_us", "copy_bandwidth_gbps"):
        if name in data:
            data[name] = float(data[name])
    for name in ("source_run_ids", "segment_impls", "candidates"):
        if name in data:
            data[name] = [str(item) for item in data[name]]
    if "segment_upper_bytes" in data:
        data["segment_upper_bytes"] = [float(bound) for bound in data["segment_upper_bytes"]]
    return Profile(**data)


def _check_segments(data: dict, where: str) -> None:
    """A per-size rule is whole: both lists, one bound per impl, ascending, the last inf, and no τ keys."""
    both = [key for key in TAU_RULE_KEYS if key in data]
    if both:
        raise SdbenchError(f"{where}: holds a per-size rule (segment_*) and τ-rule keys ({', '.join(both)}); "
                           "keep one form")
    uppers, impls = data.get("segment_upper_bytes"), data.get("segment_impls")
    if not isinstance(uppers, list) or not isinstance(impls, list) or not impls or len(uppers) != len(impls):
        raise SdbenchError(f"{where}: segment_upper_bytes and segment_impls must be lists of the same length "
                           f"(one upper bound per implementation), got {uppers!r} and {impls!r}")
    try:
        bounds = [float(bound) for bound in uppers]
    except (TypeError, ValueError):
        raise SdbenchError(f"{where}: segment_upper_bytes must be numbers, got {uppers!r}") from None
    if not math.isinf(bounds[-1]) or any(not 0 < low < high for low, high in zip(bounds, bounds[1:], strict=False)) or bounds[0] <= 0:
        raise SdbenchError(f"{where}: segment_upper_bytes must rise strictly from above 0 and end with inf, "
                           f"got {uppers!r}")


def write_profile(profile: Profile, directory: str | Path | None = None) -> Path:
    directory = writable_folder(directory if directory is not None else profiles_dir(), "--profiles")
    path = directory / f"{profile.slug}.toml"
    temporary = path.with_suffix(".toml.tmp")
    temporary.write_text(dumps(profile))
    temporary.replace(path)
    return path


def read_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise SdbenchError(f"profile {str(path)!r} does not exist")
    return loads(path.read_text(), where=str(path))


def load_profiles(directory: str | Path | None = None) -> list[Profile]:
    """Every readable `*.toml` profile in directory (sorted by file name)."""
    directory = Path(directory) if directory is not None else profiles_dir()
    if not directory.is_dir():
        return []
    return [read_profile(path) for path in sorted(directory.glob("*.toml"))]


def _model_token(gpu_name: str) -> str:
    """The model word of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'h100', 'NVIDIA L40S' -> 'l40s'."""
    for word in gpu_slug(gpu_name).split("-"):
        if word not in ("nvidia", "tesla", "geforce", "rtx", "quadro") and re.search(r"\d", word):
            return word
    return gpu_slug(gpu_name)


def match_profile(profiles: list[Profile], gpu_name: str, gpu_cc: str = "") -> Profile | None:
    """The profile for this GPU: same name (case-insensitive), else same compute capability and model."""
    for profile in profiles:
        if profile.slug == gpu_slug(gpu_name):
            return profile
    if gpu_cc:
        for profile in profiles:
            if profile.gpu_cc == gpu_cc and _model_token(profile.gpu_name) == _model_token(gpu_name):
                return profile
    return None


# --- the crossover fit (calibrate-tau fits it; the report draws and checks it) ---------------------------
def _group(kv_bytes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct byte values (sorted) and the sum of values at each."""
    distinct, inverse = np.unique(kv_bytes, return_inverse=True)
    return distinct, np.bincount(inverse, weights=values, minlength=len(distinct))


def best_threshold(kv_bytes: np.ndarray, small_us: np.ndarray, large_us: np.ndarray) -> tuple[float, int]:
    """(τ, misclassified) of the step rule with the lowest total latency.

    τ lies inside the chosen gap between neighbouring distinct byte values, where the mean log ratio
    log(t_small / t_large) crosses zero (linear in log-bytes); 0 or ∞ when no cut beats a constant rule.
    """
    distinct, small_sum = _group(kv_bytes, small_us)
    _, large_sum = _group(kv_bytes, large_us)
    _, small_better = _group(kv_bytes, (small_us < large_us).astype(float))
    _, counts = _group(kv_bytes, np.ones_like(kv_bytes))
    # Cut j: small for the first j distinct values, large for the rest (j = 0 ... m).
    small_prefix = np.concatenate([[0.0], np.cumsum(small_sum)])
    large_suffix = np.concatenate([np.cumsum(large_sum[::-1])[::-1], [0.0]])
    cost = small_prefix + large_suffix
    wrong_prefix = np.concatenate([[0.0], np.cumsum(counts - small_better)])  # small chosen, large was faster
    wrong_suffix = np.concatenate([np.cumsum(small_better[::-1])[::-1], [0.0]])
    wrong = wrong_prefix + wrong_suffix
    # Lowest cost; among (numerically) equal costs, fewest misclassified, then the earliest cut.
    tolerance = 1e-9 * max(float(cost.max()), 1.0)
    candidates = np.flatnonzero(cost <= cost.min() + tolerance)
    cut = int(candidates[np.argmin(wrong[candidates])])
    misclassified = int(round(wrong[cut]))
    if cut == 0:
        return 0.0, misclassified
    if cut == len(distinct):
        return math.inf, misclassified
    log_ratio_sum = _group(kv_bytes, np.log(small_us / large_us))[1]
    mean_log_ratio = log_ratio_sum / counts
    below, above = cut - 1, cut
    return crossing_bytes(distinct[below], distinct[above], mean_log_ratio[below], mean_log_ratio[above]), misclassified


def crossing_bytes(low_bytes: float, high_bytes: float, log_ratio_low: float, log_ratio_high: float) -> float:
    """Where, between two neighbouring measured byte values, the left implementation stops winning.

    log_ratio_*: mean log(t_left / t_right) at each; the cut is where it crosses zero, linear in
    log-bytes, or the middle of the gap (log scale) when it does not change sign across it.
    """
    log_low, log_high = math.log(max(low_bytes, 1.0)), math.log(max(high_bytes, 1.0))
    if log_ratio_low < 0 < log_ratio_high:
        fraction = -log_ratio_low / (log_ratio_high - log_ratio_low)
    else:
        fraction = 0.5
    return math.exp(log_low + fraction * (log_high - log_low))


def fewest_segments(loss: np.ndarray, tiebreak: np.ndarray, budget: float) -> tuple[list[tuple[int, int, int]], np.ndarray]:
    """The per-size rule with the fewest segments whose total loss stays within budget.

    loss, tiebreak: [groups, impls], each implementation's loss at each distinct byte value (ascending);
    a rule splits the groups into runs and gives each run one implementation. Exact dynamic program over
    (group, segments so far, implementation of the current one), all segment counts at once: for each
    count the cheapest rule (lowest loss, then lowest tiebreak, then the earliest cut); the answer is the
    fewest within budget (budget >= the per-group best, which the finest rule reaches). O(groups ·
    segments · impls²). Returns the rule, [(first group, end group (exclusive), impl index)], and the least
    loss with at most 1, 2, ... segments up to the finest rule (what fewer segments would cost).
    """
    groups, impls = loss.shape
    winners = loss.argmin(axis=1)
    most = 1 + int(np.count_nonzero(winners[1:] != winners[:-1]))  # the finest rule has this many
    slack = 1e-9 * max(1.0, float(np.abs(loss).sum()))
    # cost[k, i], extra[k, i]: the groups so far in k + 1 segments, the last one running impl i
    cost, extra = np.full((most, impls), np.inf), np.full((most, impls), np.inf)
    cost[0], extra[0] = loss[0], tiebreak[0]
    came_from = np.zeros((groups, most, impls), dtype=np.int16)  # impl of the previous group
    came_from[0] = np.arange(impls)
    others = ~np.eye(impls, dtype=bool)  # [to i, from j]: a new segment changes implementation
    for group in range(1, groups):
        from_cost = np.where(others, cost[:, None, :], np.inf)
        from_extra = np.where(others, extra[:, None, :], np.inf)
        near = from_cost <= from_cost.min(axis=2, keepdims=True) + slack
        previous = np.argmin(np.where(near, from_extra, np.inf), axis=2)
        switch_cost = np.take_along_axis(from_cost, previous[..., None], 2)[..., 0]
        switch_extra = np.take_along_axis(from_extra, previous[..., None], 2)[..., 0]
        # a switch from k + 1 segments makes k + 2
        switch_cost = np.vstack([np.full((1, impls), np.inf), switch_cost[:-1]])
        switch_extra = np.vstack([np.full((1, impls), np.inf), switch_extra[:-1]])
        previous = np.vstack([np.zeros((1, impls), dtype=previous.dtype), previous[:-1]])
        stay = (cost < switch_cost - slack) | ((cost <= switch_cost + slack) & (extra <= switch_extra))
        cost = np.where(stay, cost, switch_cost) + loss[group]
        extra = np.where(stay, extra, switch_extra) + tiebreak[group]
        came_from[group] = np.where(stay, np.arange(impls), previous)
    count = next(k for k in range(most) if cost[k].min() <= budget + slack)
    near = cost[count] <= cost[count].min() + slack
    impl = int(np.argmin(np.where(near, extra[count], np.inf)))
    plan, end = [], groups
    for group in range(groups - 1, 0, -1):
        previous = int(came_from[group, count, impl])
        if previous != impl:
            plan.append((group, end, impl))
            end, impl, count = group, previous, count - 1
    plan.append((0, end, impl))
    return plan[::-1], np.minimum.accumulate(cost.min(axis=1))
