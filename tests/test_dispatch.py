"""The dispatcher: picks by τ on estimated accepted KV bytes, never reads tensors, falls back (warning once)
to the sync-free `fused` when no profile matches the GPU."""

import math
import warnings

import pytest
from typer.testing import CliRunner

from sdbench import dispatch, thresholds
from sdbench.cli import app
from sdbench.ops.workload import VerifyConfig
from sdbench.thresholds import Profile

runner = CliRunner()
H100 = "NVIDIA H100 80GB HBM3"
PROFILE = Profile(gpu_name=H100, gpu_cc="9.0", tau_bytes=4e6, small_impl="fused_single_block",
                  large_impl="ballot+pack_torch")


@pytest.fixture(autouse=True)
def isolated_profiles(tmp_path, monkeypatch):
    """Every test sees its own (empty) profiles folder and a fresh dispatcher cache."""
    monkeypatch.setenv(thresholds.PROFILES_ENV, str(tmp_path))
    dispatch.reset()
    yield tmp_path
    dispatch.reset()


def _decide(batch, gamma, kv_dim, alpha, profile=PROFILE):
    return dispatch.decide(batch, gamma, kv_dim, 2, alpha, profile)


def test_estimate_is_b_times_expected_k_times_row_bytes():
    assert dispatch.estimate_accepted_kv_bytes(32, 128, 2048, 2, 0.9) == pytest.approx(32 * 0.9 * 128 * 2048 * 2)


@pytest.mark.parametrize("batch, gamma, kv_dim, alpha, expected", [
    (4, 8, 128, 0.9, "fused_single_block"),  # 7.4 KB
    (32, 128, 512, 0.9, "fused_single_block"),  # 3.8 MB < 4 MB
    (32, 128, 1024, 0.9, "ballot+pack_torch"),  # 7.5 MB
    (32, 128, 2048, 0.3, "ballot+pack_torch"),  # 5.0 MB
    (32, 128, 2048, 0.2, "fused_single_block"),  # 3.4 MB: lower acceptance, less to copy
])
def test_picks_by_tau(batch, gamma, kv_dim, alpha, expected):
    assert _decide(batch, gamma, kv_dim, alpha).impl == expected


def test_infinite_tau_always_picks_the_small_side():
    forever = Profile(gpu_name=H100, tau_bytes=math.inf, small_impl="fused", large_impl="ballot+pack_torch")
    for batch in (1, 32, 4096):
        decision = _decide(batch, 1024, 8192, 1.0, forever)
        assert decision.impl == "fused" and "τ = ∞" in decision.reason


def test_zero_tau_always_picks_the_large_side():
    never = Profile(gpu_name=H100, tau_bytes=0.0)
    assert _decide(1, 1, 8, 0.0, never).impl == "ballot+pack_torch"


def test_small_side_that_cannot_take_the_shape_yields(monkeypatch):
    """fused_single_block is one block of 32 warps: B > 32 goes to the large side, with the reason."""
    monkeypatch.setattr(dispatch, "_shape_reason", lambda name, b, *_: "needs B <= 32" if b > 32 else None)
    decision = _decide(64, 8, 128, 0.5)
    assert decision.impl == "ballot+pack_torch" and "cannot run it (needs B <= 32)" in decision.reason


def test_profile_for_a_calibrated_gpu(isolated_profiles):
    thresholds.write_profile(PROFILE, isolated_profiles)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found, source = dispatch.profile_for_gpu(H100, "9.0")
    assert found == PROFILE and source.endswith("nvidia-h100-80gb-hbm3.toml")


def test_unknown_gpu_falls_back_to_sync_free_fused_warning_once():
    with pytest.warns(UserWarning, match="no profile for 'NVIDIA B200'.*always fused.*sdbench calibrate-tau"):
        found, source = dispatch.profile_for_gpu("NVIDIA B200", "10.0")
    assert found is dispatch.DEFAULT_PROFILE and source == dispatch.DEFAULT_SOURCE
    dispatch.profile_for_gpu.cache_clear()  # even when asked again from scratch: no second warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dispatch.profile_for_gpu("NVIDIA B200", "10.0")
    from sdbench import registry

    for batch, gamma, kv_dim, alpha in [(1, 4, 64, 0.3), (32, 128, 2048, 0.9), (65536, 8, 128, 0.9)]:
        decision = dispatch.decide(batch, gamma, kv_dim, 2, alpha, found, source)
        entry = registry.get("verify_pack", decision.impl)
        assert decision.impl == "fused" and not entry.sync and entry.supports(
            VerifyConfig(batch, gamma, alpha, kv_dim=kv_dim)) is None, (batch, decision)


