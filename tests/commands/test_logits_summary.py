"""logits_summary: issue #18's bars counted from logits_bench rows, checked against states written by hand."""

import csv

import pytest

from sdbench.commands.logits_summary import bar_us, floor_of, gamma_table, main, read_rows, report, summarize

FIELDS = ("design", "batch", "gamma", "vocab", "dtype", "l2", "floor_us", "gpu_us", "reason")


def _rows(state, floor, **times):
    b, gamma, vocab, dtype, l2 = state
    return [dict(design=name, batch=str(b), gamma=str(gamma), vocab=str(vocab), dtype=dtype, l2=l2,
                 floor_us=str(floor), gpu_us="" if us is None else str(us), reason="" if us is not None else "OOM")
            for name, us in times.items()]


def _grid():
    rows = []
    # a win with a floor under 5 µs: no bar
    rows += _rows((1, 4, 32000, "bfloat16", "cold"), 0.4, fused_logits=7.0, vllm_v2_style=11.0, softmax_flashinfer=90.0)
    # a win within the bar (1.3 × 10 + 3 = 16), at the speedup point: 200 / 15 = 13.3×
    rows += _rows((32, 8, 128256, "float32", "warm"), 10.0, fused_logits=15.0, vllm_v2_style=15.3,
                  softmax_flashinfer=200.0)
    # a loss and a miss (1.3 × 6 + 3 = 10.8 < 12)
    rows += _rows((32, 4, 32000, "bfloat16", "cold"), 6.0, fused_logits=12.0, vllm_v2_style=11.5,
                  softmax_flashinfer=None)
    return rows


def test_bars_are_counted_per_state():
    s = summarize(_grid())
    assert (s.states, s.lowest) == (3, 2)
    assert s.losses == [((32, 4, 32000, "bfloat16", "cold"), 12.0, "vllm_v2_style", 11.5)]
    assert s.untimed == [((32, 4, 32000, "bfloat16", "cold"), "softmax_flashinfer")]  # listed, not a win
    assert (s.within_bar, s.barred) == (1, 2) and s.by_batch == {32: [1, 2]}
    assert s.misses == [((32, 4, 32000, "bfloat16", "cold"), 12.0, 6.0)]
    assert s.flashinfer_speedups == pytest.approx([200 / 15])
    assert s.closest == ((32, 8, 128256, "float32", "warm"), 15.0, "vllm_v2_style", 15.3)  # 2%, not 57%
    assert sorted(s.peer_ratios) == pytest.approx(sorted([11 / 7, 15.3 / 15, 11.5 / 12]))
    assert bar_us(10.0) == pytest.approx(16.0)


def test_a_later_file_replaces_its_states(tmp_path):
    grid, rerun = tmp_path / "grid.csv", tmp_path / "rerun.csv"
    for path, rows in ((grid, _grid()), (rerun, _rows((32, 4, 32000, "bfloat16", "cold"), 6.0, fused_logits=10.5,
                                                       vllm_v2_style=11.5, softmax_flashinfer=95.0))):
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    s = summarize(read_rows([str(grid), str(rerun)]))
    assert (s.lowest, s.losses, s.untimed, s.within_bar) == (3, [], [], 2)  # 10.5 ≤ 10.8: within the bar now
    assert main([str(grid), str(rerun), "--gamma", "4"]) == 0


def test_gamma_table_rows_in_markdown():
    table = gamma_table(_grid(), 4).splitlines()
    assert table[0].startswith("| b | V | dtype | L2 | floor | `fused_logits` |") and len(table) == 4
    # b = 1 before b = 32; a floor under 5 µs has no ratio; a design without a time shows a dash
    assert table[2] == "| 1 | 32000 | bf16 | cold | 0.40 | **7.00** | 11.0 | — | 90.0 | — | — |"
    assert table[3] == "| 32 | 32000 | bf16 | cold | 6.00 | **12.0** | 11.5 | — | — | — | 1.11 |"



def test_one_copy_ceiling_for_every_floor(tmp_path, capsys):
    """--copy-tbps: each floor is its row's bytes at that ceiling, so a bar moves with it. Both barred states hold
    30 MB. At 3 TB/s both floors are 10 µs (bars 16): the 12 µs miss passes. At 3.75 TB/s both are 8 µs (bars
    13.4): the 15 µs pass misses, 12 still passes. Without it, each row's own floor."""
    rows = _grid()
    for row in rows:
        row["floor_bytes"] = str(round(float(row["floor_us"]) * 3e6))  # 3 TB/s: the first state's 0.4 µs
    for row in rows[3:]:
        row["floor_bytes"] = "30000000"
    assert floor_of(rows[0]) == pytest.approx(0.4) and floor_of(rows[0], 3.0) == pytest.approx(0.4)
    own = summarize(rows)
    assert (own.within_bar, own.barred) == (1, 2)
    at_3 = summarize(rows, 3.0)
    assert (at_3.within_bar, at_3.barred, at_3.misses) == (2, 2, [])
    at_375 = summarize(rows, 3.75)
    assert at_375.misses == [((32, 8, 128256, "float32", "warm"), 15.0, pytest.approx(8.0))]
    assert gamma_table(rows, 4, 3.0).splitlines()[3].endswith("| 0.75 |")  # b = 32: 12 / 16
    path = tmp_path / "grid.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=(*FIELDS, "floor_bytes"))
        writer.writeheader()
        writer.writerows(rows)
    assert main([str(path), "--copy-tbps", "3", "--gamma", "4"]) == 0
    out = capsys.readouterr().out
    assert "floors at 3 TB/s" in out and "2 of 2" in out
    with pytest.raises(SystemExit):
        main([str(path), "--copy-tbps", "0"])


def _rows_at_ceilings(tmp_path, first_tbps, rest_tbps):
    rows = _grid()
    for row in rows:
        row["copy_tbps"], row["floor_bytes"] = first_tbps, str(round(float(row["floor_us"]) * 2.948e6))
    for row in rows[3:]:
        row["copy_tbps"] = rest_tbps
    path = tmp_path / "grid.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=(*FIELDS, "copy_tbps", "floor_bytes"))
        writer.writeheader()
        writer.writerows(rows)
    return rows, path


def test_runs_ceilings_9_percent_apart_are_listed_and_flagged(tmp_path, capsys):
    """Rows floored at ceilings 9% apart (one slow copy run) are not held to one bar: the report lists each run's
    ceiling with the states it floors (our rows only, one per state), and says so."""
    rows, path = _rows_at_ceilings(tmp_path, "2.948", "2.688")
    assert summarize(rows).states_by_ceiling_tbps == {2.948: 1, 2.688: 2}
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2.688 TB/s (2), 2.948 TB/s (1)" in out and "differ by 9.7%" in out


@pytest.mark.parametrize("rest_tbps,copy_tbps", [("2.948", None), ("2.979", None), ("2.688", 3.0)])
def test_one_ceiling_or_a_fixed_one_is_not_flagged(tmp_path, rest_tbps, copy_tbps):
    """One ceiling, two within 3% (1.1%), or every floor held to --copy-tbps: listed, not flagged."""
    rows, _ = _rows_at_ceilings(tmp_path, "2.948", rest_tbps)
    text = report(summarize(rows, copy_tbps))
    assert "runs' copy ceilings" in text and "differ by" not in text
