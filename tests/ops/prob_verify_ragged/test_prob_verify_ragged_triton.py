"""prob_verify_ragged's Triton kernels on CPU tensors under TRITON_INTERPRET=1.

TRITON_INTERPRET must be set before triton is imported, so one subprocess (this file run as a script) runs
every case and prints a JSON verdict per case; each test below asserts one verdict (None = passed).
Supplied randomness: every implementation equals the per-request reference bit for bit (parity) over
γ_i = 0, mixed 1..γ_max, all γ_max, B = 1, γ_max not a power of two and past one scan step, a multi-chunk
vocabulary, bad token ids and degenerate rows; bad offsets read and write nothing outside the inputs (guard
rows that would win every race, a guard band after the outputs). Fast randomness: `fused` on full lengths
draws what the padded `fused` draws, advances its offset per call, leaves its scratch clean. The χ² test of
the fast mode (and its must-fail variant) runs in a second subprocess.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
OP = "prob_verify_ragged"
IMPLS = ("fused", "serial_sampler")
# (config, γ_i or None for the config's distribution)
PARITY_CASES = {
    "mixed_with_zeros": ({"batch_size": 6, "gamma": 5, "alpha": 0.6, "vocab_size": 50, "seed": 1}, [5, 0, 3, 1, 0, 4]),
    "every_request_without_drafts": ({"batch_size": 3, "gamma": 3, "alpha": 0.9, "vocab_size": 37, "seed": 2}, [0, 0, 0]),
    "all_gamma_max_bf16_logprobs": ({"batch_size": 4, "gamma": 4, "alpha": 0.7, "vocab_size": 40, "prob_dtype": "bfloat16",
                                     "logprobs": True, "draft_lengths": "full", "seed": 3}, None),
    "one_request": ({"batch_size": 1, "gamma": 3, "alpha": 0.5, "vocab_size": 64, "seed": 4}, None),
    "gamma_37_two_scan_steps_int32": ({"batch_size": 4, "gamma": 37, "alpha": 1.0, "vocab_size": 300,
                                       "token_dtype": "int32", "seed": 5}, [37, 0, 33, 5]),
    "bimodal_multi_chunk_vocab": ({"batch_size": 5, "gamma": 6, "alpha": 0.8, "vocab_size": 2049, "logprobs": True,
                                   "draft_lengths": "bimodal", "seed": 6}, None),
    "early_rejections": ({"batch_size": 5, "gamma": 5, "alpha": 0.0, "vocab_size": 100, "seed": 7}, None),
}
CONTRACT_CASES = ("bad_tokens_int64", "bad_tokens_int32", "degenerate_rows", "degenerate_residual_split")
CASES = (tuple(f"parity_{name}_{case}" for name in IMPLS for case in PARITY_CASES)
         + tuple(f"{case}_{name}" for name in IMPLS for case in CONTRACT_CASES)
         + tuple(f"bad_offsets_{name}" for name in IMPLS)
         + ("fused_fast_full_equals_padded_fused", "fused_fast_advances_and_reproduces", "fused_leaves_scratch_clean",
            "fused_fast_bad_tokens_flagged_and_in_range"))

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _run_script(path: Path, timeout: int) -> dict:
    return run_interpreted(script=path, timeout=timeout)


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    return _run_script(Path(__file__), timeout=600)


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_under_interpreter(verdicts, case):
    assert case in verdicts, f"case {case} did not run"
    assert verdicts[case] is None, verdicts[case]


CHI2 = """
import json, sys
sys.path.insert(0, {here!r})
sys.path.insert(0, {padded!r})
from test_prob_exactness import SIGNIFICANCE
from test_prob_verify_ragged import ragged_pvalues, ragged_rounds, unshifted
from sdbench import registry
impl = registry.get("prob_verify_ragged", "fused")
reason = impl.unavailable_reason("cpu")
report = {{"reason": reason}}
if reason is None:
    w, padded = ragged_rounds(3000, seed=3)
    w = w.with_randomness("fast", offset=1)
    report["pvalues"] = ragged_pvalues(impl.prepare(w)(), w, padded)
    report["unshifted"] = ragged_pvalues(impl.prepare(unshifted(w))(), w, padded)
