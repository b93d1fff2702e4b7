"""The from-logits reference and workload: temperature softmax, greedy requests in a sampled batch,
the float64 twin, block verification's known values, the roofline bytes and the benchmark grid."""

from __future__ import annotations

import pytest
import torch

from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify.reference import prob_verify
from sdbench.ops.prob_verify_logits import reference
from sdbench.ops.prob_verify_logits.workload import (
    LogitsConfig,
    benchmark_grid,
    design_bytes,
    logits_read_floor_bytes,
    make_logits_workload,
)


def test_temperature_probs_is_softmax_of_scaled_logits_and_one_hot_when_greedy():
    logits = torch.randn(3, 2, 50, dtype=torch.float64) * 4
    logits[2, 1, 7] = logits[2, 1, 30] = logits[2, 1].max() + 1  # a tie: the first index wins
    temperature = torch.tensor([0.7, 1.3, 0.0])
    probs = reference.temperature_probs(logits.float(), temperature)
    for b in range(2):
        expected = (logits[b] / float(temperature[b])).softmax(-1)
        torch.testing.assert_close(probs[b].double(), expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(probs[2, 0], torch.nn.functional.one_hot(logits[2, 0].argmax(), 50).float())
    assert probs[2, 1, 7] == 1 and probs[2, 1].sum() == 1


def _greedy_loop(draft_tokens, target_logits):
    """Greedy verification by hand: accept while the draft equals the target's argmax."""
    lengths, next_tokens = [], []
    for b in range(draft_tokens.shape[0]):
        k = 0
        while k < draft_tokens.shape[1] and int(draft_tokens[b, k]) == int(target_logits[b, k].argmax()):
            k += 1
        lengths.append(k)
        next_tokens.append(int(target_logits[b, k].argmax()))
    return torch.tensor(lengths), torch.tensor(next_tokens)


@pytest.mark.parametrize("rule", ["token", "block"])
def test_greedy_requests_are_greedy_verification_in_a_mixed_batch(rule):
    cfg = LogitsConfig(16, 5, vocab_size=40, temperatures=(0.0, 1.0), draft_noise=0.15, rule=rule, seed=3)
    w = make_logits_workload(cfg)
    out = reference.reference_outputs(w)
    greedy = w.target_temperature == 0
    lengths, next_tokens = _greedy_loop(w.draft_tokens[greedy], w.target_logits[greedy])
    assert torch.equal(out["accepted_lengths"][greedy], lengths)
    assert torch.equal(out["next_tokens"][greedy], next_tokens)
    assert 0 < int(lengths.sum()) < lengths.numel() * 5  # the case mixes acceptances and rejections


def test_sampled_requests_are_the_probability_rule_on_the_temperature_softmax():
    w = make_logits_workload(LogitsConfig(8, 3, vocab_size=64, temperatures=(0.5, 2.0), seed=4))
    out = reference.reference_outputs(w)
    p = torch.stack([(w.target_logits[b].double() / float(w.target_temperature[b])).softmax(-1) for b in range(8)])
    q = torch.stack([(w.draft_logits[b].double() / float(w.draft_temperature[b])).softmax(-1) for b in range(8)])
    expected = prob_verify(w.draft_tokens, p, q, w.uniforms, w.exponential_noise, compute_dtype=torch.float64)
    for name in ("accepted_lengths", "next_tokens", "output_tokens"):
        assert torch.equal(out[name], expected[name]), name


@pytest.mark.parametrize("rule", ["token", "block"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_float64_twin_agrees_on_tokens(rule, dtype):
    w = make_logits_workload(LogitsConfig(32, 4, vocab_size=500, logits_dtype=dtype, rule=rule, seed=5))
    inputs = (w.draft_tokens, w.target_logits, w.draft_logits, w.target_temperature, w.draft_temperature,
              w.uniforms, w.exponential_noise)
    single = reference.prob_verify_logits(*inputs, rule=rule)
    double = reference.prob_verify_logits_float64(*inputs, rule=rule)
    assert torch.equal(single["output_tokens"], double["output_tokens"])


def _paper_example(rounds: int, seed: int):
    """Sun et al.'s motivating example: context-free target (1/3, 2/3), draft (2/3, 1/3), γ = 2.
    Expected accepted drafts: token-wise 10/9, block verification 11/9."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.tensor([1 / 3, 2 / 3], dtype=torch.float64).expand(rounds, 3, 2).contiguous()
    q = torch.tensor([2 / 3, 1 / 3], dtype=torch.float64).expand(rounds, 2, 2).contiguous()
    drafts = torch.multinomial(q[:, 0], 2, replacement=True, generator=gen)
    uniforms = torch.rand(rounds, 2, generator=gen, dtype=torch.float64)
    noise = torch.empty(rounds, 2, dtype=torch.float64).exponential_(generator=gen)
    return drafts, p, q, uniforms, noise


def test_block_verification_reaches_the_papers_expected_length():
    rounds = 200_000
    drafts, p, q, uniforms, noise = _paper_example(rounds, seed=0)
    block = prob_verify(drafts, p, q, uniforms, noise, rule="block", compute_dtype=torch.float64)["accepted_lengths"].double()
    token = prob_verify(drafts, p, q, uniforms, noise, compute_dtype=torch.float64)["accepted_lengths"].double()
    tolerance = 4 * 0.9 / rounds**0.5  # 4 standard errors (the lengths' std is < 0.9)
    assert abs(float(block.mean()) - 11 / 9) < tolerance
    assert abs(float(token.mean()) - 10 / 9) < tolerance


def test_mean_accepted_length_by_rule_reports_both_rules():
    w = make_logits_workload(LogitsConfig(2000, 4, vocab_size=32, temperatures=(1.0,), draft_noise=0.3, seed=6))
    means = reference.mean_accepted_length_by_rule(w)
    assert set(means) == {"token", "block"} and 0 < means["token"] < 4 and 0 < means["block"] < 4


# --- the workload --------------------------------------------------------------------------------
def test_workload_shapes_dtypes_and_temperatures():
    cfg = LogitsConfig(6, 3, vocab_size=100, logits_dtype="bfloat16", token_dtype="int32", seed=1)
    w = make_logits_workload(cfg)
    assert w.target_logits.shape == (6, 4, 100) and w.draft_logits.shape == (6, 3, 100)
    assert w.target_logits.dtype == torch.bfloat16 and w.draft_tokens.dtype == torch.int32
    assert w.target_temperature.tolist() == pytest.approx([0.0, 0.7, 1.0, 1.3, 0.0, 0.7])
    greedy = w.draft_temperature == 0
    assert torch.equal(w.draft_tokens[greedy].long(), w.draft_logits[greedy].float().argmax(dim=2))
    again = make_logits_workload(cfg)
    assert torch.equal(w.target_logits, again.target_logits) and torch.equal(w.draft_tokens, again.draft_tokens)


def test_draft_noise_zero_accepts_everything():
    w = make_logits_workload(LogitsConfig(64, 4, vocab_size=50, draft_noise=0.0, seed=2))
    assert bool((reference.reference_outputs(w)["accepted_lengths"] == 4).all())


@pytest.mark.parametrize("change,message", [({"rule": "tree"}, "rule"), ({"logits_dtype": "float16"}, "dtype"),
                                            ({"temperatures": (-1.0,)}, "temperatures"), ({"gamma": 0}, "gamma")])
def test_config_validation_names_the_bad_value(change, message):
    with pytest.raises(SdbenchError, match=message):
        LogitsConfig(2, 2).replace(**change)


def test_roofline_bytes():
    cfg = LogitsConfig(32, 8, vocab_size=128256, logits_dtype="bfloat16")
    assert logits_read_floor_bytes(cfg) == 32 * 17 * 128256 * 2  # ~140 MB: every logit once
    fused = design_bytes(cfg, "fused_logits")
    softmax = design_bytes(cfg, "softmax_then_prob")
    row = 128256 * 2
    # 8 of the 32 requests are greedy (temperatures cycled): their 8 draft rows are not read, and only the 24
    # sampled requests read their rows k again
    assert fused["read"] == logits_read_floor_bytes(cfg) - 8 * 8 * row + 24 * 2 * row and fused["written"] == 0
    all_greedy = cfg.replace(temperatures=(0.0,))
    assert design_bytes(all_greedy, "fused_logits")["read"] == 32 * 9 * row  # the target rows alone
    assert softmax["written"] == 32 * 17 * 128256 * 4 and softmax["read"] > fused["read"]
    with pytest.raises(SdbenchError, match="design"):
        design_bytes(cfg, "magic")


def test_block_rule_reads_every_row_and_rereads_rows_1_to_gamma_minus_1_of_sampled_requests():
    cfg = LogitsConfig(32, 8, vocab_size=128256, logits_dtype="bfloat16", rule="block")  # 8 of 32 requests greedy
    row, floor = 128256 * 2, logits_read_floor_bytes(cfg)
    assert design_bytes(cfg, "fused_logits")["read"] == floor + 24 * 2 * 7 * row + 24 * 2 * row
    assert design_bytes(cfg.replace(temperatures=(0.0,)), "fused_logits")["read"] == floor  # no mass, no rows k


def test_benchmark_grid_is_the_issues_grid():
    grid = list(benchmark_grid())
    assert len(grid) == 4 * 3 * 3 * 2
    assert {c.batch_size for c in grid} == {1, 32, 128, 512} and {c.gamma for c in grid} == {4, 8, 16}
    assert {c.vocab_size for c in grid} == {32000, 128256, 151936} and {c.logits_dtype for c in grid} == {"bfloat16", "float32"}
    assert all(c.rule == "block" for c in benchmark_grid(rule="block"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_softmax_buffers_fill_the_reference_probabilities(dtype):
    """The probability peers' softmax (preallocated, greedy rows one-hot) equals the definition."""
    from sdbench.ops.prob_verify_logits.common import SoftmaxBuffers

    w = make_logits_workload(LogitsConfig(6, 3, vocab_size=70, logits_dtype=dtype, seed=8))
    buffers = SoftmaxBuffers(w.target_logits, w.draft_logits)
    buffers.target_probs.fill_(-1)
    buffers.fill(w.target_logits, w.draft_logits, w.target_temperature, w.draft_temperature)
    assert torch.equal(buffers.target_probs, reference.temperature_probs(w.target_logits, w.target_temperature))
    assert torch.equal(buffers.draft_probs, reference.temperature_probs(w.draft_logits, w.draft_temperature))


def test_make_workload_dispatches_to_the_logits_workload():
    from sdbench.ops import make_workload
    from sdbench.ops.workload import VerifyConfig

    w = make_workload("prob_verify_logits", VerifyConfig(2, 3, vocab_size=40, prob_dtype="bfloat16", seed=1))
    assert w.target_logits.shape == (2, 4, 40) and w.target_logits.dtype == torch.bfloat16


def test_parity_knows_the_logits_reference_and_catches_a_wrong_sampler():
    from sdbench import parity, registry
    from sdbench.registry import BufferedRun, Implementation

    w = make_logits_workload(LogitsConfig(16, 4, vocab_size=60, seed=9))
    assert parity.check(registry.get("prob_verify_logits", "torch_eager"), w) is None

    def off_by_one(workload):
        outputs = reference.reference_outputs(workload)

        def launch():
            outputs["accepted_lengths"].clamp_(max=3).add_(1)  # claims one draft too many
        return BufferedRun(launch, outputs)

    wrong = Implementation(op="prob_verify_logits", name="off_by_one", backend="torch", description="",
                           prepare=off_by_one, devices=("cpu",))
    assert "accepted_lengths" in parity.check(wrong, w)


def test_bench_rows_carry_the_floor_the_bytes_and_both_rules():
    from sdbench.commands.logits_bench import time_point

    cfg = LogitsConfig(4, 2, vocab_size=64, seed=3)
    rows = time_point(cfg, ["torch_eager", "softmax_flashinfer"], cold_l2=False, tbps=3.0, views=("cpu",), device="cpu")
    eager, flashinfer = rows
    assert eager["design"] == "torch_eager" and eager["cpu_us"] > 0 and eager["floor_bytes"] == 4 * 5 * 64 * 4
    assert eager["rule"] == "token" and flashinfer["rule"] == "token"
    assert eager["vs_floor_plus_3us"] == pytest.approx(eager["cpu_us"] / (1.3 * eager["floor_us"] + 3.0), rel=1e-2)
    assert flashinfer["reason"] and "cpu_us" not in flashinfer
    assert 0 <= eager["expected_length_token"] <= 2 and 0 <= eager["expected_length_block"] <= 2
    from sdbench.measure import environment

    assert eager["gpu_name"] is None and eager["torch_version"] == torch.__version__  # where and with what
    assert eager["git_sha"] == environment.software()["git_sha"] and "sm_clock_mhz" in flashinfer
    # no kernel launches on a CPU device: the launch floor's column is empty and says why
    assert eager["cpu_launch_floor_us"] == "" and "CPU device" in eager["launch_floor_reason"]


def test_bench_times_the_launch_floor_beside_the_designs(monkeypatch):
    """The launch floor of the same run: the empty launch is timed in the designs' session (interleaved, so
    it sees their state) and every timed row carries its median per view, with no reason."""
    import sdbench.ops.launch_floor as floors
    from sdbench.commands.logits_bench import time_point

    calls = []
    monkeypatch.setattr(floors, "path_floor",
                        lambda path, device: floors.LaunchFloor(lambda: calls.append(path), path))
    cfg = LogitsConfig(2, 2, vocab_size=16, seed=1)
    (eager,) = time_point(cfg, ["torch_eager"], cold_l2=False, tbps=3.0, views=("cpu",), device="cpu", means=False)
    assert calls and set(calls) == {"triton_bound"}  # the designs' own launch path
    assert eager["cpu_launch_floor_us"] > 0 and eager["launch_floor_reason"] == ""
    assert eager["cpu_launch_floor_us"] < eager["cpu_us"]  # an empty call against a whole verification step


def test_bench_times_alone_the_designs_that_do_not_fit_together(monkeypatch):
    """A point whose designs' buffers do not fit at once (b = 512, V = 128256, fp32 on an 80 GB card): only
    the design that ran out of memory, in prepare or while timed, is timed again alone, with the collector
    run first; one that never fits, or raises otherwise, is a row with its reason and no time; the rest
    keep their joint times."""
    import sdbench.commands.logits_bench as bench
    from sdbench import registry
    from sdbench.registry import BufferedRun, Implementation

    def oom():
        return torch.OutOfMemoryError("CUDA out of memory (simulated)")

    prepared = {name: 0 for name in ("fits", "late", "timed", "never", "twice", "broken")}

    def fake(name, fail_prepare=lambda count: False, fail_launch=lambda count: False, error=oom):
        def prepare(workload):
            prepared[name] += 1
            count = prepared[name]
            if fail_prepare(count):
                raise error()

            def launch():
                if fail_launch(count):
                    raise error()
            return BufferedRun(launch, {})
        return Implementation(op="prob_verify_logits", name=name, backend="torch", description="",
                              prepare=prepare, devices=("cpu",))

    fakes = {impl.name: impl for impl in (
        fake("fits"),
        fake("late", fail_prepare=lambda count: count == 1),  # no room beside the others' buffers
        fake("timed", fail_launch=lambda count: count == 1),  # its temporaries do not fit beside them
        fake("never", fail_prepare=lambda count: True),
        fake("twice", fail_prepare=lambda count: count == 2, fail_launch=lambda count: count == 1),
        fake("broken", fail_launch=lambda count: True, error=lambda: RuntimeError("bad launch")))}
    real_get = registry.get
    monkeypatch.setattr(registry, "get", lambda op, name: fakes.get(name) or real_get(op, name))
    collected = []
    monkeypatch.setattr(bench.gc, "collect", lambda: collected.append(1))
    cfg = LogitsConfig(2, 2, vocab_size=16, seed=1)

    def point(names):
        return {row["design"]: row for row in bench.time_point(cfg, names, False, 3.0, views=("cpu",), device="cpu",
                                                               means=False)}
    rows = point(["fits", "timed", "twice", "broken"])  # prepared together; two ran out of memory while timed
    assert prepared == {"fits": 1, "late": 0, "timed": 2, "never": 0, "twice": 2, "broken": 1}
    assert len(collected) >= 3  # before the designs timed alone, and after each
    assert [rows[name]["timed_alone"] for name in ("fits", "timed", "twice", "broken")] == [False, True, True, False]
    assert rows["twice"]["reason"].startswith("out of memory") and "cpu_us" not in rows["twice"]
    assert "cpu: raised RuntimeError: bad launch" in rows["broken"]["reason"] and rows["broken"]["cpu_us"] == ""
    rows |= point(["fits", "late", "never"])  # "late" stops the joint prepare: each alone
    assert prepared["fits"] == 3 and prepared["late"] == 2 and prepared["never"] == 1  # the joint prepare stopped at "late"
    assert all(rows[name]["cpu_us"] > 0 and rows[name]["reason"] == "" for name in ("fits", "late", "timed"))
    assert "cpu_us" not in rows["never"] and rows["never"]["reason"].startswith("out of memory")


def test_bench_expected_lengths_over_batch_chunks_equal_the_whole_batch(monkeypatch):
    """logits_bench's chunked expectation equals one call over the whole batch with the same draws (the same
    generator stream: multinomial draws rows in order, so chunks of whole requests consume it alike)."""
    import sdbench.commands.logits_bench as bench

    cfg = LogitsConfig(7, 3, vocab_size=50, seed=4)
    workload = make_logits_workload(cfg)
    draws = -(-bench.EXPECTED_SAMPLES // 7)
    whole = reference.expected_accepted_lengths(workload, draws, torch.Generator().manual_seed(4))
    monkeypatch.setattr(bench, "RULE_CHUNK_LOGITS", 2 * 7 * 50 * draws)  # two requests a chunk: 2, 2, 2, 1
    monkeypatch.setattr(bench, "_LENGTHS", {})
    chunked = bench._expected_lengths(cfg, workload.with_randomness("fast"))
    assert chunked == pytest.approx(whole, rel=1e-9)


def test_expected_accepted_lengths_match_the_rules_sampled():
    """The closed forms (fresh drafts, exact over the uniforms) against the reference rules run on 3·20000
    sampled (drafts, uniforms, noise) rounds: within 4.5 standard errors for each rule, and the two rules'
    expectations differ by more than that (so a formula swapped between them would fail)."""
    cfg = LogitsConfig(3, 4, vocab_size=8, seed=5, draft_noise=0.6, temperatures=(1.0, 0.0, 0.7))
    w = make_logits_workload(cfg)
    expected = reference.expected_accepted_lengths(w, 20000, torch.Generator().manual_seed(1))
    rounds = 20000
    gen = torch.Generator().manual_seed(2)
    tile = lambda t: t.repeat_interleave(rounds, 0)  # noqa: E731
    q = reference.temperature_probs(w.draft_logits, w.draft_temperature)
    drafts = torch.multinomial(tile(q).reshape(-1, 8), 1, generator=gen).view(3 * rounds, 4)
    uniforms = torch.rand(3 * rounds, 4, generator=gen)
    noise = torch.empty(3 * rounds, 8).exponential_(generator=gen)
    sampled = {}
    for rule in ("token", "block"):
        lengths = reference.prob_verify_logits(drafts, tile(w.target_logits), tile(w.draft_logits),
                                               tile(w.target_temperature), tile(w.draft_temperature), uniforms,
                                               noise, rule=rule)["accepted_lengths"].double()
        sampled[rule] = (float(lengths.mean()), float(lengths.std()) / len(lengths) ** 0.5)
    for rule, (mean, error) in sampled.items():
        assert abs(mean - expected[rule]) < 4.5 * error, (rule, mean, expected[rule], error)
    assert expected["block"] - expected["token"] > 4.5 * max(error for _, error in sampled.values())


def test_bench_lengths_only_writes_both_rules_per_point(tmp_path, monkeypatch):
    import csv

    import sdbench.commands.logits_bench as bench

    monkeypatch.setattr(bench, "_LENGTHS", {})
    configs = [LogitsConfig(3, 2, vocab_size=40, seed=6), LogitsConfig(2, 4, vocab_size=30, seed=7)]
    out = tmp_path / "lengths.csv"
    assert bench._write_lengths(configs, str(out), device="cpu") == 0
    rows = list(csv.DictReader(out.open()))
    assert [(int(row["batch"]), int(row["gamma"])) for row in rows] == [(3, 2), (2, 4)]
    for row, cfg in zip(rows, configs, strict=True):
        want = bench._LENGTHS[cfg]  # what the timed rows of the same point carry
        assert float(row["expected_length_token"]) == pytest.approx(want["token"], abs=1e-4)
        assert float(row["expected_length_block"]) == pytest.approx(want["block"], abs=1e-4)
        assert 0 <= want["token"] <= cfg.gamma and 0 <= want["block"] <= cfg.gamma
