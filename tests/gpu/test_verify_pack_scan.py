"""The single-pass kernels (csrc/verify_pack_scan.cu: fused_scan, pack_scan, ballot+pack_scan) against
the reference: bit-exact over every tile shape, sync-free, graph replays that advance the launch
epoch on the GPU, clamped bad lengths, and clean under compute-sanitizer. GPU only.

Tolerance: none. Every output is an integer, a bool or a bit copy of the KV (sdbench.parity.compare),
with outputs poisoned before every run (sdbench.parity.check).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from sanitizer import assert_sanitizer_clean

from sdbench import ext, parity, registry
from sdbench.ops import make_workload
from sdbench.ops.input_contract import LENGTH_OUT_OF_RANGE
from sdbench.ops.pack.reference import pack
from sdbench.ops.pack.scan_impls import SCAN_STATE_ELEMS, scan_state
from sdbench.ops.workload import VerifyConfig

SCAN_IMPLS = {"verify_pack": ("fused_scan", "ballot+pack_scan"), "pack": ("pack_scan",)}
DTYPE_PAIRS = (("int64", "float16"), ("int32", "bfloat16"))
TILE_BYTES = 32 * 1024  # csrc/verify_pack_scan.cu kTileBytes: slabs above it are split over blocks
EPOCH_BITS = (1 << 31) - 1  # the high word of state[0]: the epoch below kPairBit (bit 63 of the int64)


@pytest.fixture(scope="module", autouse=True)
def built_extension():
    reason = ext.unavailable_reason()
    if reason is not None:
        pytest.fail(f"the CUDA extension must build on a GPU machine: {reason}")


def _cfg(index: int, batch: int, gamma: int, alpha: float, kv_dim: int, **extra) -> VerifyConfig:
    token_dtype, kv_dtype = DTYPE_PAIRS[index % len(DTYPE_PAIRS)]
    fields = {"token_dtype": token_dtype, "kv_dtype": kv_dtype, "dist": ("binomial", "geometric")[index % 2],
              "seed": 3000 + index, **extra}
    return VerifyConfig(batch_size=batch, gamma=gamma, alpha=alpha, kv_dim=kv_dim, **fields)


def _cases() -> list[VerifyConfig]:
    # Tiles of many sequences (small slabs), one sequence (slab ~ 32 KiB), and row chunks of one sequence
    # (slab > 32 KiB, last chunk partial); γ = 1, below, at and above 32; kv_dim 8 .. 4096.
    grid = itertools.product((1, 5, 32, 257, 4096), (1, 8, 31, 33, 128), (0.3, 0.9), (8, 120, 1024, 4096))
    cases = [_cfg(i, b, g, a, kv) for i, (b, g, a, kv) in enumerate(grid)
             if b * g * kv * 2 <= 2 ** 30]  # 1 GiB of draft KV at most
    edges = [
        # B > 65,536 sequence groups' worth: tiles forced above their byte share, looping copies
        _cfg(0, 65537, 1, 0.5, 4096), _cfg(1, 65537, 3, 0.7, 64), _cfg(2, 65537, 8, 0.9, 8),
        _cfg(3, 65536, 4, 0.6, 128),
        # every sequence accepts all / none of its drafts
        *(_cfg(i, b, g, 0.5, kv, dist="fixed", fixed_length=k)
          for i, (b, g, kv, k) in enumerate([(1, 8, 128, 8), (1, 8, 128, 0), (300, 33, 1024, 33), (300, 33, 1024, 0),
                                             (4096, 4, 64, 4), (4096, 4, 64, 0), (3, 128, 4096, 128)])),
        # units narrower than 16 bytes: rows of 2, 6, 14 bytes (2-byte), 4 (4-byte), 8 and 24 (8-byte)
        *(_cfg(i, b, g, 0.7, kv) for i, (b, g, kv) in enumerate(itertools.product((3, 33, 700), (5, 33),
                                                                                  (1, 2, 3, 4, 7, 12)))),
        # a slab just over one tile: two chunks, the second a single row
        _cfg(4, 7, TILE_BYTES // 2048 + 1, 1.0, 1024), _cfg(5, 2, 2, 0.9, 16384 + 8),
        # row chunks of 2-byte units (rows of 8198 bytes): the accepted bytes' even split over a sequence's
        # chunk blocks lands mid-row
        _cfg(6, 3, 40, 0.6, 4099),
    ]
    return cases + edges


def _case_id(cfg: VerifyConfig) -> str:
    tail = f"-k{cfg.fixed_length}" if cfg.dist == "fixed" else f"-{cfg.dist[:3]}"
    return f"b{cfg.batch_size}-g{cfg.gamma}-a{cfg.alpha}-kv{cfg.kv_dim}{tail}-{cfg.token_dtype}-{cfg.kv_dtype}"


@pytest.mark.parametrize("cfg", _cases(), ids=_case_id)
def test_single_pass_parity(cfg):
    failures = {}
    for op, names in SCAN_IMPLS.items():
        workload = make_workload(op, cfg, "cuda")
        for name in names:
            failure = parity.check(registry.get(op, name), workload)
            if failure is not None:
                failures[f"{op}/{name}"] = failure
        del workload
    assert failures == {}


def test_entries_are_one_launch_and_sync_free():
    fused = registry.get("verify_pack", "fused_scan")
    assert (fused.sync, fused.launches) == (False, 1)
    assert (registry.get("pack", "pack_scan").sync, registry.get("pack", "pack_scan").launches) == (False, 1)


def test_pack_scan_clamps_bad_lengths():
    """Lengths outside [0, γ] are clamped: the rows of the clamped lengths, nothing out of bounds."""
    cfg = VerifyConfig(64, 8, 0.5, kv_dim=128)
    w = make_workload("pack", cfg, "cuda")
    bad = torch.tensor([-5, 9, 3, 1 << 40] * 16, dtype=torch.int64, device="cuda")
    w.accepted_lengths.copy_(bad)
    run = registry.get("pack", "pack_scan").prepare(w)
    parity.poison(run.outputs)
    actual = run()
    torch.cuda.synchronize()
    expected = pack(w.draft_kv, bad)  # the reference clamps and flags by the input contract
    assert parity.compare(expected, actual) is None
    assert actual["error_flags"].tolist() == [LENGTH_OUT_OF_RANGE, LENGTH_OUT_OF_RANGE, 0, LENGTH_OUT_OF_RANGE] * 16


def test_state_of_the_wrong_size_is_a_clear_error():
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs

    w = make_workload("pack", VerifyConfig(4, 8, 0.5, kv_dim=8), "cuda")
    out = pack_outputs(w)
    small = torch.zeros(SCAN_STATE_ELEMS - 1, dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="scan_state must have shape"):
        cuda_ops().pack_scan(w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"],
                             out["error_flags"], small)


def test_one_state_serves_different_grids_in_turn():
    """The last block of every launch moves the epoch on and zeroes the count of finished blocks: launches
    of different grid sizes on one state alternate without a reset, and stale flags of earlier launches
    (other epochs) are never read."""
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs

    state = scan_state("cuda")
    configs = [VerifyConfig(4096, 8, 0.6, kv_dim=128, seed=s) for s in range(3)]
    configs += [VerifyConfig(33, 128, 0.9, kv_dim=2048, seed=7), VerifyConfig(1, 8, 0.9, kv_dim=64, seed=8)]
    for cfg in configs * 2:
        w = make_workload("pack", cfg, "cuda")
        out = pack_outputs(w)
        parity.poison(out)
        cuda_ops().pack_scan(w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"],
                             out["error_flags"], state)
        torch.cuda.synchronize()
        assert parity.compare(pack(w.draft_kv, w.accepted_lengths), out) is None, cfg
    assert int(state[0]) & 0xFFFFFFFF == 0, "the count of finished blocks is back at 0 after every launch"
    assert (int(state[0]) >> 32) & EPOCH_BITS == 2 * len(configs), "one epoch per launch"


# --- tile rules ---------------------------------------------------------------------------------------------
# The tile rule's knobs (python -m sdbench.commands.scan_tiles benchmarks them) change only how the work
# is cut: one-sequence tiles, row chunks, thousands of groups (long look-back walks), tiles of 1 MiB.
TILINGS = [{}, {"tile_waves": 4}, {"tile_waves": 2, "look_back_groups": 256},
           {"tile_max_bytes": 1 << 20}, {"look_back_groups": 65536, "tile_waves": 16},
           {"tile_max_bytes": 32 * 1024, "look_back_groups": 65536},
           {"fixed_chunks": 1}, {"fixed_chunks": 1, "tile_max_bytes": 32 * 1024},
           # a chunk's first copy round loaded after the look-back: at every chunk of a one-wave grid, at none, at
           # 32 KiB chunks
           {"late_load_bytes": 1}, {"late_load_bytes": 1 << 30},
           {"late_load_bytes": 1, "tile_max_bytes": 32 * 1024},
           # tiles of 1 MiB: more accepted rows than the kernel's shift table holds (kShiftRows = 2048), so a
           # unit's source is found by the binary search over the sequences' unit ends (SearchUnitEnds); tiles of
           # 256 KiB: exactly 2048 rows below (the table's last row)
           {"tile_min_bytes": 1 << 20, "tile_max_bytes": 1 << 20},
           {"tile_min_bytes": 256 << 10, "tile_max_bytes": 256 << 10},
           # tiles of at most 32 sequences scanned in shared memory, as before session 33 (their sources from the
           # search or the shift table), not in every warp's registers
           {"scan_mode": 1}, {"scan_mode": 1, "tile_waves": 4},
           # tiles always in pairs where a pair fits its scan (the default pairs only grids of several waves, by the
           # previous launch's acceptance: test_tiles_pair_after_a_launch_that_accepted_under_half), in both scans,
           # with more groups, and never
           {"pairs": 2}, {"pairs": 2, "scan_mode": 1}, {"pairs": 2, "tile_waves": 4},
           {"pairs": 2, "tile_min_bytes": 1 << 20, "tile_max_bytes": 1 << 20}, {"pairs": 1},
           # fixed_chunks copies at most a slab per one-sequence tile, so such shapes never pair (tile_shape)
           {"pairs": 2, "fixed_chunks": 1}]
TILING_CASES = [VerifyConfig(1, 128, 0.9, kv_dim=4096), VerifyConfig(33, 31, 0.5, kv_dim=1024, token_dtype="int32"),
                VerifyConfig(4096, 8, 0.6, kv_dim=128), VerifyConfig(1024, 8, 0.3, kv_dim=4096),
                VerifyConfig(65537, 3, 0.7, kv_dim=64, dist="geometric"),
                # slabs of two copy rounds, one block each from b = SMs (132 on an H200) up; chunked below
                VerifyConfig(256, 8, 0.3, kv_dim=4096), VerifyConfig(132, 32, 0.9, kv_dim=1024),
                VerifyConfig(131, 32, 0.9, kv_dim=1024),
                # chunks of 128 KiB, which load their first copy round after the look-back by default (kLateLoadBytes);
                # then with nothing accepted, so every chunk 0 publishes and copies nothing on the late path
                VerifyConfig(256, 32, 0.3, kv_dim=4096),
                VerifyConfig(256, 32, 0.3, kv_dim=4096, dist="fixed", fixed_length=0),
                # 1,024 slabs of 1 KiB a tile at 1 MiB tiles, ~7 of 8 rows accepted: ~7,000 rows, past the shift table
                VerifyConfig(4096, 8, 0.9, kv_dim=64),
                # every row accepted: 256 slabs of 1 KiB a tile at 256 KiB tiles fill the shift table to its last row
                VerifyConfig(1024, 8, 0.5, kv_dim=64, dist="fixed", fixed_length=8),
                # the warp scan's edges on a GPU of 132 SMs (H100, H200; tile_shape_probe): tiles of 32 sequences, the
                # last of one; tiles of 33, scanned in shared memory (test_warp_scanned_tiles_find_every_source pins
                # both with tile_min_bytes, on any GPU); 32-sequence tiles accepting every row and none; two sequences of γ > 32 a tile
                VerifyConfig(16385, 4, 0.5, kv_dim=128), VerifyConfig(17000, 4, 0.5, kv_dim=64),
                VerifyConfig(16896, 4, 0.5, kv_dim=64, dist="fixed", fixed_length=4),
                VerifyConfig(16896, 4, 0.5, kv_dim=64, dist="fixed", fixed_length=0),
                VerifyConfig(1000, 130, 0.5, kv_dim=64, token_dtype="int32")]


@pytest.mark.parametrize("cfg", TILING_CASES, ids=_case_id)
def test_every_tile_rule_gives_the_reference(cfg):
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs
    from sdbench.ops.verify.cuda_impls import verify_outputs
    from sdbench.ops.verify_pack.reference import verify_pack

    w = make_workload("verify_pack", cfg, "cuda")
    expected = verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)
    packed_expected = pack(w.draft_kv, expected["accepted_lengths"])
    state = scan_state("cuda")
    for tiling in TILINGS:
        out = {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
        parity.poison(out, expected)
        cuda_ops().fused_scan(w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"],
                              out["has_mismatch"], out["next_tokens"], out["packed_kv"], out["packed_offsets"],
                              state, **tiling)
        torch.cuda.synchronize()
        assert parity.compare(expected, out) is None, (tiling, parity.compare(expected, out))
        packed = pack_outputs(w)
        parity.poison(packed, packed_expected)
        cuda_ops().pack_scan(w.draft_kv, expected["accepted_lengths"], packed["packed_kv"], packed["packed_offsets"],
                             packed["error_flags"], state, **tiling)
        torch.cuda.synchronize()
        assert parity.compare(packed_expected, packed) is None, (tiling, parity.compare(packed_expected, packed))
    assert int(state[0]) & 0xFFFFFFFF == 0, "the count of finished blocks is back at 0 after every launch"


# Tiles of at most 32 sequences scan in every warp, then find a unit's source the three ways larger tiles do: a
# search of 2-4 row ends, the shift table, or (past kShiftRows = 2048 accepted rows) the search over unit ends. The
# last needs 32 sequences of 100 rows each, all accepted (3,200 rows), in tiles of 6,400 bytes of 2-byte rows.
# tile_min_bytes fixes the tiles whatever the GPU's SM count: 32 slabs of 1 KiB a tile (the last tile of one), 33.
@pytest.mark.parametrize("cfg, tiling", [
    (VerifyConfig(65, 8, 0.5, kv_dim=64), {"tile_min_bytes": 32 * 1024}),
    (VerifyConfig(66, 8, 0.5, kv_dim=64, dist="geometric"), {"tile_min_bytes": 33 * 1024}),
    (VerifyConfig(64, 100, 0.5, kv_dim=1, dist="fixed", fixed_length=100), {"tile_min_bytes": 6400}),
    (VerifyConfig(64, 100, 0.5, kv_dim=1, dist="fixed", fixed_length=100, token_dtype="int32"),
     {"tile_min_bytes": 6400, "scan_mode": 1}),
    (VerifyConfig(96, 100, 0.9, kv_dim=1, dist="geometric"), {"tile_min_bytes": 6400}),
    (VerifyConfig(700, 33, 0.6, kv_dim=7), {}), (VerifyConfig(1000, 130, 0.5, kv_dim=64), {})],
    ids=["32-a-tile-last-of-one", "33-a-tile-block-scan", "rows-past-the-table", "rows-past-the-table-block-scan", "geometric-32-a-tile", "18-a-tile-2-byte-units",
         "2-a-tile-gamma-130"])
def test_warp_scanned_tiles_find_every_source(cfg, tiling):
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs
    from sdbench.ops.verify.cuda_impls import verify_outputs
    from sdbench.ops.verify_pack.reference import verify_pack

    w = make_workload("verify_pack", cfg, "cuda")
    expected = verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)
    out = {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    parity.poison(out, expected)
    cuda_ops().fused_scan(w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"], out["has_mismatch"],
                          out["next_tokens"], out["packed_kv"], out["packed_offsets"], scan_state("cuda"), **tiling)
    torch.cuda.synchronize()
    assert parity.compare(expected, out) is None, parity.compare(expected, out)
    packed_expected = pack(w.draft_kv, expected["accepted_lengths"])
    packed = pack_outputs(w)
    parity.poison(packed, packed_expected)
    cuda_ops().pack_scan(w.draft_kv, expected["accepted_lengths"], packed["packed_kv"], packed["packed_offsets"],
                         packed["error_flags"], scan_state("cuda"), **tiling)
    torch.cuda.synchronize()
    assert parity.compare(packed_expected, packed) is None, parity.compare(packed_expected, packed)


@pytest.mark.parametrize("knob, value", [("tile_waves", 2 ** 62), ("tile_waves", -1), ("tile_max_bytes", 2 ** 41),
                                         ("tile_min_bytes", -5), ("look_back_groups", 65537),
                                         ("fixed_chunks", 2), ("late_load_bytes", -1), ("scan_mode", 2),
                                         ("pairs", 3), ("pairs", -1)])
def test_tile_knobs_out_of_range_are_a_clear_error(knob, value):
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs

    w = make_workload("pack", VerifyConfig(4, 8, 0.5, kv_dim=8), "cuda")
    out = pack_outputs(w)
    with pytest.raises(RuntimeError, match=f"{knob} must be in"):
        cuda_ops().pack_scan(w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"],
                             out["error_flags"], scan_state("cuda"), **{knob: value})


def test_the_api_runs_the_scan_kernels_into_its_own_buffers():
    import sdbench

    w = make_workload("pack", VerifyConfig(300, 8, 0.6, kv_dim=128), "cuda")
    got = sdbench.pack(w.draft_kv, w.accepted_lengths, impl="pack_scan")
    assert parity.compare(pack(w.draft_kv, w.accepted_lengths), got) is None
    v = make_workload("verify_pack", VerifyConfig(300, 8, 0.6, kv_dim=128), "cuda")
    from sdbench.ops.verify_pack.reference import verify_pack

    expected = verify_pack(v.draft_tokens, v.target_tokens, v.draft_kv)
    for impl in ("fused", "fused_scan", "ballot+pack_scan"):
        assert parity.compare(expected, sdbench.verify_pack(v.draft_tokens, v.target_tokens, v.draft_kv,
                                                            impl=impl)) is None, impl


def test_a_state_made_during_capture_is_the_graphs_own():
    """An engine capturing sdbench.verify_pack prepares inside the capture: the state made there is zeroed
    by the graph's own fill and is not cached for the capture stream's handle."""
    import sdbench
    from sdbench.ops.pack import scan_impls as pack_scan_impls
    from sdbench.ops.verify_pack.reference import verify_pack

    v = make_workload("verify_pack", VerifyConfig(300, 8, 0.6, kv_dim=128, seed=11), "cuda")
    expected = verify_pack(v.draft_tokens, v.target_tokens, v.draft_kv)
    sdbench.verify_pack(v.draft_tokens, v.target_tokens, v.draft_kv, impl="fused")  # warm-up, default stream
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    key = (torch.cuda.current_device(), stream.cuda_stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        got = sdbench.verify_pack(v.draft_tokens, v.target_tokens, v.draft_kv, impl="fused")
    assert key not in pack_scan_impls._STREAM_STATES, "a state made during capture must not be cached"
    for _ in range(3):
        parity.poison(got, expected)
        graph.replay()
        torch.cuda.synchronize()
        assert parity.compare(expected, got) is None


# --- tiles in pairs -----------------------------------------------------------------------------------------
# By default a grid of several waves of tiles at the cap takes its tiles in pairs when the launch before on the same
# state accepted under half its rows: the last block sets bit 63 of state[0] (kPairBit), and the next launch reads it
# with its epoch. tile_max_bytes = 32 KiB (the least: the cap is whole copy rounds) makes such a grid small: 16,384
# slabs of 2 KiB, 16 a tile, 1,024 tiles of 32 KiB, more than one wave on a GPU of fewer than 256 SMs. A paired
# launch leaves the pair's first group's status word AGGREGATE (only the pair's second is made INCLUSIVE); an
# unpaired one makes every group's word INCLUSIVE.
# The last block polls the last group's INCLUSIVE word until it carries this launch's epoch (finish_block), so the
# bit it leaves is exact, and the checks below assert it exactly.
PAIRED_TILES = {"tile_max_bytes": 32 * 1024}
PAIR_BIT = 1 << 63
PAIRED_GROUPS = 1024


def _skip_unless_the_grid_is_several_waves() -> None:
    # kBlocksPerSm = 4 resident blocks a SM: 1,024 tiles are more than one wave below 256 SMs
    if torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count * 4 >= PAIRED_GROUPS:
        pytest.skip("1,024 tiles are one wave or less on this GPU, so the tile rule pairs none by default")


def _status_flags(state: torch.Tensor, groups: int) -> set[int]:
    return {(int(word) >> 32) & 3 for word in state[1:1 + groups].tolist()}


def _launch(op: str, w, state, tiling) -> dict:
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs
    from sdbench.ops.verify.cuda_impls import verify_outputs

    if op == "verify_pack":
        out = {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
        parity.poison(out)
        cuda_ops().fused_scan(w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"],
                              out["has_mismatch"], out["next_tokens"], out["packed_kv"], out["packed_offsets"],
                              state, **tiling)
    else:
        out = pack_outputs(w)
        parity.poison(out)
        cuda_ops().pack_scan(w.draft_kv, w.accepted_lengths, out["packed_kv"], out["packed_offsets"],
                             out["error_flags"], state, **tiling)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("op", ["verify_pack", "pack"])
def test_tiles_pair_after_a_launch_that_accepted_under_half(op):
    """Launch after launch on one state, each checked against the reference: the bit follows the launch before
    (nothing accepted, then 30% and 90% of rows), a launch pairs exactly when the bit was set as it started (read from
    the status words it leaves), and `pairs=1` never pairs though it still sets the bit for the next."""
    _skip_unless_the_grid_is_several_waves()
    state = scan_state("cuda")
    groups = PAIRED_GROUPS
    fixed = {"dist": "fixed", "alpha": 0.5}
    steps = [(VerifyConfig(16384, 8, kv_dim=128, fixed_length=0, **fixed), {}, False),  # a fresh state: no bit
             (VerifyConfig(16384, 8, 0.3, kv_dim=128, seed=1), {}, True),  # nothing accepted before
             (VerifyConfig(16384, 8, 0.9, kv_dim=128, seed=2), {}, True),  # ~30% before
             (VerifyConfig(16384, 8, 0.3, kv_dim=128, seed=3), {}, False),  # ~90% before
             (VerifyConfig(16384, 8, 0.3, kv_dim=128, seed=4), {"pairs": 1}, False),  # never, though ~30% before
             (VerifyConfig(16384, 8, kv_dim=128, fixed_length=8, **fixed), {}, True),  # ~30% before
             (VerifyConfig(16384, 8, kv_dim=128, fixed_length=4, **fixed), {}, False),  # all before
             (VerifyConfig(16384, 8, kv_dim=128, fixed_length=3, **fixed), {}, False),  # half before: not under
             (VerifyConfig(16384, 8, kv_dim=128, fixed_length=0, **fixed), {}, True)]  # 3 of 8 before
    for launch, (cfg, knobs, pairs) in enumerate(steps):
        w = make_workload(op, cfg, "cuda")
        started_with_bit = bool(int(state[0]) & PAIR_BIT)
        out = _launch(op, w, state, {**PAIRED_TILES, **knobs})
        expected = parity.expected_outputs(op, w)
        assert parity.compare(expected, out) is None, (launch, parity.compare(expected, out))
        flags = _status_flags(state, groups)
        assert flags == ({1, 2} if pairs else {2}), (launch, started_with_bit, flags)
        assert started_with_bit == (pairs or "pairs" in knobs), launch
        last = expected["accepted_lengths"][-1] if op == "verify_pack" else w.accepted_lengths[-1].clamp(0, cfg.gamma)
        rows = int(expected["packed_offsets"][-1]) + int(last)
        assert bool(int(state[0]) & PAIR_BIT) == (2 * rows < cfg.batch_size * cfg.gamma), launch
        assert (int(state[0]) >> 32) & EPOCH_BITS == launch + 1 and int(state[0]) & 0xFFFFFFFF == 0, launch


def test_paired_graph_replays_follow_the_replay_before():
    """A CUDA graph of one fused_scan launch replayed over inputs that alternate low and high acceptance: each replay
    pairs or not by the replay before (the bit moves on the GPU, no host in the loop), and every replay's outputs are
    the reference's."""
    from sdbench.ops.backends import cuda_ops
    from sdbench.ops.pack.outputs import pack_outputs
    from sdbench.ops.verify.cuda_impls import verify_outputs

    _skip_unless_the_grid_is_several_waves()
    cfg = VerifyConfig(16384, 8, 0.3, kv_dim=128)
    workload = make_workload("verify_pack", cfg, "cuda")
    sources = [make_workload("verify_pack", cfg.replace(seed=9 + i, alpha=alpha), "cuda")
               for i, alpha in enumerate((0.2, 0.95, 0.95, 0.2, 0.2, 0.95))]
    state = scan_state("cuda")
    out = {**verify_outputs(workload), **pack_outputs(workload, error_flags=False)}
    args = (workload.draft_tokens, workload.target_tokens, workload.draft_kv, out["accepted_lengths"],
            out["has_mismatch"], out["next_tokens"], out["packed_kv"], out["packed_offsets"], state)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        cuda_ops().fused_scan(*args, **PAIRED_TILES)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda_ops().fused_scan(*args, **PAIRED_TILES)
    previous_low = True  # the launch before the capture: α = 0.3, ~30% of rows
    for source in sources:
        _load_inputs(workload, source)
        parity.poison(out)
        started_with_bit = bool(int(state[0]) & PAIR_BIT)
        graph.replay()
        torch.cuda.synchronize()
        assert parity.compare(parity.expected_outputs("verify_pack", source), out) is None
        assert _status_flags(state, PAIRED_GROUPS) == ({1, 2} if started_with_bit else {2})
        assert started_with_bit == previous_low
        previous_low = source.config.alpha < 0.5


