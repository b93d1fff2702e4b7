"""The from-logits Triton kernels on CPU tensors under TRITON_INTERPRET=1 (one subprocess, a JSON verdict
per case, as tests/ops/prob_verify/test_prob_triton.py does).

Supplied randomness: tokens and lengths of `fused_logits`, `vllm_v2_style` and `softmax_fused_prob`
equal the float32 reference (the sizes here are far from near-ties). Fast randomness: determinism,
fused_logits drawing by the race and vllm_v2_style agree (the same Philox streams, keyed by column), by
inversion they accept alike, the race scratch is left zeroed, the stats split plan covers the row. Sizes stay tiny: the interpreter runs ~10-30 ms per
program.

Block verification (rule="block"): `fused_logits` equals the float32 reference, error_flags included,
over γ ∈ {1, 4, 5, 16} × B ∈ {1, 3, 8}, mixed temperatures with greedy rows (and greedy drafts under
sampled targets), bf16 and fp32, out-of-range draft tokens; in fast mode each call draws one Philox offset on (device-side counters), leaves
its scratch zeroed, and any split of either stream gives the same tokens. The peers refuse the rule
with a reason. Its χ² exactness: test_logits_exactness.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import sys
from pathlib import Path

import pytest
from interpreted import run_interpreted

from sdbench import registry
from sdbench.ops.prob_verify_logits.workload import LogitsConfig

REPO = Path(__file__).resolve().parents[3]
KERNEL_IMPLS = ("fused_logits", "vllm_v2_style", "softmax_fused_prob")
PARITY_CONFIGS = {
    "fp32_mixed": LogitsConfig(5, 3, vocab_size=300, seed=1),
    "bf16_mixed_gamma1": LogitsConfig(4, 1, vocab_size=131, logits_dtype="bfloat16", seed=2),
    "all_greedy_int32": LogitsConfig(3, 4, vocab_size=200, temperatures=(0.0,), draft_noise=0.1, token_dtype="int32",
                                     seed=3),
    "all_sampled_bonus": LogitsConfig(3, 3, vocab_size=97, temperatures=(0.8, 1.7), draft_noise=0.0, seed=4),
    "early_rejections": LogitsConfig(4, 4, vocab_size=250, draft_noise=3.0, seed=5),
}
FAST_CASES = ("fused_logits_fast_advances_its_offset", "vllm_v2_style_fast_advances_its_offset",
              "fused_logits_fast_equals_vllm_v2_style_fast",
              "fused_logits_leaves_scratch_clean", "stats_plan_covers_the_row", "fused_logits_any_split_agrees",
              "row_stats_match_float64", "fused_logits_one_launch_agrees", "greedy_requests_need_no_draft_rows",
              "reading_programs_launch_first", "early_launches_sequence_by_sequence")
# rule="block" in fused_logits; "greedy_drafts" zeroes the draft temperature of every other request and
# "bad_tokens" writes draft ids outside [0, V) (both edits in _block_workload).
BLOCK_PARITY_CONFIGS = {
    "g1_b8_fp32_mixed": LogitsConfig(8, 1, vocab_size=61, seed=11),
    "g1_b3_bf16_greedy_drafts": LogitsConfig(3, 1, vocab_size=45, logits_dtype="bfloat16", seed=12),
    "g4_b8_bf16_mixed": LogitsConfig(8, 4, vocab_size=97, logits_dtype="bfloat16", seed=13),
    "g4_b3_fp32_early_rejections": LogitsConfig(3, 4, vocab_size=150, draft_noise=3.0, seed=14),
    "g4_b3_fp32_bonus": LogitsConfig(3, 4, vocab_size=70, temperatures=(0.8, 1.7), draft_noise=0.0, seed=15),
    "g5_b3_fp32_bad_tokens": LogitsConfig(3, 5, vocab_size=80, seed=16),
    "g5_b1_bf16_greedy": LogitsConfig(1, 5, vocab_size=200, logits_dtype="bfloat16", seed=17),
    "g5_b8_fp32_greedy_drafts_int32": LogitsConfig(8, 5, vocab_size=64, draft_noise=0.3, token_dtype="int32", seed=18),
    "g16_b3_bf16_mixed": LogitsConfig(3, 16, vocab_size=37, logits_dtype="bfloat16", draft_noise=0.3, seed=19),
    "g16_b1_fp32_sampled": LogitsConfig(1, 16, vocab_size=50, temperatures=(0.9,), draft_noise=0.2, seed=20),
}
BLOCK_FAST_CASES = ("block_fast_advances_its_offset", "block_leaves_scratch_clean", "block_any_split_agrees")
CASES = (tuple(f"parity_{name}_{config}" for name in KERNEL_IMPLS for config in PARITY_CONFIGS) + FAST_CASES
         + tuple(f"parity_block_{config}" for config in BLOCK_PARITY_CONFIGS)
         + ("parity_block_hand_checked",) + BLOCK_FAST_CASES)

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    # (a hang guard, not a time bar: ~6 min alone on 2 cores, more beside other tests; a race that waited on a count
    # never filled would spin until it)
    return run_interpreted(script=Path(__file__), timeout=900)


@needs_triton
@pytest.mark.parametrize("case", CASES)
def test_logits_kernel_under_interpreter(verdicts, case):
    assert case in verdicts, f"case {case} did not run"
    assert verdicts[case] is None, verdicts[case]


@pytest.mark.parametrize("name", ("vllm_v2_style", "softmax_fused_prob", "softmax_flashinfer"))
def test_peers_refuse_block_verification_with_a_reason(name):
    reason = registry.get("prob_verify_logits", name).supports(LogitsConfig(2, 2, rule="block"))
    assert reason and "fused_logits" in reason
    assert registry.get("prob_verify_logits", name).supports(LogitsConfig(2, 2)) is None


@pytest.mark.parametrize("name", ("fused_logits", "torch_eager"))
def test_fused_logits_and_eager_run_both_rules(name):
    for rule in ("token", "block"):
        assert registry.get("prob_verify_logits", name).supports(LogitsConfig(2, 2, rule=rule)) is None


def test_softmax_flashinfer_is_optional_with_a_reason():
    assert registry.get("prob_verify_logits", "softmax_flashinfer").unavailable_reason("cpu")


# --- the interpreter run -----------------------------------------------------------------------
def _run_cases() -> dict[str, str | None]:
    import torch

    from sdbench.ops.input_contract import TOKEN_OUT_OF_RANGE
    from sdbench.ops.prob_verify_logits import reference
    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.checks import check
    from sdbench.ops.prob_verify_logits.common import allocate_outputs
    from sdbench.ops.prob_verify_logits.workload import make_logits_workload

    verdicts: dict[str, str | None] = {}

    def record(case, run):
        try:
            verdicts[case] = run()
        except Exception as err:  # a crash is a failed case with its message
            verdicts[case] = f"raised {type(err).__name__}: {err}"

    for config_name, cfg in PARITY_CONFIGS.items():
        workload = make_logits_workload(cfg)
        for name in KERNEL_IMPLS:
            impl = registry.get("prob_verify_logits", name)
            record(f"parity_{name}_{config_name}", lambda impl=impl, workload=workload: check(impl, workload))

    fused, vllm = registry.get("prob_verify_logits", "fused_logits"), registry.get("prob_verify_logits", "vllm_v2_style")
    fast = make_logits_workload(LogitsConfig(4, 3, vocab_size=300, seed=7)).with_randomness("fast", offset=3)

    def snapshot(run):
        return {key: value.clone() for key, value in run().items()}

    def deterministic():
        return fast_mode_advances(fused, fast, snapshot)

    def equals_vllm():
        """Drawing the residual by the race, fused_logits makes vllm_v2_style's draws, bit for bit; by
        inversion (the default), the same accept tests: the same lengths and accepted drafts."""
        inputs = kernels.LogitsTensors(fast.draft_tokens, fast.target_logits, fast.draft_logits,
                                       fast.target_temperature, fast.draft_temperature, fast.uniforms,
                                       fast.exponential_noise)
        race = allocate_outputs(fast)
        kernels.fused_logits_launcher(inputs, race, fast=True, seed=fast.seed, offset=fast.offset, sample="race")()
        a, b = snapshot(fused.prepare(fast)), snapshot(vllm.prepare(fast))
        if not all(torch.equal(race[k], b[k]) for k in b):  # the peer writes no error_flags
            return f"fused_logits (race) {race['output_tokens'].tolist()} != vllm {b['output_tokens'].tolist()}"
        k = b["accepted_lengths"]
        accepted = torch.arange(fast.draft_tokens.shape[1] + 1)[None, :] < k[:, None]
        if not (torch.equal(a["accepted_lengths"], k)
                and torch.equal(a["output_tokens"][accepted], b["output_tokens"][accepted])):
            return f"fused_logits (cdf) {a['output_tokens'].tolist()} accepts unlike vllm {b['output_tokens'].tolist()}"
        return None

    def scratch_clean():
        inputs = kernels.LogitsTensors(fast.draft_tokens, fast.target_logits, fast.draft_logits,
                                       fast.target_temperature, fast.draft_temperature, fast.uniforms,
                                       fast.exponential_noise)
        peer = snapshot(vllm.prepare(fast))  # the first call's draws
        for scan, sample in ((scan, sample) for scan in ("race", "early", "pass1", "kernel")
                            for sample in ("race", "cdf", "picks")):
            # fast mode: a scan in pass 1 or in its own kernel draws the race's accept uniforms
            outputs = allocate_outputs(fast)
            launch = kernels.fused_logits_launcher(inputs, outputs, fast=True, seed=fast.seed, offset=fast.offset,
                                                   scan=scan, sample=sample)
            launch()
            if sample == "race" and not torch.equal(outputs["output_tokens"], peer["output_tokens"]):
                return f"scan {scan}: {outputs['output_tokens'].tolist()} != vllm's {peer['output_tokens'].tolist()}"
            # every way of drawing the residual accepts alike (the same accept uniforms)
            k = peer["accepted_lengths"]
            accepted = torch.arange(fast.draft_tokens.shape[1] + 1)[None, :] < k[:, None]
            if not (torch.equal(outputs["accepted_lengths"], k)
                    and torch.equal(outputs["output_tokens"][accepted], peer["output_tokens"][accepted])):
                return f"scan {scan}, {sample}: {outputs['output_tokens'].tolist()} accepts unlike vllm"
            # the drawn token (position k) is one the rule can draw: where the residual p - q (p at the bonus
            # row) is positive, the argmax for a greedy target
            rows = torch.arange(k.numel())
            drawn = outputs["output_tokens"][rows, k]
            p = reference.temperature_probs(fast.target_logits, fast.target_temperature, torch.float64)[rows, k]
            q = reference.temperature_probs(fast.draft_logits, fast.draft_temperature, torch.float64)
            q = torch.where((k < fast.draft_tokens.shape[1])[:, None], q[rows, k.clamp(max=q.shape[1] - 1)], 0.0)
            in_vocab = (drawn >= 0) & (drawn < p.shape[1])
            if not (bool(in_vocab.all()) and bool(((p - q)[rows, drawn.clamp(0, p.shape[1] - 1)] > 0).all())):
                return f"scan {scan}, {sample}: drawn {drawn.tolist()} where the residual is not positive"
            launch()
            if any(counter.any() for counter in launch.scratch):
                return f"scan {scan}: scratch not reset: {launch.scratch}"
        return None

    def plan_covers():
        failures = []
        for rows, vocab, target, min_tiles in ((9, 32000, 528, 1), (33, 151936, 528, 1), (16896, 151936, 528, 1),
                                               (3, 7, 100, 1), (1, 64, 1, 1), (33, 128256, 2112, 4),
                                               (9, 32000, 2112, 4), (544, 128256, 2112, 4), (2, 4096, 1, 4)):
            plan = kernels.stats_plan(rows, vocab, target, tile=2048, min_tiles=min_tiles)
            tiles = -(-vocab // 2048)
            wanted = max(1, min(tiles, -(-target // rows)))
            def lean(span_tiles, tiles=tiles):  # few partials, little padding (below a wave)
                splits = -(-tiles // span_tiles)
                return splits <= kernels.STATS_SPLITS_BELOW_WAVE and 4 * (1 << (splits - 1).bit_length()) <= 5 * splits

            span_tiles = plan.span // 2048
            ok = (plan.span % 2048 == 0 and (plan.splits - 1) * plan.span < vocab <= plan.splits * plan.span
                  and (plan.span == 2048 or (lean(span_tiles) and not lean(span_tiles - 1))
                       if rows * tiles <= target
                       else plan.splits <= wanted and plan.span >= 2048 * min(min_tiles, tiles)))
            if not ok:
                failures.append((rows, vocab, target, min_tiles, plan))
        return None if not failures else f"stats plan violated: {failures}"

    def any_split():
        """Pass 1's split of each row, where the accept scan runs (pass 1, its own kernel or every race program),
        who combines a row's partials (pass 1, the scan kernel or every race program) and, where the race scans,
        the order of its loads (tokens_first) change the partials, never the outputs (supplied randomness); every
        scan equals the reference and flags the bad id. Where the race or the scan kernel scans, both ways of
        reading the rows' stats (lean_scan: only the rows it reads, each combined alone; or all 2γ+1, then picks)
        give the same outputs; γ = 5 pads its positions to 8 and reads its bonus row apart. Draft logits equal to the
        target's (noise 0, at γ = 5) accept every draft of a sampled request, so k = γ (the bonus row) is reached, and the
        bad id stops its sequence at k = 1; the default noise (γ = 2) rejects at k = 0. Every stats buffer starts
        poisoned, so a reader that took the padding after a row's partials (never written) as one would differ."""
        failures = []
        stops = set()
        for gamma, noise in ((2, 0.5), (5, 0.0)):
            w = make_logits_workload(LogitsConfig(3, gamma, vocab_size=300, draft_noise=noise, seed=9))
            w.draft_tokens[1, 1] = 300  # a bad id: its flag comes from whichever kernel scans
            inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                           w.draft_temperature, w.uniforms, w.exponential_noise)
            want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits,
                                                w.target_temperature, w.draft_temperature, w.uniforms,
                                                w.exponential_noise)
            stops.update((gamma, k) for k in want["accepted_lengths"].tolist())
            # every span and order at the first workload; the second (γ = 5, k = γ) one span, both paths
            first = (gamma, noise) == (2, 0.5)
            for span, (scan, combine, tokens_first, lean) in itertools.product((64, 128, 320) if first else (64,), (
                    ("race", True, False, True), ("race", True, True, True), ("pass1", True, None, True),
                    ("race", False, False, True), ("race", False, True, True), ("kernel", None, None, True),
                    ("race", False, True, False), ("race", True, False, False), ("kernel", None, None, False),
                    ("early", None, True, True), ("early", None, False, True))):
                if not first and (scan, combine, tokens_first) in (("race", True, True), ("race", False, False),
                                                                   ("pass1", True, None), ("early", None, False)):
                    continue
                if not lean and span != 64:  # (the old path at one span: the interpreter's time is the budget)
                    continue
                outputs = allocate_outputs(w)
                plan = kernels.StatsPlan(span=span, splits=-(-300 // span))
                with _poisoned_stats(kernels):
                    kernels.fused_logits_launcher(inputs, outputs, fast=False, stats_plan_=plan, scan=scan,
                                                  combine=combine, tokens_first=tokens_first, lean_scan=lean)()
                if not (torch.equal(outputs["output_tokens"], want["output_tokens"])
                        and torch.equal(outputs["accepted_lengths"], want["accepted_lengths"])
                        and outputs["error_flags"].tolist() == [0, TOKEN_OUT_OF_RANGE, 0]):
                    failures.append(f"γ {gamma} noise {noise} span {span} scan {scan} combine {combine} tokens "
                                    f"first {tokens_first} lean {lean}: {outputs['output_tokens'].tolist()} "
                                    f"flags {outputs['error_flags'].tolist()} != {want['output_tokens'].tolist()}")
        if not {(2, 0), (5, 1), (5, 5)} <= stops:  # the workloads reach k = 0, a middle k and γ
            failures.append(f"the workloads stop at {sorted(stops)}: not every k the case needs")
        return "; ".join(failures) or None

    def vllm_advances():
        return fast_mode_advances(vllm, fast, snapshot)

    def one_launch():
        """single=True (pass 1 and the race in one grid, in the order `lag` sets) against the reference
        (supplied randomness: tokens, lengths, the bad id's flag) at every lag from 1 to B and three pass-1
        spans, greedy and sampled rows mixed; in fast mode, the race draws vllm_v2_style's tokens and the
        inversion the two-launch design's (the same chunking), two calls leave the scratch zeroed and advance
        the offsets by two. The interpreter runs programs one after another in index order, so this checks the
        grid's mapping (a pass-1 row counted for another sequence would read partials never written and differ; a
        race placed before its pass 1 would wait forever, and the run's timeout fails it), not the waiting: the
        GPU tests do (tests/gpu/test_prob_logits_gpu.py)."""
        w = make_logits_workload(LogitsConfig(5, 3, vocab_size=300, seed=23))
        w.draft_tokens[3, 0] = -2
        want = reference.prob_verify_logits(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                            w.draft_temperature, w.uniforms, w.exponential_noise)
        inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                       w.draft_temperature, w.uniforms, w.exponential_noise)
        failures = []
        for span in (64, 128, 320):  # (5, 3 and 1 splits: the partials' stride pads 5 and 3, poisoned)
            for lag in range(1, 6):
                outputs = allocate_outputs(w)
                with _poisoned_stats(kernels):
                    kernels.fused_logits_launcher(inputs, outputs, fast=False, single=True, lag=lag,
                                                  stats_plan_=kernels.StatsPlan(span=span, splits=-(-300 // span)))()
                if not (torch.equal(outputs["output_tokens"], want["output_tokens"])
                        and torch.equal(outputs["accepted_lengths"], want["accepted_lengths"])
                        and outputs["error_flags"].tolist() == [0, 0, 0, TOKEN_OUT_OF_RANGE, 0]):
                    failures.append(f"span {span} lag {lag}: {outputs['output_tokens'].tolist()} flags "
                                    f"{outputs['error_flags'].tolist()} != {want['output_tokens'].tolist()}")
        fast_inputs = kernels.LogitsTensors(fast.draft_tokens, fast.target_logits, fast.draft_logits,
                                            fast.target_temperature, fast.draft_temperature, fast.uniforms,
                                            fast.exponential_noise)
        with _poisoned_stats(kernels):  # (the peer's pass 1 plans 5 splits here: its partials' stride pads them to 8)
            peer = snapshot(vllm.prepare(fast))
        two = allocate_outputs(fast)
        kernels.fused_logits_launcher(fast_inputs, two, fast=True, seed=fast.seed, offset=fast.offset, sample="cdf")()
        for sample, expected in (("race", peer), ("cdf", two)):
            outputs = allocate_outputs(fast)
            launch = kernels.fused_logits_launcher(fast_inputs, outputs, fast=True, seed=fast.seed, offset=fast.offset,
                                                   single=True, sample=sample)
            launch()
            if not torch.equal(outputs["output_tokens"], expected["output_tokens"]):
                failures.append(f"fast {sample}: {outputs['output_tokens'].tolist()} != "
                                f"{expected['output_tokens'].tolist()}")
            launch()
            if any(counter.any() for counter in launch.scratch):
                failures.append(f"fast {sample}: scratch not reset: {launch.scratch}")
            if launch.philox_offsets.tolist() != [fast.offset + 2] * fast.draft_tokens.shape[0]:
                failures.append(f"fast {sample}: offsets {launch.philox_offsets.tolist()} after two calls")
        return "; ".join(failures) or None

    def greedy_drafts_unread():
        """The token rule never needs a greedy target's draft rows. Three temperature pairings of one batch: the
        draft's as the target's (the workloads'), and rolled by one and two requests, so that greedy targets meet
        sampled drafts and sampled targets meet greedy drafts (whose drafts are then set to the draft's argmax, as
        a greedy draft proposes). With NaN over every greedy target's draft rows, fused_logits (every scan
        placement, combined or not, and the one launch) and vllm_v2_style give the reference's outputs, and the
        reference gives the same on the clean rows (q := 0 there). The workload is sensitive: some greedy target
        accepts a draft (an accept test that read the skipped rows' q would reject it) and some sampled target
        rejects its greedy draft's argmax (a skip keyed on the draft's temperature would accept it). Must-fail: NaN
        over a sampled target's draft row 0 changes fused_logits' outputs."""
        failures = []
        base = make_logits_workload(LogitsConfig(5, 3, vocab_size=300, draft_noise=0.3, seed=24))
        greedy = base.target_temperature == 0
        assert greedy.tolist() == [True, False, False, False, True]
        runs = {f"scan {scan} combine {combine}": dict(scan=scan, combine=combine)
                for scan, combine in (("race", True), ("race", False), ("early", None), ("pass1", True),
                                      ("kernel", None))}
        runs["one launch"] = dict(single=True)
        runs["reading programs first"] = dict(read_first=True)
        greedy_accepts = sampled_rejects = 0
        for shift in (0, 1, 2):
            draft_temperature = base.target_temperature.roll(shift)
            draft_tokens = base.draft_tokens.clone()
            greedy_draft = draft_temperature == 0
            draft_tokens[greedy_draft] = base.draft_logits[greedy_draft].argmax(dim=2).to(draft_tokens.dtype)
            clean = (draft_tokens, base.target_logits, base.draft_logits, base.target_temperature, draft_temperature,
                     base.uniforms, base.exponential_noise)
            want = reference.prob_verify_logits(*clean)
            poisoned = base.draft_logits.clone()
            poisoned[greedy] = float("nan")
            inputs = kernels.LogitsTensors(draft_tokens, base.target_logits, poisoned, base.target_temperature,
                                           draft_temperature, base.uniforms, base.exponential_noise)
            if not torch.equal(reference.prob_verify_logits(draft_tokens, base.target_logits, poisoned,
                                                            base.target_temperature, draft_temperature, base.uniforms,
                                                            base.exponential_noise)["output_tokens"],
                               want["output_tokens"]):
                failures.append(f"shift {shift}: the reference read a greedy target's draft rows")
            greedy_accepts += int((want["accepted_lengths"][greedy] > 0).sum())
            sampled_rejects += int((want["accepted_lengths"][~greedy & greedy_draft] < 3).sum())
            for name, options in runs.items():
                outputs = allocate_outputs(base)
                kernels.fused_logits_launcher(inputs, outputs, fast=False, **options)()
                if not all(torch.equal(outputs[key], want[key]) for key in ("output_tokens", "accepted_lengths")):
                    failures.append(f"shift {shift} {name}: {outputs['output_tokens'].tolist()} != "
                                    f"{want['output_tokens'].tolist()}")
            peer = allocate_outputs(base, error_flags=False)
            kernels.vllm_v2_style_launcher(inputs, peer, fast=False)()
            if not torch.equal(peer["output_tokens"], want["output_tokens"]):
                failures.append(f"shift {shift} vllm_v2_style: {peer['output_tokens'].tolist()} != "
                                f"{want['output_tokens'].tolist()}")
            if shift == 0:
                poisoned[1, 0] = float("nan")  # a sampled target's draft row: read, so its NaN must show
                outputs = allocate_outputs(base)
                kernels.fused_logits_launcher(inputs, outputs, fast=False)()
                if torch.equal(outputs["output_tokens"], want["output_tokens"]):
                    failures.append("NaN in a sampled target's draft row changed nothing: the rows read are others")
        if not (greedy_accepts and sampled_rejects):
            failures.append(f"insensitive workload: {greedy_accepts} greedy targets accept a draft, {sampled_rejects} "
                            "sampled targets reject a greedy draft")
        return "; ".join(failures) or None

    for case, run in zip(FAST_CASES, (deterministic, vllm_advances, equals_vllm, scratch_clean, plan_covers, any_split,
                                      lambda: _row_stats_failures(kernels), one_launch, greedy_drafts_unread,
                                      lambda: _read_first_failures(kernels), _sequence_order_failures),
                         strict=True):
        record(case, run)
    _run_block_cases(record, snapshot)
    return verdicts


def _read_first_order(temperatures: list[float], gamma: int, splits: int) -> list[tuple[int, int]]:
    """The (row, split) `_read_first` should give each launch index, written as a plain loop: split by split, the
    rows that read (every target row, then the draft rows of requests whose target samples, request by request),
    then split by split the empty rows (a greedy request's draft rows)."""
    rows_per = 2 * gamma + 1
    targets = [b * rows_per + r for b in range(len(temperatures)) for r in range(gamma + 1)]
    sampled = [b * rows_per + gamma + 1 + i for b, t in enumerate(temperatures) if t != 0 for i in range(gamma)]
    empty = [b * rows_per + gamma + 1 + i for b, t in enumerate(temperatures) if t == 0 for i in range(gamma)]
    reading = targets + sampled
    return ([(row, split) for split in range(splits) for row in reading]
            + [(row, split) for split in range(splits) for row in empty])


if importlib.util.find_spec("triton") is not None:  # (the interpreter resolves a kernel's callees in its globals)
    import triton
    import triton.language as tl

    from sdbench.ops.prob_verify_logits.triton_kernels import _read_first, _sequence_by_sequence

    @triton.jit
    def _sequence_probe(out_ptr):
        x, y = _sequence_by_sequence(tl.program_id(0), tl.program_id(1))
        index = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # the launch order: x fastest
        tl.store(out_ptr + 2 * index, x)
        tl.store(out_ptr + 2 * index + 1, y)

    @triton.jit
    def _read_first_probe(target_temp_ptr, out_ptr, GAMMA: tl.constexpr, BATCH_PAD: tl.constexpr):
        row, split = _read_first(tl.program_id(0), tl.program_id(1), target_temp_ptr, GAMMA, BATCH_PAD)
        index = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)  # the launch order: x fastest
        tl.store(out_ptr + 2 * index, row)
        tl.store(out_ptr + 2 * index + 1, split)


def _sequence_order_failures() -> str | None:
    """Scan "early"'s launch order (`_sequence_by_sequence`, pass 1's (row, split) and the race's (sequence, chunk)
    grids) against a plain loop: launch index by launch index, every y of x = 0, then of x = 1, ..., on grids of one
    row, one column, square and not, so each sequence's programs are adjacent in launch order."""
    import torch

    failures = []
    for grid in ((1, 1), (1, 5), (6, 1), (3, 3), (4, 7), (9, 2)):
        out = torch.full((grid[0] * grid[1] * 2,), -1, dtype=torch.int32)
        _sequence_probe[grid](out)
        got = [tuple(pair) for pair in out.view(-1, 2).tolist()]
        want = [(x, y) for x in range(grid[0]) for y in range(grid[1])]
        if got != want:
            failures.append(f"grid {grid}: {got} != {want}")
    return "; ".join(failures) or None


def _read_first_failures(kernels) -> str | None:
    """`_read_first` against `_read_first_order` (a plain loop) on batches all greedy, all sampled, mixed, of one
    request and of a batch that pads (5 to 8), γ 1, 3 and 4, 1 and 3 splits: the same (row, split) at every
    launch index, which also makes it a permutation of the grid. Then fused_logits with the reading programs first
    and in row order: the same outputs on a mixed batch, supplied randomness."""
    import torch
    import triton

    from sdbench.ops.prob_verify_logits.common import allocate_outputs
    from sdbench.ops.prob_verify_logits.workload import make_logits_workload

    failures = []
    batches = ([0.0, 0.0, 0.0], [0.7, 1.0], [0.0, 0.7, 0.0, 1.3, 1.0], [0.0], [0.9], [1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 2.0])
    for temperatures, gamma, splits in itertools.product(batches, (1, 3, 4), (1, 3)):
        temperature = torch.tensor(temperatures, dtype=torch.float32)
        rows = len(temperatures) * (2 * gamma + 1)
        out = torch.full((rows * splits * 2,), -1, dtype=torch.int32)
        _read_first_probe[(rows, splits)](temperature, out, GAMMA=gamma,
                                          BATCH_PAD=triton.next_power_of_2(len(temperatures)))
        got = [tuple(pair) for pair in out.view(-1, 2).tolist()]
        want = _read_first_order(temperatures, gamma, splits)
        if got != want:
            failures.append(f"temperatures {temperatures} γ {gamma} splits {splits}: {got} != {want}")
    if failures:  # (a wrong order can name rows outside the batch: no kernel runs with it)
        return "; ".join(failures)
    w = make_logits_workload(LogitsConfig(7, 3, vocab_size=200, draft_noise=0.3, seed=25))
    assert 0 < int((w.target_temperature == 0).sum()) < 7, "the batch must mix greedy and sampled requests"
    inputs = kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                   w.draft_temperature, w.uniforms, w.exponential_noise)
    results = []
    for read_first in (True, False):
        outputs = allocate_outputs(w)
        kernels.fused_logits_launcher(inputs, outputs, fast=False, stats_plan_=kernels.StatsPlan(span=64, splits=4),
                                      read_first=read_first)()
        results.append(outputs)
    for key in ("output_tokens", "accepted_lengths", "next_tokens"):
        if not torch.equal(results[0][key], results[1][key]):
            failures.append(f"read-first {key} {results[0][key].tolist()} != row order {results[1][key].tolist()}")
    return "; ".join(failures) or None


def _poison(stats):
    """(max, Σexp, argmax) partials filled with +inf, NaN and 0: wrong wherever a reader uses one pass 1 did not write."""
    for part, poison in zip(stats, (float("inf"), float("nan"), 0), strict=True):
        part.fill_(poison)
    return stats


@contextlib.contextmanager
def _poisoned_stats(kernels):
    """Every stats buffer the launchers allocate meanwhile starts poisoned (+inf max, NaN Σexp, argmax 0): the
    padding after a row's partials (`partials_stride`) is loaded and must never be used as a partial; a reader that
    did would take a max of +inf."""
    allocate = kernels.allocate_stats

    def poisoned(*args):
        return _poison(allocate(*args))

    kernels.allocate_stats = poisoned
    try:
        yield
    finally:
        kernels.allocate_stats = allocate


def _row_stats_failures(kernels) -> str | None:
    """Pass 1 alone, its partials combined here, against float64: the row max (the float32 max of x·(1/T),
    exactly), Σ exp(z - max) (relative 1e-5) and, on greedy rows, the first index of the max (exactly), for
    1, 3 and 5 splits of each row (2 to 10 tiles per split), unit-scale float32 and bf16 logits, a row whose
    last 100 logits are -inf (whole splits of them), a row starting with 50 -inf logits, a tie for the max on a greedy row, and a greedy row
    whose every logit is the dtype's lowest finite value (-FLT_MAX in float32: the lanes' starting value). bf16 rows
    read as elements and as 32-bit words (`_load_tile`)."""
    import torch

    from sdbench.ops.prob_verify_logits.workload import make_logits_workload

    failures = []
    for dtype in ("float32", "bfloat16"):
        w = make_logits_workload(LogitsConfig(3, 2, vocab_size=300, logits_dtype=dtype, seed=21))
        # flat logits (unit scale), so no single term dominates a sum and every lane's rescale path counts
        gen = torch.Generator().manual_seed(22)
        target = torch.randn(w.target_logits.shape, generator=gen).to(w.target_logits.dtype)
        draft = torch.randn(w.draft_logits.shape, generator=gen).to(w.draft_logits.dtype)
        target[1, 1, 200:] = float("-inf")
        draft[2, 0, :50] = float("-inf")
        assert float(w.target_temperature[0]) == float(w.draft_temperature[0]) == 0.0, "request 0 must be greedy"
        target[0, 0, [230, 81, 17]] = target[0, 0].max() + 1  # first index of the max: 17 (81: same lane)
        draft[0, 1] = torch.finfo(draft.dtype).min  # a greedy row at the type's lowest: max it, argmax 0
        inputs = kernels.LogitsTensors(w.draft_tokens, target, draft, w.target_temperature, w.draft_temperature,
                                       w.uniforms, w.exponential_noise)
        rows = torch.cat([target, draft], dim=1).float()  # [B, 2γ+1, V], pass 1's row order
        temperature = torch.cat([w.target_temperature[:, None].expand(-1, 3), w.draft_temperature[:, None].expand(-1, 2)],
                                dim=1)
        inverse = torch.where(temperature > 0, 1.0 / torch.where(temperature > 0, temperature, 1.0), 1.0)
        z = rows * inverse[..., None]  # float32, as the kernel scales
        want_max = z.max(dim=2).values
        want_sum = torch.exp(z.double() - want_max.double()[..., None]).sum(dim=2)
        want_arg = rows.argmax(dim=2)  # the first index of the max
        for span, words in itertools.product((64, 128, 320), (False, True)):
            plan = kernels.StatsPlan(span=span, splits=-(-300 // span))
            stats = kernels.allocate_stats(3, 2, plan.splits, target.device)
            kernels._stats_launch(inputs, stats, plan, bf16_words=words)()
            # (each row's partials `partials_stride` apart; the padding after them is never written)
            m, s, a = (part.view(3, 5, -1)[..., :plan.splits] for part in stats)
            got_max = m.max(dim=2).values
            got_sum = (s.double() * torch.exp(m.double() - got_max.double()[..., None])).sum(dim=2)
            got_arg = torch.where(m == got_max[..., None], a, 2**31 - 1).min(dim=2).values
            greedy = temperature == 0
            if not torch.equal(got_max, want_max):
                failures.append(f"{dtype} span {span} words {words}: max {got_max.tolist()} != {want_max.tolist()}")
            if not torch.allclose(got_sum, want_sum, rtol=1e-5, atol=0):
                failures.append(f"{dtype} span {span} words {words}: sum {got_sum.tolist()} != {want_sum.tolist()}")
            if not torch.equal(got_arg[greedy], want_arg[greedy].to(got_arg.dtype)):
                failures.append(f"{dtype} span {span} words {words}: argmax {got_arg[greedy].tolist()} != {want_arg[greedy].tolist()}")
            # COMBINE (fused_logits): each row's last program combines its partials in the kernel, twice in a row
            combined = kernels.allocate_stats(3, 2, 1, target.device) + (torch.zeros(15, dtype=torch.int32),)
            # (the partials poisoned first: the padding after each row's splits is never written, and must never
            # be read as a partial; a max of +inf there would win the row's max, a NaN sum would spread)
            partials = _poison(kernels.allocate_stats(3, 2, plan.splits, target.device))
            launch = kernels._stats_launch(inputs, partials, plan, combined=combined, bf16_words=words)
            for call in range(2):
                launch()
                m, s, a, arrivals = (part.view(3, 5) for part in combined)
                if not (torch.equal(m, want_max) and torch.allclose(s.double(), want_sum, rtol=1e-5, atol=0)
                        and torch.equal(a[greedy], want_arg[greedy].to(a.dtype)) and not arrivals.any()):
                    failures.append(f"{dtype} span {span} words {words} call {call}: combined {m.tolist()}, {s.tolist()}, "
                                    f"{a.tolist()}, arrivals {arrivals.tolist()}")
            # the token rule's skip: a greedy request's draft rows (request 0's rows 3 and 4) sweep an empty span and
            # leave (-inf, 0, no index) in every split; every other partial is the one read above, bit for bit
            skipped = kernels.allocate_stats(3, 2, plan.splits, target.device)
            kernels._stats_launch(inputs, skipped, plan, skip_greedy_drafts=True, bf16_words=words)()
            # the same programs launched reading ones first (`_read_first`): every partial the same, bit for bit
            reordered = _poison(kernels.allocate_stats(3, 2, plan.splits, target.device))
            kernels._stats_launch(inputs, reordered, plan, skip_greedy_drafts=True, bf16_words=words,
                                  read_first=True)()
            for name, part, want in zip(("max", "sum", "arg"), reordered, skipped, strict=True):
                part, want = part.view(3, 5, -1)[..., :plan.splits], want.view(3, 5, -1)[..., :plan.splits]
                if not torch.equal(part, want):
                    failures.append(f"{dtype} span {span} words {words}: read-first {name} partials {part.tolist()} "
                                    f"!= {want.tolist()}")
            empty = torch.zeros(3, 5, dtype=torch.bool)
            empty[0, 3:] = True
            for name, part, read, blank in zip(("max", "sum", "arg"), skipped, stats, (float("-inf"), 0.0, 2**31 - 1),
                                               strict=True):
                part, read = part.view(3, 5, -1)[..., :plan.splits], read.view(3, 5, -1)[..., :plan.splits]
                if not (bool((part[empty] == blank).all()) and torch.equal(part[~empty], read[~empty])):
                    failures.append(f"{dtype} span {span} words {words}: skipped {name} partials {part.tolist()}")
    return "; ".join(failures) or None


def _block_workload(config_name: str, cfg: LogitsConfig):
    from sdbench.ops.prob_verify_logits.workload import make_logits_workload

    w = make_logits_workload(cfg.replace(rule="block"))
    if "greedy_drafts" in config_name:  # greedy drafts under sampled (and greedy) targets
        w.draft_temperature[::2] = 0.0
    if "bad_tokens" in config_name:
        w.draft_tokens[0, 2] = cfg.vocab_size + 3
        w.draft_tokens[1, 0] = -2
    return w


def _hand_checked_block_workload():
    """test_prob_reference.py's hand-checked block draws as logits (log p, T = 1), where random workloads
    rarely tell one rule detail from another: (0) τ = 1 with w_1 = 0.4, where the weighted residual races
    to token 1 and the unweighted one would race to 0; (1) a block kept although its first draft fails
    token-wise; (2) no draft kept (h_1 = 0)."""
    import torch

    from sdbench.ops.prob_verify_logits.workload import logits_workload_from_probs

    sys.path.insert(0, str(REPO / "tests" / "ops" / "prob_verify"))
    from test_prob_reference import P_ROWS, Q_UNIFORM

    skewed = [0.05, 0.05, 0.45, 0.45]
    return logits_workload_from_probs(
        draft_tokens=torch.tensor([[1, 2], [1, 0], [1, 0]]),
        target_probs=torch.tensor([P_ROWS] * 3),
        draft_probs=torch.tensor([[Q_UNIFORM, skewed], [Q_UNIFORM, Q_UNIFORM], [Q_UNIFORM, Q_UNIFORM]]),
        uniforms=torch.tensor([[0.2, 0.5], [0.5, 0.1], [0.5, 0.2]]),
        exponential_noise=torch.tensor([[0.01, 1.0, 1.0, 1.0], [1.0, 1.0, 0.1, 1.0], [1.0, 1.0, 0.1, 1.0]]))


def fast_mode_advances(impl, fast, snapshot) -> str | None:
    """A prepared run's n-th call in fast mode draws at offset + n, on the device (no host work): it equals
    the first call of a run prepared at that offset, and the run's counters end one step on per call."""
    import torch

    run = impl.prepare(fast)
    first, second = snapshot(run), snapshot(run)
    at_offset = snapshot(impl.prepare(fast))
    one_on = snapshot(impl.prepare(fast.with_randomness("fast", fast.offset + 1)))
    if not all(torch.equal(first[k], at_offset[k]) and torch.equal(second[k], one_on[k]) for k in first):
        return f"calls 1, 2 {first['output_tokens']}, {second['output_tokens']} != runs at offsets "\
               f"{fast.offset}, {fast.offset + 1}: {at_offset['output_tokens']}, {one_on['output_tokens']}"
    if not bool((run.philox_offsets == fast.offset + 2).all()):
        return f"offsets after two calls: {run.philox_offsets.tolist()}, expected {fast.offset + 2}"
    return None


def _run_block_cases(record, snapshot) -> None:
    import torch

    from sdbench.ops.prob_verify_logits import triton_kernels as kernels
    from sdbench.ops.prob_verify_logits.checks import check
    from sdbench.ops.prob_verify_logits.common import allocate_outputs
    from sdbench.ops.prob_verify_logits.workload import make_logits_workload

    fused = registry.get("prob_verify_logits", "fused_logits")
    for config_name, cfg in BLOCK_PARITY_CONFIGS.items():
        record(f"parity_block_{config_name}", lambda w=_block_workload(config_name, cfg): check(fused, w))
    record("parity_block_hand_checked", lambda: check(fused, _hand_checked_block_workload()))

    fast = make_logits_workload(LogitsConfig(3, 3, vocab_size=64, rule="block", seed=21)).with_randomness("fast", 2)

    def deterministic():
        return fast_mode_advances(fused, fast, snapshot)

    def inputs(w):
        return kernels.LogitsTensors(w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature,
                                     w.draft_temperature, w.uniforms, w.exponential_noise)

    def scratch_clean():
        launch = kernels.fused_logits_launcher(inputs(fast), allocate_outputs(fast), fast=True, seed=21, offset=2,
                                               rule="block")
        launch()
        launch()
        clean = not any(counter.any() for counter in launch.scratch)
        return None if clean else f"scratch not reset: {launch.scratch}"

    def any_split():
        """The split of either stream (and pass 1's step) changes the partials (and r_i's summation order), not the
        tokens; nor does the order of the race's loads (tokens_first). The stats buffers start poisoned: at 3 splits
        uncombined (span 96), the padding after each row's partials is read and must not be used."""
        w = make_logits_workload(LogitsConfig(2, 3, vocab_size=200, rule="block", seed=22))
        seen = []
        for span, mass_span, combine, step, first in ((64, 64, True, None, False), (128, 200, True, None, True),
                                                      (200, 128, True, None, False), (64, 128, False, None, True),
                                                      (96, 64, False, None, False),
                                                      (128, 64, True, 2 * kernels.STATS_TILE, False)):
            outputs = allocate_outputs(w)
            with _poisoned_stats(kernels):
                kernels.fused_logits_launcher(inputs(w), outputs, fast=False, rule="block", combine=combine,
                                              tokens_first=first,
                                              stats_plan_=kernels.StatsPlan(span, -(-200 // span), step),
                                              mass_plan=kernels.StatsPlan(span=mass_span,
                                                                          splits=-(-200 // mass_span)))()
            seen.append(outputs["output_tokens"].clone())
        same = all(torch.equal(tokens, seen[0]) for tokens in seen)
        return None if same else f"tokens differ by split: {seen}"

    for case, run in zip(BLOCK_FAST_CASES, (deterministic, scratch_clean, any_split), strict=True):
        record(case, run)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through pytest, which sets TRITON_INTERPRET=1"
    print(json.dumps(_run_cases()))
