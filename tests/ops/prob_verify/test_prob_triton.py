"""The prob_verify Triton kernels on CPU tensors under TRITON_INTERPRET=1.

TRITON_INTERPRET must be set before triton is imported, so one subprocess (this file run as a
script) runs every case and prints a JSON verdict per case; each test below asserts one verdict.
Supplied randomness: tokens and lengths bit for bit, accept_probs within PROB_FLOAT_ATOL (the
parity contract). Fast randomness: determinism, agreement between fused and flashspec, the same
tokens from any fused plan (the Philox stream is a function of the column alone), a clean scratch
after every launch. The fused plan rule and the interpreter's fallback to Triton's own launcher are
checked in the same subprocess. Sizes stay small: the interpreter runs ~10-30 ms per program.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from interpreted import run_interpreted

from sdbench import registry
from sdbench.ops.workload import VerifyConfig

REPO = Path(__file__).resolve().parents[3]
TRITON_IMPLS = ("flashspec", "serial_sampler", "fused")
PARITY_CONFIGS = {
    "fp32_probs": VerifyConfig(3, 4, 0.6, vocab_size=50, seed=1),
    "bf16_logprobs_gamma1": VerifyConfig(2, 1, 0.3, vocab_size=37, prob_dtype="bfloat16", logprobs=True, seed=2),
    "multi_tile_int32_tokens": VerifyConfig(4, 3, 0.5, vocab_size=5000, token_dtype="int32", seed=3),
    "fp32_logprobs_tile_edge": VerifyConfig(3, 2, 0.5, vocab_size=2049, logprobs=True, seed=4),
    "all_accepted": VerifyConfig(3, 5, 1.0, vocab_size=100, seed=5),
    "early_rejections": VerifyConfig(3, 5, 0.0, vocab_size=100, seed=6),
}
FAST_CASES = ("fused_fast_advances_and_reproduces", "fused_fast_leaves_scratch_clean", "fused_fast_equals_flashspec_fast",
              "fast_offset_changes_tokens", "fused_fast_bf16_logprobs_is_well_formed",
              "fused_fast_tokens_do_not_depend_on_the_plan", "fused_plan_rule", "fused_launch_takes_tritons_path_when_interpreted")
DEGENERATE_CASES = tuple(f"degenerate_residual_{name}" for name in TRITON_IMPLS)
SPLIT_DEGENERATE_CASES = tuple(f"degenerate_residual_split_{name}" for name in TRITON_IMPLS)
BAD_INPUT_CASES = (tuple(f"bad_tokens_{name}_{dtype}" for name in TRITON_IMPLS for dtype in ("int64", "int32"))
                   + tuple(f"degenerate_rows_{name}" for name in TRITON_IMPLS)
                   + ("flashspec_fast_advances_and_reproduces", "bad_tokens_fast_are_flagged_and_in_range",
                      "degenerate_rows_fast_stay_in_range"))
CASES = (tuple(f"parity_{name}_{config}" for name in TRITON_IMPLS for config in PARITY_CONFIGS) + FAST_CASES
         + DEGENERATE_CASES + SPLIT_DEGENERATE_CASES + BAD_INPUT_CASES)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    return run_interpreted(script=Path(__file__), timeout=300)


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_under_interpreter(verdicts, case):
    assert case in verdicts, f"case {case} did not run"
    assert verdicts[case] is None, verdicts[case]


def test_triton_on_cpu_without_interpreter_says_why():
    """In a fresh process without TRITON_INTERPRET (the suite itself may run with it set, and the
    probe reads it once, at import)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    script = ("import json; from sdbench import registry; "
              f"print(json.dumps([registry.get('prob_verify', n).unavailable_reason('cpu') for n in {TRITON_IMPLS!r}]))")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for reason in json.loads(done.stdout.strip().splitlines()[-1]):
        assert reason and ("TRITON_INTERPRET" in reason or "not installed" in reason), reason


@pytest.mark.parametrize("name", ["flashinfer_chain", "flashinfer_chain+adapter"])
def test_flashinfer_chain_is_optional_with_a_reason(name):
    impl = registry.get("prob_verify", name)
    assert impl.unavailable_reason("cpu")
    if not torch.cuda.is_available():
        assert impl.unavailable_reason("cuda") == "needs a CUDA device"


def test_flashinfer_source_names_the_include_folder(monkeypatch, tmp_path):
    from sdbench.ops.prob_verify import flashinfer_impls

    monkeypatch.setattr(flashinfer_impls, "_package_reason", lambda: "flashinfer is not installed")
    monkeypatch.delenv(flashinfer_impls.INCLUDE_ENV, raising=False)
    assert flashinfer_impls.flashinfer_source().startswith("none: flashinfer is not installed")
    monkeypatch.setenv(flashinfer_impls.INCLUDE_ENV, str(tmp_path))
    assert "holds no flashinfer/sampling.cuh" in flashinfer_impls.flashinfer_source()
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "sampling.cuh").write_text("// header")
    assert flashinfer_impls.flashinfer_source() == f"JIT build of flashinfer/sampling.cuh from SDBENCH_FLASHINFER_INCLUDE={tmp_path}"