# --- sync-free and graph replay ------------------------------------------------------------------------
# Many groups (look-back chains), row chunks of few sequences, and tiles forced past their byte share.
STREAM_CASES = [
    ("verify_pack", "fused_scan", VerifyConfig(4096, 8, 0.6, kv_dim=128)),
    ("verify_pack", "fused_scan", VerifyConfig(32, 128, 0.9, kv_dim=2048, token_dtype="int32", kv_dtype="bfloat16")),
    ("verify_pack", "fused_scan", VerifyConfig(65537, 3, 0.7, kv_dim=64)),
    ("verify_pack", "ballot+pack_scan", VerifyConfig(256, 8, 0.9, kv_dim=1024)),
    ("pack", "pack_scan", VerifyConfig(4096, 8, 0.6, kv_dim=128)),
    ("pack", "pack_scan", VerifyConfig(1, 128, 0.9, kv_dim=4096)),
]


def _stream_id(case) -> str:
    op, name, cfg = case
    return f"{op}-{name}-b{cfg.batch_size}-g{cfg.gamma}-kv{cfg.kv_dim}"


@pytest.mark.parametrize("case", STREAM_CASES, ids=_stream_id)
def test_runs_under_sync_debug_error(case):
    op, name, cfg = case
    workload = make_workload(op, cfg, "cuda")
    run = registry.get(op, name).prepare(workload)
    run()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert parity.compare(parity.expected_outputs(op, workload), outputs) is None