print(json.dumps(report))
"""


@needs_triton
@pytest.mark.slow
def test_fused_fast_mode_is_exact_and_the_row_shift_check_can_fail(tmp_path):
    """fused with its in-kernel Philox, 3,000 requests drafting 0, 1, 2 in turn over one p, q (V = 16), χ²
    per draft length (test_prob_verify_ragged.ragged_pvalues); the same kernel on rows laid out without the
    one-row shift per request fails. The GPU runs 10^5 rounds (tests/gpu/test_prob_verify_ragged_gpu.py)."""
    from test_prob_exactness import SIGNIFICANCE

    script = tmp_path / "chi2.py"
    script.write_text(CHI2.format(here=str(HERE), padded=str(HERE.parent / "prob_verify")))
    report = _run_script(script, timeout=900)
    if report["reason"]:
        pytest.skip(report["reason"])
    assert min(report["pvalues"].values()) > SIGNIFICANCE, report["pvalues"]
    assert report["unshifted"]["g1_bonus_token"] < SIGNIFICANCE, report["unshifted"]


sys.path.insert(0, str(HERE.parent / "prob_verify"))  # test_prob_exactness (χ² helpers), test_prob_triton (workloads)


# --- the interpreter run -----------------------------------------------------------------------
def _workload(config: dict, lengths):
    from sdbench.ops.prob_verify_ragged.workload import make_ragged_prob_workload
    from sdbench.ops.workload import VerifyConfig

    return make_ragged_prob_workload(VerifyConfig(**config), "cpu", None if lengths is None else torch.tensor(lengths))


def _snapshot(run):
    return {key: value.clone() for key, value in run().items()}


def _contract_workload(case: str):
    """The padded tests' bad-input workloads as ragged ones (every request drafting γ), and this folder's."""
    from test_prob_triton import degenerate_rows_workload
    from test_prob_verify_ragged import bad_token_workload

    from sdbench.ops.prob_verify.workload import prob_workload_from_distributions
    from sdbench.ops.prob_verify_ragged.workload import cut_to_lengths
    from sdbench.ops.workload import VerifyConfig

    if case.startswith("bad_tokens"):
        return bad_token_workload(case.rsplit("_", 1)[1])
    if case == "degenerate_rows":
        padded = degenerate_rows_workload()
        return cut_to_lengths(padded, torch.ones(padded.draft_tokens.shape[0], dtype=torch.int64))
    # w = 0 on every rejected row, p's mass in three 16-column chunks: the last program reruns the race over p
    p = torch.zeros(16, 2, 40)
    p[:, 0, [1, 20, 35]] = torch.tensor([0.4, 0.3, 0.3])
    p[:, 1, :] = 1 / 40
    q = torch.zeros(16, 1, 40)
    q[:, 0, [0, 1, 20, 35]] = torch.tensor([0.3, 0.5, 0.5, 0.5])
    padded = prob_workload_from_distributions(p, q, VerifyConfig(16, 1, vocab_size=40, seed=11))
    assert bool((padded.draft_tokens == 0).any()), "no rejected-by-construction row drawn"
    return cut_to_lengths(padded, torch.arange(16) % 2)


def _bad_offsets(name: str) -> str | None:
    """Decreasing, huge and negative offsets: each request's range is clamped (start = clamp(cu[i-1], 0, T),
    end = clamp(cu[i], start, T)); its k, next token (and flag) are the reference's on that range. p and q
    sit in buffers whose rows past the inputs would win every race; output_tokens sits in a guard band."""
    from sdbench.ops.prob_verify import triton_kernels as prob_triton
    from sdbench.ops.prob_verify_ragged import triton_kernels as kernels
    from sdbench.ops.prob_verify_ragged.reference import verify_request

    w = _workload({"batch_size": 5, "gamma": 5, "alpha": 0.7, "vocab_size": 40, "seed": 9}, [3, 5, 0, 2, 4])
    total, batch, vocab = 14, 5, 40
    bad = [5, 2, total + 1000, -7, 1 << 40]
    guard_p = torch.full((total + batch + 4, vocab), 1e30)
    guard_p[: total + batch] = w.target_probs
    guard_q = torch.full((total + 4, vocab), -1e30)  # q past the inputs would make w huge
    guard_q[:total] = w.draft_probs
    band = torch.full((total + batch + 16,), -555, dtype=torch.int64)
    cu = torch.tensor(bad)
    outputs = {"accepted_lengths": torch.empty(batch, dtype=torch.int64), "next_tokens": torch.empty(batch, dtype=torch.int64),
               "output_tokens": band[: total + batch], "error_flags": torch.empty(batch, dtype=torch.int32)}
    inputs = kernels.RaggedProbTensors(w.draft_tokens, guard_p[: total + batch], guard_q[:total], cu, w.uniforms,
                                       w.exponential_noise, logprobs=False, gamma_max=5)
    if name == "fused":
        best, arrivals = torch.zeros(batch, dtype=torch.int64), torch.zeros(batch, dtype=torch.int32)
        plan = prob_triton.fused_plan(batch, vocab, target_programs=3 * batch)
        kernels.fused_ragged_launcher(inputs, outputs, best, arrivals, plan, False, 0, torch.zeros(batch, dtype=torch.int64))()
    else:
        del outputs["error_flags"]
        kernels.serial_ragged_launcher(inputs, outputs, torch.empty(total + batch, dtype=torch.int64))()
    ends = [min(max(bad[0], 0), total)]
    starts = [0]
    for request in range(1, batch):
        starts.append(min(max(bad[request - 1], 0), total))
        ends.append(min(max(bad[request], starts[-1]), total))
    for request, (start, end) in enumerate(zip(starts, ends, strict=True)):
        want = verify_request(w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise, request,
                              start, end)
        for key in ("accepted_lengths", "next_tokens", "error_flags"):
            if key in outputs and int(outputs[key][request]) != int(want[key][0]):
                return f"request {request} [{start}, {end}): {key} {int(outputs[key][request])} != {int(want[key][0])}"
    if bool((band[total + batch:] != -555).any()):
        return f"written past output_tokens: {band[total + batch:].tolist()}"
    return None


def _run_cases() -> dict[str, str | None]:
    from sdbench import parity, registry
    from sdbench.ops.prob_verify import triton_kernels as prob_triton
    from sdbench.ops.prob_verify.workload import make_prob_workload
    from sdbench.ops.prob_verify_ragged import triton_kernels as kernels
    from sdbench.ops.prob_verify_ragged.workload import cut_to_lengths
    from sdbench.ops.workload import VerifyConfig

    verdicts: dict[str, str | None] = {}

    def record(case, check):
        try:
            verdicts[case] = check()
        except Exception as err:  # a crash is a failed case with its message
            verdicts[case] = f"raised {type(err).__name__}: {err}"

    for case, (config, lengths) in PARITY_CASES.items():
        w = _workload(config, lengths)
        for name in IMPLS:
            record(f"parity_{name}_{case}", lambda name=name, w=w: parity.check(registry.get(OP, name), w))
    for case in CONTRACT_CASES:
        w = _contract_workload(case)
        for name in IMPLS:
            record(f"{case}_{name}", lambda name=name, w=w: parity.check(registry.get(OP, name), w))
    for name in IMPLS:
        record(f"bad_offsets_{name}", lambda name=name: _bad_offsets(name))

    fused = registry.get(OP, "fused")
    padded = make_prob_workload(VerifyConfig(4, 3, 0.4, vocab_size=500, seed=12)).with_randomness("fast", offset=3)
    full = cut_to_lengths(padded, torch.full((4,), 3))

    def equals_padded():
        mine = _snapshot(fused.prepare(full))
        theirs = _snapshot(registry.get("prob_verify", "fused").prepare(padded))
        for key in ("accepted_lengths", "next_tokens", "error_flags"):
            if not torch.equal(mine[key], theirs[key]):
                return f"{key}: ragged {mine[key].tolist()} != padded {theirs[key].tolist()}"
        same = torch.equal(mine["output_tokens"], theirs["output_tokens"].flatten())
        return None if same else f"output_tokens {mine['output_tokens'].tolist()} != {theirs['output_tokens'].tolist()}"

    def advances_and_reproduces():
        w = _workload({"batch_size": 6, "gamma": 5, "alpha": 0.4, "vocab_size": 500, "seed": 13},
                      [5, 0, 3, 1, 0, 4]).with_randomness("fast", offset=3)
        run = fused.prepare(w)
        first, second = _snapshot(run), _snapshot(run)
        fresh = _snapshot(fused.prepare(w))
        following = _snapshot(fused.prepare(w.with_randomness("fast", offset=4)))
        if run.philox_offsets.tolist() != [5] * 6:
            return f"offsets after two calls: {run.philox_offsets.tolist()}"
        if torch.equal(first["output_tokens"], second["output_tokens"]):
            return "two consecutive calls drew the same tokens"
        if not all(torch.equal(first[k], fresh[k]) for k in first):
            return "same seed and offset, different tokens"
        if not all(torch.equal(second[k], following[k]) for k in first):
            return "call 2 differs from a fresh run at offset + 1"
        return None

    def scratch_clean():
        w = _workload({"batch_size": 4, "gamma": 4, "alpha": 0.5, "vocab_size": 300, "seed": 14}, [4, 0, 2, 3])
        best, arrivals = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)
        plan = prob_triton.fused_plan(4, 300, target_programs=16)
        from sdbench.ops.prob_verify_ragged.workload import ragged_prob_outputs

        outputs = ragged_prob_outputs(w)
        inputs = kernels.RaggedProbTensors(w.draft_tokens, w.target_probs, w.draft_probs, w.cu_num_draft_tokens,
                                           w.uniforms, w.exponential_noise, logprobs=False, gamma_max=4)
        kernels.fused_ragged_launcher(inputs, outputs, best, arrivals, plan, True, 0, torch.zeros(4, dtype=torch.int64))()
        if plan.splits < 2:
            return f"plan {plan} does not split the sweep"
        return None if not best.any() and not arrivals.any() else f"scratch not reset: {best}, {arrivals}"

    def bad_tokens_fast():
        from test_prob_verify_ragged import bad_token_workload

        w = bad_token_workload().with_randomness("fast")
        out = _snapshot(fused.prepare(w))
        if out["error_flags"].tolist() != [1, 0, 1, 0]:
            return f"error_flags {out['error_flags'].tolist()}"
        ok = bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 37)).all())
        ok = ok and bool((out["accepted_lengths"] <= w.draft_lengths).all())
        return None if ok else f"malformed outputs {out}"

    for case, check in (("fused_fast_full_equals_padded_fused", equals_padded),
                        ("fused_fast_advances_and_reproduces", advances_and_reproduces),
                        ("fused_leaves_scratch_clean", scratch_clean),
                        ("fused_fast_bad_tokens_flagged_and_in_range", bad_tokens_fast)):
        record(case, check)
    return verdicts


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest, which sets TRITON_INTERPRET=1"
    sys.path.insert(0, str(HERE))
    print(json.dumps(_run_cases()))