# --- the interpreter run -----------------------------------------------------------------------
def bad_token_workload(token_dtype: str):
    """V=37 (3 fused chunks of 16 under the interpreter, the last with padding), γ=3: sequence 0 has
    token 40 at position 1, sequence 1 has -3 at position 0, sequence 3 has 37 (= V) last; sequence 2
    is clean. The issue's case: the kernels used to read p and q at those ids."""
    from sdbench.ops.prob_verify.workload import make_prob_workload

    w = make_prob_workload(VerifyConfig(4, 3, 0.9, vocab_size=37, token_dtype=token_dtype, seed=21))
    tokens = w.draft_tokens.clone()
    tokens[0, 1], tokens[1, 0], tokens[3, 2] = 40, -3, 37
    return dataclasses.replace(w, draft_tokens=tokens)


def degenerate_rows_workload():
    """One sequence per degenerate row of the input contract (reference.prob_race), V=37, γ=1.
    Sequences 0-5 accept their draft (p = q = 1 at it) and race on a degenerate bonus row: all -0.5,
    all -0.0, all 0, all NaN, +inf at two columns, negative but one tiny positive entry. Sequences
    6-8 reject (p = 0 at the draft) and race on a row where p - q has no positive entry: p all 0,
    p negative, p NaN."""
    from sdbench.ops.prob_verify.workload import ProbWorkload

    vocab, batch = 37, 9
    p = torch.zeros(batch, 2, vocab)
    q = torch.zeros(batch, 1, vocab)
    tokens = torch.tensor([[5], [6], [7], [8], [9], [10], [11], [12], [13]])
    for b in range(6):
        p[b, 0, tokens[b, 0]] = 1.0
        q[b, 0, tokens[b, 0]] = 1.0
    p[0, 1], p[1, 1], p[3, 1] = -0.5, -0.0, float("nan")
    p[4, 1, [3, 30]] = float("inf")
    p[5, 1] = -1.0
    p[5, 1, 33] = 1e-30
    q[6:, 0] = 1.0 / vocab
    p[7, 0], p[8, 0] = -0.25, float("nan")
    gen = torch.Generator().manual_seed(5)
    uniforms = torch.rand((batch, 1), generator=gen)
    noise = torch.empty((batch, vocab)).exponential_(generator=gen).clamp_min_(torch.finfo(torch.float32).tiny)
    return ProbWorkload(config=VerifyConfig(batch, 1, vocab_size=vocab, seed=23), draft_tokens=tokens,
                        target_probs=p, draft_probs=q, uniforms=uniforms, exponential_noise=noise,
                        realised_acceptance=float("nan"))