def _load_inputs(workload, source) -> None:
    for field in ("draft_tokens", "target_tokens", "accepted_lengths", "draft_kv"):
        if getattr(workload, field) is not None:
            getattr(workload, field).copy_(getattr(source, field))


@pytest.mark.parametrize("case", STREAM_CASES, ids=_stream_id)
def test_graph_replays_advance_the_epoch(case):
    """Replays alternate between two inputs with different lengths: a flag left by the previous replay
    (same grid, same groups) would hand out that replay's offsets, so each must read only its own."""
    op, name, cfg = case
    workload = make_workload(op, cfg, "cuda")
    first = make_workload(op, cfg.replace(seed=cfg.seed + 1), "cuda")
    second = make_workload(op, cfg.replace(seed=cfg.seed + 2, alpha=1.0 - cfg.alpha / 2), "cuda")
    run = registry.get(op, name).prepare(workload)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    for source in (first, second, first, second):
        _load_inputs(workload, source)
        parity.poison(run.outputs)
        graph.replay()
        torch.cuda.synchronize()
        assert parity.compare(parity.expected_outputs(op, source), run.outputs) is None
    snapshot = {key: value.clone() for key, value in run.outputs.items()}
    graph.replay()  # twice on the same inputs: identical outputs
    torch.cuda.synchronize()
    for key, value in snapshot.items():
        assert torch.equal(run.outputs[key], value), key


