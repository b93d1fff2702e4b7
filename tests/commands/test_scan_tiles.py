"""The scan_tiles benchmark's variant and point parsers (the GPU timing itself runs on a GPU only)."""

import pytest
import torch

from sdbench.commands import scan_tiles
from sdbench.ops.workload import VerifyConfig


def test_variants_map_to_the_kernels_tile_rule_keywords():
    assert scan_tiles.tiling("default") == {}
    assert scan_tiles.tiling("w2+t1024+m8+g512") == {
        "tile_waves": 2, "tile_max_bytes": 1 << 20, "tile_min_bytes": 8192, "look_back_groups": 512}
    assert scan_tiles.tiling("f1+t64") == {"fixed_chunks": 1, "tile_max_bytes": 65536}
    assert scan_tiles.tiling("l64+t512") == {"late_load_bytes": 65536, "tile_max_bytes": 512 * 1024}
    assert scan_tiles.tiling("b1+w2") == {"scan_mode": 1, "tile_waves": 2}
    assert scan_tiles.tiling("p1") == {"pairs": 1}
    assert scan_tiles.tiling("p2+t512") == {"pairs": 2, "tile_max_bytes": 512 * 1024}


@pytest.mark.parametrize("bad", ["x4", "w", "w0", "t-1", "g1.5", "f2", "f", "l", "l0", "b", "b0", "b2",
                                 "p", "p0", "p3"])
def test_unknown_variant_parts_are_refused(bad):
    with pytest.raises(ValueError, match="unknown variant part"):
        scan_tiles.tiling(bad)


def test_points_are_the_scale_grids_workloads():
    assert scan_tiles.parse_points("1024:32:0.9:1024,1:8:0.3:64") == [
        VerifyConfig(batch_size=1024, gamma=32, alpha=0.9, kv_dim=1024), VerifyConfig(1, 8, 0.3, kv_dim=64)]


@pytest.mark.parametrize("views", ["bogus", "gpu,cpu", ""])
def test_unknown_views_are_refused_before_any_gpu_work(views, capsys):
    with pytest.raises(SystemExit):
        scan_tiles.main(["--points", "1:4:0.5:64", "--views", views])
    assert "--views takes some of wall,graph,gpu" in capsys.readouterr().err


def test_copies_fold_into_their_names_median_and_spread():
    """--placements: each name's per-copy medians become their median and [min, max]; an untagged name (the launch
    floor, or every name with one placement) is its own; a '#' that is not a copy tag stays in the name."""
    medians = {"fused#0": 15.6, "fused#1": 14.6, "fused#2": 16.1, "fused_scan[t64]#0": 15.0, "fused_scan[t64]#1": 15.5,
               "fused_scan[t64]#2": 15.2, "launch floor": 0.6, "odd#name": 1.0}
    folded, spread = scan_tiles.over_placements(medians)
    assert folded == {"fused": 15.6, "fused_scan[t64]": 15.2, "launch floor": 0.6, "odd#name": 1.0}
    assert spread["fused"] == (14.6, 16.1) and spread["fused_scan[t64]"] == (15.0, 15.5)
    assert spread["launch floor"] == (0.6, 0.6)
    one = {"fused": 2.0, "ballot+pack_cuda": 3.0, "launch floor": 0.5}
    assert scan_tiles.over_placements(one)[0] == one  # one placement: the rows read as before


def test_a_name_carries_its_copy_only_when_there_are_several():
    assert [scan_tiles.placement_tag(copy, 3) for copy in range(3)] == ["#0", "#1", "#2"]
    assert scan_tiles.placement_tag(0, 1) == ""


@pytest.mark.parametrize("placements", ["0", "-2"])
def test_placements_must_be_at_least_one(placements, capsys):
    with pytest.raises(SystemExit):
        scan_tiles.main(["--points", "1:4:0.5:64", "--placements", placements])
    assert "--placements takes a count of at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("wanted, fits, kept", [(4, 4, 4), (4, 2, 2), (4, 0, 0), (1, 3, 1)])
def test_copies_stop_at_the_first_that_runs_out_of_memory(wanted, fits, kept):
    """--placements N where fewer copies fit: the tool keeps those that did (a point none fits is skipped), and asks
    for no copy past the first that failed."""
    calls = []

    def build():
        calls.append(len(calls))
        if len(calls) > fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (planted)")
        return len(calls) - 1

    assert scan_tiles.copies_that_fit(wanted, build) == list(range(kept))
    assert len(calls) == min(wanted, fits + 1)


def test_copies_let_other_errors_through():
    def build():
        raise ValueError("not a memory error")

    with pytest.raises(ValueError):
        scan_tiles.copies_that_fit(2, build)
