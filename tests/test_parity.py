"""Parity machinery on the CPU: a wrong implementation is caught, whatever way it is wrong.

torch_eager IS the reference, so running it through parity is only a smoke test of the machinery (it is
not parity evidence); the reference itself is checked against the workload's constructed oracle in
tests/ops/test_greedy_reference.py, and real implementations against the reference in tests/gpu/ and
under the Triton interpreter."""

import pytest
import torch

from sdbench import parity, registry
from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig, make_verify_workload
from sdbench.registry import BufferedRun, Implementation


def test_smoke_the_parity_machinery_runs_the_torch_entries_end_to_end():
    impls = [impl for impl in registry.implementations()
             if impl.backend == "torch" and impl.op not in parity.PROB_OPS  # own parity tests
             and impl.unavailable_reason("cpu") is None]
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
    assert interpreted.total_configs <= compiled.total_configs / 2
    assert max(interpreted.grid.vocab_sizes) <= 512  # the interpreter pays per vocabulary column
    grid = interpreted.grid
    assert 1 in grid.batch_sizes and 1 in grid.gammas and any(g % 32 for g in grid.gammas if g > 1)
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


def _never_writes_has_mismatch(w):
    """Writes everything but has_mismatch: at B=1 random poison used to pass half the time."""
    from sdbench.ops.verify.reference import verify

    out = {
        "accepted_lengths": torch.empty_like(w.accepted_lengths),
        "has_mismatch": torch.empty(w.config.batch_size, dtype=torch.bool),
        "next_tokens": torch.empty(w.config.batch_size, dtype=w.target_tokens.dtype),
    }

    def launch():
        want = verify(w.draft_tokens, w.target_tokens)
        out["accepted_lengths"].copy_(want["accepted_lengths"])
        out["next_tokens"].copy_(want["next_tokens"])

    return BufferedRun(launch, out)


def test_an_unwritten_bool_always_fails():
    lazy = Implementation(op="verify", name="lazy_bool", backend="torch", description="", devices=("cpu",),
                          prepare=_never_writes_has_mismatch)
    for seed in range(8):
        for alpha in (0.0, 1.0):
            workload = make_verify_workload(VerifyConfig(1, 4, alpha, seed=seed), "cpu")
            failure = parity.check(lazy, workload)
            assert failure is not None and failure.startswith("has_mismatch"), (seed, alpha, failure)


def _pack_ignoring_flags(w):
    from sdbench.ops.pack.reference import pack

    def run():
        out = pack(w.draft_kv, w.accepted_lengths)
        del out["error_flags"]
        return out

    return run


def test_error_flags_are_required_of_sdbench_kernels_and_optional_for_peers():
    workload = make_verify_workload(VerifyConfig(4, 4, 0.5, kv_dim=8, seed=1), "cpu")
    fields = dict(op="pack", backend="torch", description="", devices=("cpu",), prepare=_pack_ignoring_flags)
    assert parity.check(Implementation(name="kernel", **fields), workload) == "error_flags: missing from the outputs"
    assert parity.check(Implementation(name="peer", peer=True, **fields), workload) is None


def test_bad_lengths_are_part_of_parity():
    """A kernel that clamps but does not flag fails on bad lengths; the reference passes."""
    workload = make_verify_workload(VerifyConfig(3, 4, 0.5, kv_dim=8, seed=2), "cpu")
    workload.accepted_lengths.copy_(torch.tensor([1, 9, -2]))
    eager = registry.get("pack", "torch_eager")
    assert parity.check(eager, workload) is None

    def unflagged(w):
        from sdbench.ops.pack.reference import pack

        def run():
            out = pack(w.draft_kv, w.accepted_lengths)
            out["error_flags"] = torch.zeros_like(out["error_flags"])
            return out

        return run

    wrong = Implementation(op="pack", name="unflagged", backend="torch", description="", devices=("cpu",),
                           prepare=unflagged)
    assert parity.check(wrong, workload).startswith("error_flags")


def test_quick_grid_is_interpreter_sized_where_triton_is_interpreted(monkeypatch):
    """`TRITON_INTERPRET=1 sdbench parity --quick` on a CPU: every op's configs at interpreter sizes
    (measured: 15 s for all 96 greedy and 48 prob configs on a 2-core machine, every impl passing; the
    logits and ragged operations add 48 and 24 small configs; ragged verify-and-pack 24 more, 7 s for both
    of its implementations; ragged prob_verify 48 more, 17 s for its three)."""
    from sdbench.ops import backends

    monkeypatch.setattr(backends, "TRITON_INTERPRETED", True)
    grid = parity.quick_grid("cpu")
    assert grid is parity.INTERPRETER_QUICK_GRID
    counts = {op: parity.count_configs(op, grid) for op in registry.OPERATIONS}
    assert sum(counts.values()) <= 280, counts
    assert max(grid.vocab_sizes) <= 512 and max(grid.prob_batch_sizes) <= 8
    monkeypatch.setattr(backends, "TRITON_INTERPRETED", False)
    assert parity.quick_grid("cpu") is parity.QUICK_GRID
    assert parity.quick_grid("cuda") is parity.QUICK_GRID
