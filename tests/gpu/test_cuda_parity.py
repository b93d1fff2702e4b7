"""CUDA kernels against the reference: bit-exact on a grid plus edges, sync-free, graph-capturable,
and clean under compute-sanitizer. GPU only (tests/conftest.py marks everything here `gpu`).

Tolerance: none. Every output is an integer, a bool or a bit copy of the KV, so parity compares bits
(sdbench.parity.compare), with outputs poisoned before every run (sdbench.parity.check).
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from sanitizer import assert_sanitizer_clean

from sdbench import ext, parity, registry
from sdbench.ops import make_workload
from sdbench.ops.workload import VerifyConfig

CUDA_IMPLS = {
    "verify": ("naive", "ballot"),
    "pack": ("pack_cuda_naive", "pack_cuda"),
    "verify_pack": ("fused_single_block", "fused", "ballot+pack_torch", "ballot+pack_cuda"),
}
DTYPE_PAIRS = (("int64", "float16"), ("int32", "bfloat16"), ("int32", "float16"), ("int64", "bfloat16"))


@pytest.fixture(scope="module", autouse=True)
def built_extension():
    reason = ext.unavailable_reason()
    if reason is not None:
        pytest.fail(f"the CUDA extension must build on a GPU machine: {reason}")


def _cfg(index: int, batch: int, gamma: int, alpha: float, kv_dim: int = 0, **extra) -> VerifyConfig:
    token_dtype, kv_dtype = DTYPE_PAIRS[index % len(DTYPE_PAIRS)]
    fields = {"token_dtype": token_dtype, "kv_dtype": kv_dtype, "dist": ("binomial", "geometric")[index % 2],
              "seed": 1000 + index, **extra}
    return VerifyConfig(batch_size=batch, gamma=gamma, alpha=alpha, kv_dim=kv_dim, **fields)


def _verify_cases() -> list[VerifyConfig]:
    grid = itertools.product((1, 5, 32, 33, 4096), (1, 31, 32, 33, 128, 1024), (0.0, 0.6, 1.0))
    cases = [_cfg(i, b, g, a) for i, (b, g, a) in enumerate(grid)]
    cases += [_cfg(0, 65537, 8, 0.6), _cfg(1, 65537, 1, 1.0), _cfg(2, 70000, 33, 0.9)]  # more blocks than 65,535
    # each point also in the other token dtype
    return cases + [c.replace(token_dtype="int32" if c.token_dtype == "int64" else "int64") for c in cases]


def _kv_cases() -> list[VerifyConfig]:
    grid = itertools.product((1, 4, 32, 33, 256), (1, 8, 31, 33, 128), (0.0, 0.5, 1.0), (8, 120, 128, 2048))
    cases = [_cfg(i, b, g, a, kv) for i, (b, g, a, kv) in enumerate(grid)]
    edges = [
        *(_cfg(i, b, 1024, a, kv) for i, (b, a, kv) in enumerate(itertools.product((1, 4, 32, 33), (0.9, 1.0),
                                                                                  (8, 128)))),
        *(_cfg(i, 4096, g, a, kv) for i, (g, a, kv) in enumerate(itertools.product((8, 128), (0.3, 1.0), (8, 128)))),
        # odd rows: 2, 6, 14 bytes, so sources and destinations are misaligned in every way
        *(_cfg(i, b, g, 0.7, kv) for i, (b, g, kv) in enumerate(itertools.product((3, 33), (5, 33), (1, 3, 7)))),
        # the cooperative pack driver (B > 4096) and the cooperative fused driver (large B * gamma)
        *(_cfg(i, b, g, a, kv) for i, (b, g, a, kv) in enumerate(itertools.product((4097, 8192), (1, 4), (0.5, 1.0),
                                                                                  (8, 120)))),
        _cfg(0, 256, 64, 0.8, 128), _cfg(1, 1024, 33, 0.5, 8), _cfg(2, 33, 1024, 0.95, 3),
    ]
    return cases + edges


def _case_id(cfg: VerifyConfig) -> str:
    return (f"b{cfg.batch_size}-g{cfg.gamma}-a{cfg.alpha}-kv{cfg.kv_dim}-{cfg.dist[:3]}-{cfg.token_dtype}"
            f"-{cfg.kv_dtype}")


def _impls(op: str) -> list[registry.Implementation]:
    return [registry.get(op, name) for name in CUDA_IMPLS[op]]


def _check_all(op: str, cfg: VerifyConfig) -> dict[str, str]:
    """Every CUDA implementation of op that supports cfg, on one workload; {name: first diff}."""
    workload = make_workload(op, cfg, "cuda")
    failures = {}
    for impl in _impls(op):
        if impl.unavailable_reason("cuda", cfg) is None:
            failure = parity.check(impl, workload)
            if failure is not None:
                failures[impl.name] = failure
    return failures


@pytest.mark.parametrize("cfg", _verify_cases(), ids=_case_id)
def test_verify_parity(cfg):
    assert _check_all("verify", cfg) == {}


@pytest.mark.parametrize("cfg", _kv_cases(), ids=_case_id)
def test_pack_parity(cfg):
    assert _check_all("pack", cfg) == {}


@pytest.mark.parametrize("cfg", _kv_cases(), ids=_case_id)
def test_verify_pack_parity(cfg):
    assert _check_all("verify_pack", cfg) == {}


def test_fused_single_block_refuses_more_than_32_sequences():
    cfg = VerifyConfig(33, 8, 0.5, kv_dim=8)
    assert registry.get("verify_pack", "fused_single_block").supports(cfg) is not None
    w = make_workload("verify_pack", cfg, "cuda")
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs
    from sdbench.ops.verify.cuda_impls import verify_outputs

    buffers = {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    with pytest.raises(RuntimeError, match="B <= 32"):
        cuda_ops().fused_single_block(w.draft_tokens, w.target_tokens, w.draft_kv, *buffers.values())


def test_bad_output_shape_is_a_clear_error():
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.verify.cuda_impls import verify_outputs

    w = make_workload("verify", VerifyConfig(4, 8, 0.5), "cuda")
    out = verify_outputs(w)
    with pytest.raises(RuntimeError, match="accepted_lengths must have shape"):
        cuda_ops().verify_ballot(w.draft_tokens, w.target_tokens, out["accepted_lengths"][:2], out["has_mismatch"],
                                 out["next_tokens"])


# --- sync-free and graph-capturable -------------------------------------------------------------------
# One small point and one that takes the other kernel or driver (pack_cuda: pack.cu's replicated driver up to B = 128,
# the scan kernel above; fused: the cooperative driver at large B*gamma; ballot+pack_cuda: pack.cu at any B).
SYNC_FREE_CASES = [
    ("verify", "naive", VerifyConfig(33, 128, 0.9)),
    ("verify", "ballot", VerifyConfig(33, 128, 0.9)),
    ("verify", "ballot", VerifyConfig(4096, 33, 0.5, token_dtype="int32")),
    ("pack", "pack_cuda", VerifyConfig(32, 128, 0.9, kv_dim=2048)),
    ("pack", "pack_cuda", VerifyConfig(129, 16, 0.9, kv_dim=1024)),  # the scan kernel, right above the bound
    ("pack", "pack_cuda", VerifyConfig(8192, 4, 0.5, kv_dim=120)),
    ("verify_pack", "fused_single_block", VerifyConfig(32, 128, 0.9, kv_dim=128)),
    ("verify_pack", "fused", VerifyConfig(32, 128, 0.9, kv_dim=2048)),
    ("verify_pack", "fused", VerifyConfig(33, 1024, 0.9, kv_dim=8, token_dtype="int32", kv_dtype="bfloat16")),
    ("verify_pack", "ballot+pack_cuda", VerifyConfig(32, 128, 0.9, kv_dim=512)),
    ("verify_pack", "ballot+pack_cuda", VerifyConfig(8192, 4, 0.5, kv_dim=120)),  # pack.cu's cooperative driver
]


def _sync_free_id(case) -> str:
    op, name, cfg = case
    return f"{op}-{name}-{_case_id(cfg)}"


def test_every_sync_free_implementation_is_covered():
    covered = {(op, name) for op, name, _ in SYNC_FREE_CASES}
    sync_free = {(op, name) for op, names in CUDA_IMPLS.items() for name in names if not registry.get(op, name).sync}
    assert sync_free == covered


@pytest.mark.parametrize("case", SYNC_FREE_CASES, ids=_sync_free_id)
def test_runs_under_sync_debug_error(case):
    op, name, cfg = case
    impl = registry.get(op, name)
    workload = make_workload(op, cfg, "cuda")
    run = impl.prepare(workload)
    run()  # warm-up: first-call work (module load, allocator growth) is not the steady state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert parity.compare(parity.expected_outputs(op, workload), outputs) is None


@pytest.mark.parametrize("case", SYNC_FREE_CASES, ids=_sync_free_id)
def test_graph_replay_on_fresh_inputs(case):
    op, name, cfg = case
    impl = registry.get(op, name)
    workload = make_workload(op, cfg, "cuda")
    run = impl.prepare(workload)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    fresh = make_workload(op, cfg.replace(seed=cfg.seed + 1), "cuda")
    for field in ("draft_tokens", "target_tokens", "accepted_lengths", "draft_kv"):
        if getattr(workload, field) is not None:
            getattr(workload, field).copy_(getattr(fresh, field))
    parity.poison(run.outputs)
    graph.replay()
    torch.cuda.synchronize()
    assert parity.compare(parity.expected_outputs(op, fresh), run.outputs) is None
    graph.replay()  # replaying again over its own outputs changes nothing (the scan kernels' epoch moves on alone)
    torch.cuda.synchronize()
    assert parity.compare(parity.expected_outputs(op, fresh), run.outputs) is None


# --- bad lengths and misaligned base pointers ---------------------------------------------------------
@pytest.mark.parametrize("batch", [5, 4100], ids=["replicated", "scan-and-cooperative"])
def test_pack_clamps_and_flags_lengths_outside_0_gamma(batch):
    """Lengths above γ and below 0 are clamped and flagged (sdbench.ops.input_contract), exactly as the reference
    does, by every kernel that packs given lengths: pack.cu's replicated driver (pack_cuda at B = 5), the scan
    kernel (pack_cuda above B = 128) and pack.cu's cooperative driver (B > 4096), which no registered path reaches
    with given lengths below the scan's batch limit, so it is called directly."""
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.cuda_impls import pack_kernel
    from sdbench.ops.pack.outputs import pack_outputs

    workload = make_workload("pack", VerifyConfig(batch, 4, 0.6, kv_dim=8, seed=5), "cuda")
    bad = torch.tensor([9, -3, 4, 0, 5], device="cuda")
    workload.accepted_lengths[: bad.numel()] = bad
    assert pack_kernel(workload.config) == ("pack_cuda" if batch == 5 else "pack_scan")
    for impl in _impls("pack"):
        assert parity.check(impl, workload) is None, impl.name
    expected = parity.expected_outputs("pack", workload)
    assert expected["error_flags"][:5].tolist() == [2, 2, 0, 0, 2]
    if batch > 4096:
        out = pack_outputs(workload)
        parity.poison(out, expected)
        cuda_ops().pack_flagged(workload.draft_kv, workload.accepted_lengths, out["packed_kv"], out["packed_offsets"],
                                out["error_flags"])
        assert parity.compare(expected, out) is None