# --- compute-sanitizer ---------------------------------------------------------------------------------
SANITIZER_SCRIPT = """
import sys
from sdbench import parity, registry
from sdbench.ops import make_workload
from sdbench.ops.input_contract import LENGTH_OUT_OF_RANGE
from sdbench.ops.workload import VerifyConfig
cases = [
    ("verify_pack", "fused_scan", VerifyConfig(5, 33, 0.6, kv_dim=7, token_dtype="int32")),
    ("verify_pack", "fused_scan", VerifyConfig(3, 40, 0.9, kv_dim=1024)),
    ("verify_pack", "fused_scan", VerifyConfig(20000, 2, 0.6, kv_dim=64)),
    ("verify_pack", "ballot+pack_scan", VerifyConfig(33, 8, 0.6, kv_dim=120)),
    ("pack", "pack_scan", VerifyConfig(5, 33, 0.6, kv_dim=3)),
    ("pack", "pack_scan", VerifyConfig(20000, 2, 0.6, kv_dim=64)),
    # tiles of <= 32 sequences scanned in every warp: 32 a tile (the last of one), and 18 of 2-byte units
    ("verify_pack", "fused_scan", VerifyConfig(16385, 4, 0.5, kv_dim=128)),
    ("pack", "pack_scan", VerifyConfig(700, 33, 0.6, kv_dim=7)),
]
failed = 0
for op, name, cfg in cases:
    failure = parity.check(registry.get(op, name), make_workload(op, cfg, "cuda"))
    print(op, name, "ok" if failure is None else failure, flush=True)
    failed += failure is not None
# tiles in pairs (pairs=2): a pair's first block verifies and copies both tiles, the second block leaves
from sdbench.ops.backends import cuda_ops
from sdbench.ops.pack.outputs import pack_outputs
from sdbench.ops.pack.scan_impls import scan_state
from sdbench.ops.verify.cuda_impls import verify_outputs
for cfg in (VerifyConfig(1000, 8, 0.3, kv_dim=64), VerifyConfig(333, 33, 0.3, kv_dim=16)):
    w = make_workload("verify_pack", cfg, "cuda")
    out = {**verify_outputs(w), **pack_outputs(w, error_flags=False)}
    parity.poison(out)
    cuda_ops().fused_scan(w.draft_tokens, w.target_tokens, w.draft_kv, out["accepted_lengths"], out["has_mismatch"],
                          out["next_tokens"], out["packed_kv"], out["packed_offsets"], scan_state("cuda"), pairs=2)
    failure = parity.compare(parity.expected_outputs("verify_pack", w), out)
    print("verify_pack fused_scan pairs=2", cfg.batch_size, "ok" if failure is None else failure, flush=True)
    failed += failure is not None
sys.exit(1 if failed else 0)
"""