def test_unknown_gpu_on_a_device_picks_fused(monkeypatch):
    """choose() on a CUDA device whose name has no profile: the decision, without a real GPU."""
    dispatch.reset()
    import functools

    # cached like the originals, so dispatch.reset() can clear them
    monkeypatch.setattr(dispatch, "_device_identity", functools.cache(lambda index: ("NVIDIA H200 NVL", "9.0")))
    monkeypatch.setattr(dispatch, "_availability", functools.cache(lambda name, device: None))
    with pytest.warns(UserWarning, match="NVIDIA H200 NVL"):
        decision = dispatch.choose("cuda:0", 256, 8, 1024, 2, 0.9)
    assert decision.impl == "fused" and decision.profile_source == dispatch.DEFAULT_SOURCE
    dispatch.reset()


def test_cpu_tensors_run_the_eager_reference():
    decision = dispatch.choose("cpu", 32, 128, 2048, 2, 0.9)
    assert decision.impl == "torch_eager"


def test_choose_is_cached_per_shape():
    first = dispatch.choose("cpu", 4, 8, 64, 2, 0.5)
    assert dispatch.choose("cpu", 4, 8, 64, 2, 0.5) is first


def test_list_dispatch_with_the_default(isolated_profiles):
    args = ["list", "--dispatch", "--b", "32", "--gamma", "128", "--alpha", "0.9", "--kv-dim", "2048",
            "--gpu", "NVIDIA B200"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "built-in default (always fused: one launch, any B, no host sync)" in output
    assert "= 15.1 MB" in output and "decision: fused" in output


def test_list_dispatch_with_a_profile(isolated_profiles):
    thresholds.write_profile(Profile(gpu_name=H100, gpu_cc="9.0", tau_bytes=math.inf, small_impl="fused"),
                           isolated_profiles)
    args = ["list", "--dispatch", "--b", "32", "--gamma", "128", "--alpha", "0.9", "--kv-dim", "2048", "--gpu", H100]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "nvidia-h100-80gb-hbm3.toml" in "".join(output.split()) and "decision: fused" in output


def test_list_dispatch_needs_the_workload():
    result = runner.invoke(app, ["list", "--dispatch", "--b", "32"])
    assert result.exit_code == 2 and "--dispatch needs" in result.output


# --- per-size rules (segments) ----------------------------------------------------------------------
ROOT_PROFILES = __import__("pathlib").Path(__file__).resolve().parents[1] / "profiles"
# accepted KV = B · α · γ · kv_dim · 2; with α = 1, γ = 1, kv_dim = 50: 100 B per sequence.
THREE = Profile(gpu_name=H100, gpu_cc="9.0", segment_upper_bytes=[1e5, 1e7, math.inf],
                segment_impls=["fused", "ballot+pack_cuda", "fused_scan"])


@pytest.mark.parametrize("batch, expected, segment", [
    (1, "fused", "[0 B, 100 KB)"),  # 100 B
    (999, "fused", "[0 B, 100 KB)"),  # 99.9 KB
    (1000, "ballot+pack_cuda", "[100 KB, 10 MB)"),  # exactly the bound: the upper bound is exclusive
    (99_999, "ballot+pack_cuda", "[100 KB, 10 MB)"),
    (100_000, "fused_scan", "[10 MB, ∞)"),
    (10_000_000, "fused_scan", "[10 MB, ∞)"),
])
def test_picks_the_segment_that_holds_the_bytes(batch, expected, segment):
    decision = dispatch.decide(batch, 1, 50, 2, 1.0, THREE)
    assert decision.kv_bytes == batch * 100
    assert decision.impl == expected
    assert f"accepted KV in {segment} -> {expected}" in decision.reason


def test_a_single_segment_is_one_implementation_everywhere():
    only = Profile(gpu_name=H100, segment_upper_bytes=[math.inf], segment_impls=["ballot+pack_scan"])
    assert {dispatch.decide(batch, 128, 4096, 2, 1.0, only).impl for batch in (1, 64, 65536)} == {"ballot+pack_scan"}


def _cannot(*names):
    return lambda name, *_: f"{name} says no" if name in names else None


def test_a_segment_that_cannot_take_the_shape_yields_to_the_next_segment(monkeypatch):
    monkeypatch.setattr(dispatch, "_shape_reason", _cannot("ballot+pack_cuda"))
    decision = dispatch.decide(1000, 1, 50, 2, 1.0, THREE)
    assert decision.impl == "fused_scan"  # the larger-size neighbour comes first
    assert "but ballot+pack_cuda cannot run it (ballot+pack_cuda says no)" in decision.reason


def test_then_to_the_previous_segment_then_fused(monkeypatch):
    monkeypatch.setattr(dispatch, "_shape_reason", _cannot("ballot+pack_cuda", "fused_scan"))
    assert dispatch.decide(1000, 1, 50, 2, 1.0, THREE).impl == "fused"
    other = Profile(gpu_name=H100, segment_upper_bytes=[1e5, math.inf], segment_impls=["ballot+pack_scan", "fused_scan"])
    monkeypatch.setattr(dispatch, "_shape_reason", _cannot("ballot+pack_scan", "fused_scan"))
    assert dispatch.decide(1, 1, 50, 2, 1.0, other).impl == "fused"  # in no segment, but takes any B


def test_when_nothing_takes_the_shape_the_next_segment_is_named_as_before(monkeypatch):
    """Like the τ rule always did: the API then refuses the shape with that implementation's reason."""
    monkeypatch.setattr(dispatch, "_shape_reason", lambda *_: "needs draft KV")
    assert dispatch.decide(1, 1, 50, 2, 1.0, THREE).impl == "ballot+pack_cuda"
    assert dispatch.decide(1, 1, 50, 2, 1.0, PROFILE).impl == "ballot+pack_torch"


def test_an_unavailable_segment_impl_falls_back_on_the_device(monkeypatch):
    import functools

    monkeypatch.setattr(dispatch, "_device_identity", functools.cache(lambda index: (H100, "9.0")))
    monkeypatch.setattr(dispatch, "_availability",
                        functools.cache(lambda name, device: "not built" if name == "fused_scan" else None))
    monkeypatch.setattr(dispatch, "profile_for_gpu", functools.cache(lambda name, cc="": (THREE, "three.toml")))
    decision = dispatch.choose("cuda:0", 100_000, 1, 50, 2, 1.0)
    assert decision.impl == "ballot+pack_cuda" and "fused_scan unavailable here (not built)" in decision.reason


@pytest.mark.parametrize("path", sorted(ROOT_PROFILES.glob("*.toml")), ids=lambda path: path.name)
def test_committed_profiles_decide_as_their_rule(path):
    """The committed profiles keep their file and their rule, read here from the raw TOML, not through
    Profile: a τ rule (bytes < tau_bytes -> small_impl, else large_impl) or a per-size rule (the first
    segment whose exclusive upper bound is above the bytes)."""
    tomllib = pytest.importorskip("tomllib")
    raw = tomllib.loads(path.read_text())
    profile = thresholds.read_profile(path)
    assert thresholds.dumps(profile) == path.read_text()  # the writer writes them unchanged
    for batch in (1, 4, 32, 256, 4096, 65536):
        for gamma, kv_dim, alpha in ((4, 64, 0.3), (8, 128, 0.9), (128, 1024, 0.6), (32, 4096, 0.9)):
            kv_bytes = batch * alpha * gamma * kv_dim * 2
            if "tau_bytes" in raw:
                expected = raw["small_impl"] if kv_bytes < raw["tau_bytes"] else raw["large_impl"]
            else:
                expected = next(impl for upper, impl in zip(raw["segment_upper_bytes"], raw["segment_impls"],
                                                            strict=True) if kv_bytes < upper)
            assert dispatch.decide(batch, gamma, kv_dim, 2, alpha, profile).impl == expected, (path.name, batch, gamma)


def test_tau_profile_segments_are_the_tau_rule():
    assert PROFILE.segments() == ((0.0, 4e6, "fused_single_block"), (4e6, math.inf, "ballot+pack_torch"))
    assert Profile(gpu_name=H100, tau_bytes=0.0, large_impl="x").segments() == ((0.0, math.inf, "x"),)


def test_fallback_order_is_nearest_segment_first():
    four = Profile(gpu_name=H100, segment_upper_bytes=[1.0, 2.0, 3.0, math.inf], segment_impls=["a", "b", "c", "d"])
    assert dispatch.fallback_order(four, 1) == ["c", "a", "d", "fused"]
    assert dispatch.fallback_order(PROFILE, 0) == ["ballot+pack_torch", "fused"]