def _run_cases() -> dict[str, str | None]:
    from sdbench import parity
    from sdbench.ops.prob_verify.workload import make_prob_workload, prob_workload_from_distributions

    verdicts: dict[str, str | None] = {}

    def record(case, check):
        try:
            verdicts[case] = check()
        except Exception as err:  # a crash is a failed case with its message
            verdicts[case] = f"raised {type(err).__name__}: {err}"

    for config_name, cfg in PARITY_CONFIGS.items():
        workload = make_prob_workload(cfg)
        for name in TRITON_IMPLS:
            impl = registry.get("prob_verify", name)
            record(f"parity_{name}_{config_name}", lambda impl=impl, workload=workload: parity.check(impl, workload))

    fused, flashspec = registry.get("prob_verify", "fused"), registry.get("prob_verify", "flashspec")
    fast = make_prob_workload(VerifyConfig(4, 3, 0.3, vocab_size=5000, seed=7)).with_randomness("fast", offset=3)

    def snapshot(run):
        return {key: value.clone() for key, value in run().items()}

    def advances_and_reproduces(impl):
        """Each call advances the device-side offset by one: call 2 of a run draws what a fresh run
        from offset + 1 draws, and differs from call 1; a fresh run from the same offset repeats call 1."""
        run = impl.prepare(fast)
        first, second = snapshot(run), snapshot(run)
        fresh = snapshot(impl.prepare(fast))
        next_offset = snapshot(impl.prepare(fast.with_randomness("fast", offset=fast.offset + 1)))
        if torch.equal(first["output_tokens"], second["output_tokens"]):
            return f"two consecutive calls drew the same tokens: {first['output_tokens'].tolist()}"
        if not all(torch.equal(first[k], fresh[k]) for k in first):
            return f"same seed and offset, different tokens: {first['output_tokens']} vs {fresh['output_tokens']}"
        if not all(torch.equal(second[k], next_offset[k]) for k in first):
            return f"call 2 {second['output_tokens'].tolist()} != offset+1 {next_offset['output_tokens'].tolist()}"
        return None

    def deterministic():
        return advances_and_reproduces(fused)

    def scratch_clean():
        from sdbench.ops.prob_verify import triton_kernels as prob_triton

        outputs = fused.prepare(fast).outputs
        best, arrivals = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)
        plan = prob_triton.fused_plan(4, 5000, target_programs=12)
        inputs = prob_triton.ProbTensors(fast.draft_tokens, fast.target_probs, fast.draft_probs, fast.uniforms,
                                         fast.exponential_noise, logprobs=False)
        prob_triton.launch_fused(inputs, outputs, best, arrivals, plan, fast=True, seed=fast.seed, offset=fast.offset)
        if plan.splits < 2:
            return f"plan {plan} does not split the sweep"
        return None if not best.any() and not arrivals.any() else f"scratch not reset: {best}, {arrivals}"

    def equals_flashspec():
        a, b = snapshot(fused.prepare(fast)), snapshot(flashspec.prepare(fast))
        same = all(torch.equal(a[k], b[k]) for k in a)
        return None if same else f"fused {a['output_tokens'].tolist()} != flashspec {b['output_tokens'].tolist()}"

    def offset_changes():
        a = snapshot(fused.prepare(fast))
        b = snapshot(fused.prepare(fast.with_randomness("fast", offset=4)))
        return None if not torch.equal(a["output_tokens"], b["output_tokens"]) else "offset 3 and 4 gave the same tokens"

    def well_formed():
        cfg = VerifyConfig(3, 4, 0.5, vocab_size=3000, prob_dtype="bfloat16", logprobs=True, seed=8)
        out = snapshot(fused.prepare(make_prob_workload(cfg).with_randomness("fast")))
        k = out["accepted_lengths"]
        ok = bool(((k >= 0) & (k <= 4)).all()) and bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 3000)).all())
        ok = ok and torch.equal(out["output_tokens"].gather(1, k[:, None]).squeeze(1), out["next_tokens"])
        return None if ok else f"malformed outputs {out}"

    def plan_independent():
        """Fast-mode tokens are a function of (seed, offset, sequence, column): any split agrees."""
        from sdbench.ops.prob_verify import triton_kernels as prob_triton

        small = make_prob_workload(VerifyConfig(3, 3, 0.3, vocab_size=300, seed=10)).with_randomness("fast", offset=1)
        inputs = prob_triton.ProbTensors(small.draft_tokens, small.target_probs, small.draft_probs, small.uniforms,
                                         small.exponential_noise, logprobs=False)
        seen = {}
        for chunk in (16, 64, 512):
            plan = prob_triton.FusedPlan(chunk=chunk, splits=-(-300 // chunk), num_warps=1)
            outputs = {key: value.clone() for key, value in fused.prepare(small).outputs.items()}
            best, arrivals = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int32)
            prob_triton.launch_fused(inputs, outputs, best, arrivals, plan, fast=True, seed=small.seed, offset=small.offset)
            seen[chunk] = outputs["output_tokens"]
        reference_tokens = snapshot(flashspec.prepare(small))["output_tokens"]
        same = all(torch.equal(tokens, reference_tokens) for tokens in seen.values())
        return None if same else f"tokens differ by chunk: {seen} (flashspec {reference_tokens})"

    def plan_rule():
        from sdbench.ops.prob_verify import triton_kernels as prob_triton

        failures = []
        for batch, vocab, target in ((1, 32000, 66), (1, 128256, 66), (8, 32000, 66), (32, 32000, 66), (128, 152064, 66),
                                     (100_000, 4500, 300_000), (4, 50, 16), (1, 7, 4)):
            plan = prob_triton.fused_plan(batch, vocab, target, chunk_min=256)
            chunk = plan.chunk
            ok = (chunk & (chunk - 1) == 0 and 256 <= chunk <= prob_triton.CHUNK_MAX
                  and plan.splits == -(-vocab // chunk) and (plan.splits - 1) * chunk < vocab <= plan.splits * chunk
                  and 1 <= plan.num_warps <= prob_triton.MAX_WARPS and plan.rows == chunk // 4
                  and plan.rows >= 32 * plan.num_warps  # every thread owns at least one 16-byte group
                  and (batch * plan.splits >= target or chunk == 256)  # enough programs, or the finest split
                  and (chunk == prob_triton.CHUNK_MAX or batch * -(-vocab // (2 * chunk)) < target))  # the largest such
            if not ok:
                failures.append((batch, vocab, target, plan))
        expected = {(1, 32000): (256, 2), (1, 128256): (1024, 4), (32, 32000): (2048, 4)}
        for (batch, vocab), (chunk, warps) in expected.items():
            plan = prob_triton.fused_plan(batch, vocab, 66, chunk_min=256)
            if (plan.chunk, plan.num_warps) != (chunk, warps):
                failures.append(("expected", batch, vocab, (chunk, warps), plan))
        return None if not failures else f"plan rule violated: {failures}"

    def interpreted_launch():
        from sdbench.ops.prob_verify import triton_kernels as prob_triton

        run = fused.prepare(fast)
        launch = run.launch
        if not isinstance(launch, prob_triton.BoundLaunch):
            return f"fused launches through {type(launch).__name__}, not BoundLaunch"
        run()
        if launch.direct_reason != "no CompiledKernel (interpreter)":
            return f"direct_reason {launch.direct_reason!r} under the interpreter"
        return None

    checks = (deterministic, scratch_clean, equals_flashspec, offset_changes, well_formed, plan_independent, plan_rule,
              interpreted_launch)
    for case, check in zip(FAST_CASES, checks, strict=True):
        record(case, check)

    record("flashspec_fast_advances_and_reproduces", lambda: advances_and_reproduces(flashspec))
    for name in TRITON_IMPLS:
        impl = registry.get("prob_verify", name)
        for dtype in ("int64", "int32"):
            bad = bad_token_workload(dtype)
            record(f"bad_tokens_{name}_{dtype}", lambda impl=impl, bad=bad: parity.check(impl, bad))
        record(f"degenerate_rows_{name}", lambda impl=impl: parity.check(impl, degenerate_rows_workload()))

    def bad_tokens_fast():
        for impl in (fused, flashspec):
            out = snapshot(impl.prepare(bad_token_workload("int64").with_randomness("fast")))
            want = torch.tensor([1, 1, 0, 1], dtype=torch.int32)
            if not torch.equal(out["error_flags"], want):
                return f"{impl.name}: error_flags {out['error_flags'].tolist()} != {want.tolist()}"
            if not bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 37)).all()):
                return f"{impl.name}: next token outside [0, 37): {out['next_tokens'].tolist()}"
        return None

    def degenerate_fast():
        for impl in (fused, flashspec):
            out = snapshot(impl.prepare(degenerate_rows_workload().with_randomness("fast")))
            if not bool(((out["next_tokens"] >= 0) & (out["next_tokens"] < 37)).all()):
                return f"{impl.name}: next token outside [0, 37): {out['next_tokens'].tolist()}"
        return None

    record("bad_tokens_fast_are_flagged_and_in_range", bad_tokens_fast)
    record("degenerate_rows_fast_stay_in_range", degenerate_fast)

    # A rejected row where p <= q everywhere (q unnormalised): no residual mass, the race falls back to p.
    p = torch.zeros(8, 2, 8)
    p[:, 0, 1:3] = 0.5
    p[:, 1, :] = 1 / 8
    q = torch.zeros(8, 1, 8)
    q[:, 0, :4] = torch.tensor([0.2, 0.5, 0.5, 0.2])
    degenerate = prob_workload_from_distributions(p, q, VerifyConfig(8, 1, vocab_size=8, seed=9))
    assert bool(((degenerate.draft_tokens == 0) | (degenerate.draft_tokens == 3)).any()), "no degenerate row drawn"
    for case, name in zip(DEGENERATE_CASES, TRITON_IMPLS, strict=True):
        record(case, lambda name=name: parity.check(registry.get("prob_verify", name), degenerate))

    # The same over V=40, p's mass in three different 16-column chunks: fused splits the row over 3
    # programs, and the last one reruns the race over the whole row.
    p = torch.zeros(16, 2, 40)
    p[:, 0, [1, 20, 35]] = torch.tensor([0.4, 0.3, 0.3])
    p[:, 1, :] = 1 / 40
    q = torch.zeros(16, 1, 40)
    q[:, 0, [0, 1, 20, 35]] = torch.tensor([0.3, 0.5, 0.5, 0.5])  # q >= p everywhere: w = 0 at every rejection
    split = prob_workload_from_distributions(p, q, VerifyConfig(16, 1, vocab_size=40, seed=11))
    assert bool((split.draft_tokens == 0).any()), "no rejected-by-construction row drawn"
    from sdbench.ops.prob_verify import triton_kernels as prob_triton

    assert prob_triton.default_fused_plan(16, 40, torch.device("cpu")).splits == 3
    for case, name in zip(SPLIT_DEGENERATE_CASES, TRITON_IMPLS, strict=True):
        record(case, lambda name=name: parity.check(registry.get("prob_verify", name), split))
    return verdicts


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest, which sets TRITON_INTERPRET=1"
    print(json.dumps(_run_cases()))