@pytest.mark.parametrize("op, batch", [("pack", 33), ("verify_pack", 33), ("verify_pack", 5)])
def test_misaligned_base_pointers(op, batch):
    """draft_kv starting 2 bytes past a 16-byte boundary: the kernels take the unaligned copy path. B = 5 is
    tiny work, where `fused` runs the single-block kernel (B = 33 is past fused_single_block's reach)."""
    cfg = VerifyConfig(batch, 8, 0.7, kv_dim=8, seed=6)
    workload = make_workload(op, cfg, "cuda")
    storage = torch.empty(workload.draft_kv.numel() + 1, dtype=workload.draft_kv.dtype, device="cuda")
    shifted = storage[1:].view(workload.draft_kv.shape)
    shifted.copy_(workload.draft_kv)
    assert shifted.data_ptr() % 16 != 0
    workload = dataclasses.replace(workload, draft_kv=shifted)
    assert _check_all_on(op, workload) == {}


def _check_all_on(op: str, workload) -> dict[str, str]:
    failures = {}
    for impl in _impls(op):
        if impl.unavailable_reason("cuda", workload.config) is None:
            failure = parity.check(impl, workload)
            if failure is not None:
                failures[impl.name] = failure
    return failures


# --- compute-sanitizer -----------------------------------------------------------------------------
SANITIZER_SCRIPT = """
import sys
import torch
from sdbench import parity, registry
from sdbench.ops import make_workload
from sdbench.ops.workload import VerifyConfig
cases = [
    ("verify", "naive", VerifyConfig(5, 33, 0.6)),
    ("verify", "ballot", VerifyConfig(5, 33, 0.6, token_dtype="int32")),
    ("pack", "pack_cuda_naive", VerifyConfig(5, 33, 0.6, kv_dim=7)),
    ("pack", "pack_cuda", VerifyConfig(5, 33, 0.6, kv_dim=7)),
    ("pack", "pack_cuda", VerifyConfig(4100, 2, 0.6, kv_dim=3)),  # the scan kernel
    ("verify_pack", "fused_single_block", VerifyConfig(5, 33, 0.6, kv_dim=120)),
    ("verify_pack", "fused", VerifyConfig(5, 33, 0.6, kv_dim=7, token_dtype="int32")),
    ("verify_pack", "fused", VerifyConfig(5, 8, 0.6, kv_dim=7, token_dtype="int32")),  # tiny: the single block
    ("verify_pack", "fused", VerifyConfig(33, 1024, 0.9, kv_dim=3)),
    ("verify_pack", "ballot+pack_torch", VerifyConfig(5, 33, 0.6, kv_dim=8)),
    ("verify_pack", "ballot+pack_cuda", VerifyConfig(5, 33, 0.6, kv_dim=120)),
    ("verify_pack", "ballot+pack_cuda", VerifyConfig(4100, 2, 0.6, kv_dim=3)),  # pack.cu's cooperative driver
    ("prob_verify", "fused", VerifyConfig(3, 4, 0.6, vocab_size=1000)),
    ("prob_verify", "flashspec", VerifyConfig(3, 4, 0.6, vocab_size=1000)),
    ("prob_verify", "serial_sampler", VerifyConfig(3, 4, 0.6, vocab_size=1000)),
]
failed = 0
for op, name, cfg in cases:
    for bad in (False, True):  # bad: lengths outside [0, γ] (pack) or tokens outside [0, V) (prob_verify)
        workload = make_workload(op, cfg, "cuda")
        if bad and op == "pack":
            workload.accepted_lengths[:2] = torch.tensor([cfg.gamma + 7, -2], device="cuda")
        elif bad and op == "prob_verify":
            workload.draft_tokens[0, 1], workload.draft_tokens[1, 0] = cfg.vocab_size + 3, -3
        elif bad:
            continue
        failure = parity.check(registry.get(op, name), workload)
        print(op, name, "bad input" if bad else "", "ok" if failure is None else failure, flush=True)
        failed += failure is not None
sys.exit(1 if failed else 0)
"""

# memcheck watches every kernel (torch's poisoning and comparisons too); racecheck only sdbench's,
# whose shared-memory scans are the ones in question.
@pytest.mark.slow
@pytest.mark.parametrize("tool, extra", [("memcheck", []), ("racecheck", ["--kernel-name", "kns=sdbench"]),
                                         ("initcheck", []), ("synccheck", [])],
                         ids=["memcheck", "racecheck", "initcheck", "synccheck"])
def test_compute_sanitizer_clean(tool, extra):
    assert_sanitizer_clean(tool, SANITIZER_SCRIPT, extra)
