"""Parity machinery on the CPU: the torch implementations pass, and a wrong one is caught."""

import pytest
import torch

from sdbench import parity, registry
from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig, make_verify_workload
from sdbench.registry import BufferedRun, Implementation


def test_torch_implementations_pass_quick_grid():
    impls = [impl for impl in registry.implementations()
             if impl.backend == "torch" and impl.op != "prob_verify" and impl.unavailable_reason("cpu") is None]
    grid = parity.ParityGrid(batch_sizes=(1, 5), gammas=(1, 33), alphas=(0.0, 0.5, 1.0), kv_dims=(8,),
                             token_dtypes=("int32",), kv_dtypes=("bfloat16",))
    tallies = parity.run_parity(impls, grid, "cpu")
    for key, tally in tallies.items():
        assert tally.failed == 0, (key, tally.first_failure)
        assert tally.passed > 0, key


def _off_by_one_verify(w):
    def launch():
        out["accepted_lengths"].copy_(torch.clamp(w.accepted_lengths - 1, min=0))
        out["has_mismatch"].copy_(w.accepted_lengths < w.config.gamma)
        out["next_tokens"].copy_(w.target_tokens.gather(1, w.accepted_lengths[:, None]).squeeze(1))

    out = {
        "accepted_lengths": torch.empty_like(w.accepted_lengths),
        "has_mismatch": torch.empty(w.config.batch_size, dtype=torch.bool),
        "next_tokens": torch.empty(w.config.batch_size, dtype=w.target_tokens.dtype),
    }
    return BufferedRun(launch, out)


def _lazy_verify(w):
    """Writes nothing: poisoning must expose it."""
    out = {
        "accepted_lengths": torch.empty_like(w.accepted_lengths),
        "has_mismatch": torch.empty(w.config.batch_size, dtype=torch.bool),
        "next_tokens": torch.empty(w.config.batch_size, dtype=w.target_tokens.dtype),
    }
    return BufferedRun(lambda: None, out)


def test_wrong_implementation_fails_with_a_diff():
    wrong = Implementation(op="verify", name="off_by_one", backend="torch", description="", devices=("cpu",),
                           prepare=_off_by_one_verify)
    workload = make_verify_workload(VerifyConfig(16, 8, 0.9, seed=3), "cpu")
    failure = parity.check(wrong, workload)
    assert failure is not None and failure.startswith("accepted_lengths")


def test_unwritten_outputs_fail_because_of_poison():
    lazy = Implementation(op="verify", name="lazy", backend="torch", description="", devices=("cpu",),
                          prepare=_lazy_verify)
    workload = make_verify_workload(VerifyConfig(16, 8, 0.5, seed=4), "cpu")
    assert parity.check(lazy, workload) is not None


def test_packed_kv_compared_bitwise_on_accepted_rows_only():
    workload = make_verify_workload(VerifyConfig(4, 8, 0.5, kv_dim=3, seed=5), "cpu")
    expected = parity.expected_outputs("pack", workload)
    total = expected["packed_kv"].shape[0]
    padded = torch.full((4 * 8, 3), parity.POISON_KV, dtype=torch.float16)
    padded[:total] = expected["packed_kv"]
    assert parity.compare(expected, {**expected, "packed_kv": padded}) is None
    if total:
        padded[total - 1, 0] = -padded[total - 1, 0] if padded[total - 1, 0] != 0 else 1.0
        assert "packed_kv" in parity.compare(expected, {**expected, "packed_kv": padded})


def test_oversized_kv_is_skipped_and_counted():
    impl = registry.get("pack", "torch_eager")
    grid = parity.ParityGrid(batch_sizes=(4096,), gammas=(1024,), alphas=(0.5,), kv_dims=(2048,),
                             dists=("binomial",), token_dtypes=("int64",), kv_dtypes=("float16",))
    tally = parity.run_parity([impl], grid, "cpu")[impl.key]
    assert tally.skipped == {"inputs over 512 MiB": 1}


def test_prob_grid_is_bounded_and_skips_oversized_inputs():
    configs = list(parity.configs_for("prob_verify", parity.ParityGrid()))
    assert {c.batch_size for c in configs} == {1, 8, 32, 128} and max(c.gamma for c in configs) == 16
    big = VerifyConfig(128, 16, vocab_size=152064)
    assert parity.input_bytes("prob_verify", big) > parity.MAX_INPUT_BYTES
    assert parity.input_bytes("prob_verify", VerifyConfig(1, 8, vocab_size=32000)) < parity.MAX_INPUT_BYTES


def test_quick_parity_under_the_interpreter_is_interpreter_sized(monkeypatch):
    """`TRITON_INTERPRET=1 sdbench parity --quick` ran 11 minutes on the full quick grid; the CPU interpreter
    gets a grid a 2-core machine checks in well under a minute (edges kept)."""
    from sdbench.ops import backends

    monkeypatch.setattr(backends, "TRITON_INTERPRETED", True)
    interpreted = parity.plan(quick=True, device="cpu")
    monkeypatch.setattr(backends, "TRITON_INTERPRETED", False)
    compiled = parity.plan(quick=True, device="cpu")
    assert interpreted.grid == parity.INTERPRETER_QUICK_GRID and compiled.grid == parity.QUICK_GRID
    assert interpreted.total_configs <= compiled.total_configs / 5
    assert max(interpreted.grid.vocab_sizes) <= 64  # the interpreter pays per vocabulary column
    grid = interpreted.grid
    assert 1 in grid.batch_sizes and 1 in grid.gammas and any(g % 32 for g in grid.gammas if g > 32)
    assert {0.0, 1.0} <= set(grid.alphas)


def test_parity_plan_validates_at_the_edge():
    with pytest.raises(SdbenchError, match="unknown implementation 'balot'.*ballot"):
        parity.plan(impl_names=["balot"], device="cpu")
    with pytest.raises(SdbenchError, match="not supported; use cuda or cpu"):
        parity.plan(device="mps")
    overridden = parity.plan(quick=True, device="cpu", batch_sizes=[7], gammas=None)
    assert overridden.grid.batch_sizes == (7,) and overridden.grid.gammas == parity.QUICK_GRID.gammas


def test_parity_prints_progress_lines_when_not_a_terminal():
    from typer.testing import CliRunner

    from sdbench.cli import app

    result = CliRunner().invoke(app, ["parity", "--quick", "--device", "cpu", "--op", "verify", "--impl", "torch_eager",
                                      "--b", "1,2", "--gamma", "1,4", "--alpha", "0.5"])
    assert result.exit_code == 0, result.output
    assert "parity: 8/8 configs" in result.output  # 2 batch sizes × 2 γ × 2 token dtypes