def test_scan_tiles_times_every_name_on_every_copy_of_a_point(tmp_path):
    """`scan_tiles --placements 2`: every name timed on both copies of the workload (each variant checked against the
    reference on each copy inside the tool), folded into a median over the copies and their [min, max]."""
    import json

    from sdbench.commands import scan_tiles

    out = tmp_path / "tiles.json"
    assert scan_tiles.main(["--points", "64:4:0.6:128", "--variants", "default,t64", "--placements", "2",
                            "--iters", "3", "--l2", "warm", "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    names = {"fused", "ballot+pack_cuda", "ballot+pack_scan", "fused_scan[default]", "fused_scan[t64]"}
    assert row["placements"] == 2 and row["gpu_uuid"] and set(row["gpu_us"]) == names | {"launch floor"}
    assert set(row["gpu_by_copy_us"]) == {f"{name}#{copy}" for name in names for copy in (0, 1)} | {"launch floor"}
    for name, (low, high) in row["gpu_spread_us"].items():
        copies = [value for key, value in row["gpu_by_copy_us"].items() if key.rpartition("#")[0] == name]
        assert low <= row["gpu_us"][name] <= high and (name == "launch floor" or [low, high] == sorted(copies))


def test_scan_tiles_times_a_point_on_the_copies_that_fit_and_keeps_finished_points(tmp_path, monkeypatch, capsys):
    """A copy that runs out of memory leaves the point timed on the copies before it (its row says how many), a point
    whose reference does not fit is skipped, and --out holds every finished point when a later one stops the tool."""
    import json

    from sdbench.commands import scan_tiles

    real = scan_tiles.make_workload
    calls = []

    def make_workload(op, cfg, device):
        calls.append(cfg.batch_size)
        if cfg.batch_size == 64 and calls.count(64) == 3:  # the reference, copy 0, then copy 1 runs out
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")
        if cfg.batch_size == 48:  # not even the reference fits
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")
        if cfg.batch_size == 32:
            raise RuntimeError("planted stop at the last point")
        return real(op, cfg, device)

    monkeypatch.setattr(scan_tiles, "make_workload", make_workload)
    out = tmp_path / "tiles.json"
    with pytest.raises(RuntimeError, match="planted stop"):
        scan_tiles.main(["--points", "64:4:0.6:128,48:4:0.6:128,32:4:0.6:128", "--placements", "3", "--iters", "3",
                         "--l2", "warm", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "64:4:0.6:128: 1 of 3 copies of the workload fit this GPU's memory: timed on those" in printed
    assert "48:4:0.6:128: the workload does not fit this GPU's memory: skipped" in printed
    (row,) = json.loads(out.read_text())
    assert row["batch"] == 64 and row["placements"] == 1 and "gpu_spread_us" not in row
    assert set(row["gpu_us"]) == {"fused", "ballot+pack_cuda", "ballot+pack_scan", "fused_scan[default]", "launch floor"}


@pytest.mark.slow
@pytest.mark.parametrize("tool, extra", [("memcheck", []), ("racecheck", ["--kernel-name", "kns=scan_pack_kernel"])],
                         ids=["memcheck", "racecheck"])
def test_compute_sanitizer_clean(tool, extra):
    assert_sanitizer_clean(tool, SANITIZER_SCRIPT, extra)
