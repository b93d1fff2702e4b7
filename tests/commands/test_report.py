"""sdbench report: tables, plots, --compare and one-line errors, on the CPU fixture and synthetic GPU rows.

tests/fixtures/cpu-sweep.parquet is a real CPU sweep (torch_eager and serial_triton under
TRITON_INTERPRET=1; see tests/fixtures/README.md). Synthetic rows plant GPU-like behaviour whose
tables are known in advance: ballot is 200 / 19.5 = 10.26× faster than torch_eager in wall time.
"""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from sdbench.cli import app
from sdbench.commands import report
from sdbench.commands.report import compare, page
from sdbench.errors import SdbenchError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import synthetic_results  # noqa: E402

pytest.importorskip("polars")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "cpu-sweep.parquet"
runner = CliRunner()


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return synthetic_results.write(tmp_path_factory.mktemp("gpu") / "part-0.parquet", synthetic_results.make_rows())


@pytest.fixture(scope="module")
def gpu_report(gpu_results):
    return report.build_report([gpu_results])


def _table(built: report.Report, title_start: str) -> report.ReportTable:
    return next(table for table in built.tables if table.title.startswith(title_start))


def _column(table: report.ReportTable, name: str) -> list[str]:
    return [row[table.columns.index(name)] for row in table.rows]


# --- the CPU fixture --------------------------------------------------------------------------
def test_fixture_is_small_and_real():
    assert FIXTURE.stat().st_size < 200_000
    table = pq.read_table(FIXTURE)
    assert set(table.column("device").to_pylist()) == {"cpu"}


def test_fixture_latency_table_holds_its_implementations_and_speedups():
    built = report.build_report([FIXTURE])
    assert built.views == ["cpu"] and built.primary_view == "cpu"
    latency = _table(built, "Median latency")
    assert {"torch_eager", "serial_triton"} <= set(_column(latency, "impl"))
    # serial_triton's speedup vs torch_eager, recomputed from the parquet by hand.
    rows = [row for row in pq.read_table(FIXTURE).to_pylist() if row["status"] == "ok" and row["op"] == "verify"]
    medians = {(r["batch_size"], r["gamma"], r["alpha"], r["impl"]): r["median_us"] for r in rows}
    ratios = [medians[(b, g, a, "torch_eager")] / medians[(b, g, a, "serial_triton")]
              for (b, g, a, impl) in medians if impl == "serial_triton"]
    summary = _table(built, "Summary")
    row = next(r for r in summary.rows if r[:2] == ["verify", "serial_triton"])
    assert row[summary.columns.index("vs torch_eager")] == report.format_ratio(math.exp(np.mean(np.log(ratios))))
    assert row[summary.columns.index("configs")] == str(len(ratios))


def test_fixture_degrades_gracefully_and_says_what_is_missing():
    built = report.build_report([FIXTURE])
    assert any("no wall/graph/gpu" in note for note in _table(built, "Median latency").notes)
    assert any("no naive / ballot" in note for note in _table(built, "α-sensitivity").notes)
    assert any("needs verify_pack rows of a fused kernel" in note for note in _table(built, "Fused").notes)
    assert any("needs wall and gpu views" in note for note in _table(built, "What limited").notes)
    assert "verify/ballot, naive, torch_compile, torch_compile_ro: unavailable at 12 configs (needs a CUDA device)" in (
        built.notes)


def test_failures_are_one_line_each_naming_their_implementations_configs_and_a_short_reason(tmp_path):
    """Implementations that failed at the same configs for the same reason are one line that names them all,
    the configs (when few) and the reason's first sentences; any other set of configs or reason is its own line."""
    long_reason = ("building the workload raised OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 GiB. "
                   + "GPU 0 has a total capacity of 139.80 GiB of which 11.11 GiB is free. " * 8)
    rows = synthetic_results.make_rows()
    for row in rows:
        pack = row["op"] == "verify_pack" and row["impl"] in ("fused_single_block", "ballot+pack_torch")
        if pack and row["batch_size"] == 32 and row["gamma"] == 128 and row["kv_dim"] == 2048 and row["alpha"] < 0.5:
            row.update(status="error", reason=long_reason, median_us=None, samples_us=None)
        if row["op"] == "verify" and row["impl"] == "naive" and row["gamma"] == 8:
            row.update(status="unavailable", reason="needs a GPU", median_us=None, samples_us=None)
    built = report.build_report([synthetic_results.write(tmp_path / "part-0.parquet", rows)])
    failed = [note for note in built.notes if " at " in note and "config" in note]
    assert len(failed) == 2, built.notes
    oom = next(note for note in failed if note.startswith("verify_pack/"))
    assert oom == ("verify_pack/ballot+pack_torch, fused_single_block: error at 1 config: b=32 γ=128 α=0.3 kv=2048 "
                   "warm L2 (building the workload raised OutOfMemoryError: CUDA out of memory. Tried to allocate "
                   "64.00 GiB. …)")
    naive = next(note for note in failed if note.startswith("verify/"))
    # six configs (two batches, three α, one γ): more than FAILED_CONFIGS_NAMED, so counted, not named
    assert naive == "verify/naive: unavailable at 6 configs (needs a GPU)"


def test_one_config_swept_with_two_settings_is_two_labelled_rows(tmp_path):
    """A folder holding one config swept once plainly and once with other settings and --placements (another config
    key, by design; with the same settings but placements the copies would supersede the plain rows): its two cells
    are told apart by their settings in the latency table."""
    rows = synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,), kv_dims=(128,))
    plain = [{**row, "settings": "warmup=5 iters=40"} for row in rows]
    copied = [{**row, "settings": "warmup=5 iters=80 placements=2", "placement": copy, "run_id": "b"}
              for row in rows for copy in (0, 1)]
    built = report.build_report([synthetic_results.write(tmp_path / "part-0.parquet", plain + copied)])
    labels = _column(_table(built, "Median latency"), "config")
    pack = {label for label in labels if "kv=128" in label}  # verify_pack's cells (verify's have no kv)
    assert pack == {"b=4 γ=8 α=0.3 kv=128 settings=warmup=5 iters=40",
                    "b=4 γ=8 α=0.3 kv=128 settings=warmup=5 iters=80 placements=2"}, labels


def test_failed_configs_that_differ_beyond_b_gamma_alpha_and_kv_say_how(tmp_path):
    """Two failed configs alike in b, γ, α, kv and L2 but not in dtype: each named with its kv_dtype, so the two
    names differ."""
    rows = [row for row in synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,), kv_dims=(128,))
            if row["op"] == "verify_pack"]
    rows += [{**row, "kv_dtype": "bfloat16"} for row in rows]
    for row in rows:
        if row["impl"] == "fused_single_block":
            row.update(status="error", reason="no room", median_us=None, samples_us=None)
    built = report.build_report([synthetic_results.write(tmp_path / "part-0.parquet", rows)])
    assert ("verify_pack/fused_single_block: error at 2 configs: b=4 γ=8 α=0.3 kv=128 warm L2 kv_dtype=bfloat16; "
            "b=4 γ=8 α=0.3 kv=128 warm L2 kv_dtype=float16 (no room)") in built.notes


def test_copies_of_a_workload_are_one_cell_and_a_note_gives_their_widest_spread(tmp_path):
    """sweep --placements: the copies' rows are one cell (the median of their medians) and one note says how many
    copies and where they came furthest apart; results without copies get no such note."""
    rows = synthetic_results.make_rows(batch_sizes=(32,), gammas=(8,), alphas=(0.6,), kv_dims=(128,))
    # copy c of every row at (1 + 0.05 c) x its median; ballot's third wall copy at 1.3 x: (1.3 - 1) / 1.05, the widest
    copies = []
    for row in rows:
        for copy in range(3):
            scale = 1.3 if (row["impl"], row["view"], copy) == ("ballot", "wall", 2) else 1.0 + 0.05 * copy
            copies.append({**row, "placement": copy, "median_us": row["median_us"] * scale,
                           "samples_us": [value * scale for value in row["samples_us"]]})
    built = report.build_report([synthetic_results.write(tmp_path / "part-0.parquet", copies)])
    (note,) = [note for note in built.notes if "copies of the workload" in note]
    assert note.startswith("2 configs timed on 3 copies of the workload each (sweep --placements)")  # verify, verify_pack
    assert "widest spread is 28.6% of their median, ballot at b=32 γ=8 α=0.6 warm L2 (wall view: 19.5–25.4 µs)" in note
    (ballot,) = [cell for cell in built.cells if cell.impl == "ballot"]
    plain = report.build_report([synthetic_results.write(tmp_path / "one" / "part-0.parquet", rows)])
    (alone,) = [cell for cell in plain.cells if cell.impl == "ballot"]
    assert ballot.median("wall") == pytest.approx(alone.median("wall") * 1.05)  # the middle of 1, 1.05 and 1.3
    assert not any("copies of the workload" in note for note in plain.notes)


def test_fused_table_gives_the_ratio_copy_by_copy_when_configs_have_copies(tmp_path):
    """sweep --placements: beside the ratio of the medians, the fused kernel over the best two-step on each copy (copy c
    of each), whose range shows a bar that one copy crosses and the median does not."""
    models = {("verify_pack", "fused"): lambda c, v: 5.0, ("verify_pack", "ballot+pack_cuda"): lambda c, v: 5.0,
              ("verify_pack", "ballot+pack_scan"): lambda c, v: 7.0}
    rows = synthetic_results.make_rows(models, batch_sizes=(4,), gammas=(8,), alphas=(0.9,), kv_dims=(128,),
                                       views=("gpu",))
    scales = {"fused": (1.0, 1.1, 1.2), "ballot+pack_cuda": (1.0, 1.0, 1.05), "ballot+pack_scan": (1.0, 0.5, 1.0),
              "launch_floor": (1.0, 1.0, 1.0)}
    copies = [{**row, "placement": copy, "median_us": row["median_us"] * scales[row["impl"]][copy]}
              for row in rows for copy in range(3)]
    table = _table(report.build_report([synthetic_results.write(tmp_path / "part.parquet", copies)]), "Fused vs")
    # copy by copy the best two-step is 5.0, 3.5 (ballot+pack_scan's copy 1) and 5.25: fused 5.0 / 5.0, 5.5 / 3.5, 6.0 / 5.25
    assert _column(table, "fused / two-step by copy") == [f"1.00–{5.5 / 3.5:.2f}×"]
    assert _column(table, "fused / two-step") == [f"{5.5 / 5.0:.2f}×"]  # medians: 5.5 against ballot+pack_cuda's 5.0
    plain = report.build_report([synthetic_results.write(tmp_path / "plain" / "part.parquet", rows)])
    assert "fused / two-step by copy" not in _table(plain, "Fused vs").columns


def test_a_config_timed_again_on_copies_is_read_from_the_copies_only(tmp_path):
    """A plain sweep, then `sweep --placements 3` of one of its configs into the same results: that config is one cell
    from the copies' rows (not two configs, not pooled with the plain rows), and a note says so."""
    models = {("verify_pack", "fused"): lambda c, v: 5.0, ("verify_pack", "ballot+pack_cuda"): lambda c, v: 6.0}
    grid = dict(batch_sizes=(4, 32), gammas=(8,), alphas=(0.9,), kv_dims=(128,), views=("gpu",))
    plain = [{**row, "settings": "warmup=5 iters=40"} for row in synthetic_results.make_rows(models, **grid)]
    copies = [{**row, "settings": "warmup=5 iters=40 placements=3", "placement": copy, "run_id": "b",
               "median_us": row["median_us"] * (2.0 if row["impl"] == "fused" else 1.0)}
              for row in plain if row["batch_size"] == 4 for copy in range(3)]
    folder = tmp_path / "results"
    synthetic_results.write(folder / "part-a.parquet", plain)
    synthetic_results.write(folder / "part-b.parquet", copies)
    built = report.build_report([folder])
    assert ("1 config timed on one copy and again on several (sweep --placements, the same settings otherwise): the "
            "copies' rows stand for it, the one-copy rows are left out") in built.notes
    cells = {(cell.get("batch_size"), cell.impl): cell for cell in built.cells}
    assert len(built.cells) == len(cells) == 4  # b=4 and b=32, each fused and ballot+pack_cuda: no second b=4 cell
    assert cells[(4, "fused")].median("gpu") == pytest.approx(10.0)
    assert cells[(32, "fused")].median("gpu") == pytest.approx(5.0)
    assert sorted(cells[(4, "fused")].views["gpu"].by_copy) == [0, 1, 2] and not cells[(32, "fused")].views["gpu"].by_copy
    assert not any("one copy and again" in note for note in report.build_report([folder / "part-a.parquet"]).notes)


@pytest.mark.parametrize("case", ["fewer implementations", "copies failed"])
def test_copies_replace_only_the_rows_they_timed_ok(tmp_path, case):
    """The copies sweep timed only `fused` (--impl), or every copy failed: the other one-copy rows stand."""
    models = {("verify_pack", "fused"): lambda c, v: 5.0, ("verify_pack", "ballot+pack_cuda"): lambda c, v: 6.0}
    grid = dict(batch_sizes=(4,), gammas=(8,), alphas=(0.9,), kv_dims=(128,), views=("gpu",))
    plain = [{**row, "settings": "warmup=5 iters=40"} for row in synthetic_results.make_rows(models, **grid)]
    copies = [{**row, "settings": "warmup=5 iters=40 placements=3", "placement": copy, "run_id": "b",
               "median_us": row["median_us"] * 2.0} for row in plain if row["impl"] != "ballot+pack_cuda"
              for copy in range(3)]
    if case == "copies failed":
        copies = [{**row, "status": "error", "reason": "out of memory", "median_us": None, "samples_us": []}
                  for row in copies]
    folder = tmp_path / "results"
    synthetic_results.write(folder / "part-a.parquet", plain)
    synthetic_results.write(folder / "part-b.parquet", copies)
    built = report.build_report([folder])
    medians = {cell.impl: cell.median("gpu") for cell in built.cells}
    assert medians["ballot+pack_cuda"] == pytest.approx(6.0)
    assert medians["fused"] == pytest.approx(10.0 if case == "fewer implementations" else 5.0)
    assert any("one copy and again" in note for note in built.notes) == (case == "fewer implementations")


def test_out_writes_markdown_plots_and_self_contained_html(tmp_path):
    written = page.write_report(report.build_report([FIXTURE]), tmp_path)
    names = {path.name for path in written}
    assert {"report.md", "report.html", "latency_vs_gamma_verify.png", "latency_vs_alpha_verify.png"} <= names
    for path in written:
        assert path.stat().st_size > 500, path
    markdown = (tmp_path / "report.md").read_text()
    assert "| verify | b=1 γ=8 α=0.3 | torch_eager |" in markdown
    assert "skipped fused_vs_two_step.png" in markdown  # the CPU has no fused kernel: said, not drawn
    html_page = (tmp_path / "report.html").read_text()
    assert html_page.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])
    assert "src='http" not in html_page and 'src="http' not in html_page


def test_an_interrupted_report_leaves_the_previous_one_whole(tmp_path, monkeypatch):
    built = report.build_report([FIXTURE])
    page.write_report(built, tmp_path / "r")
    before = (tmp_path / "r" / "report.md").read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(page, "to_html", interrupted)
    with pytest.raises(KeyboardInterrupt):
        page.write_report(built, tmp_path / "r")
    assert (tmp_path / "r" / "report.md").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no staging folder left behind


def test_a_report_keeps_the_other_files_of_its_folder(tmp_path):
    """Reference reports live beside their data/: writing the report must never remove it."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "part.parquet").write_bytes(b"results")
    page.write_report(report.build_report([FIXTURE]), tmp_path)
    assert (tmp_path / "data" / "part.parquet").read_bytes() == b"results"
    assert (tmp_path / "report.md").exists()


@pytest.mark.parametrize("where", ["file", "proc"])
def test_an_unwritable_out_is_one_line_and_exit_2(tmp_path, where):
    out = tmp_path / "a-file" if where == "file" else "/proc/sdbench-report"
    if where == "file":
        out.write_text("not a folder")
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and str(out) in result.output


# --- synthetic GPU rows -------------------------------------------------------------------------
def test_gpu_tables_show_every_view_with_the_launch_floor_ratio(gpu_report):
    latency = _table(gpu_report, "Median latency")
    assert latency.columns[3:6] == ["wall µs", "graph µs", "gpu µs"]
    row = next(r for r in latency.rows if r[1] == "b=32 γ=128 α=0.9" and r[2] == "ballot")
    assert row[3] == "19.5 (1.0×fl)" and row[5] == "1.90 (2.1×fl)"
    assert row[latency.columns.index("vs torch_eager")] == f"{200 / 19.5:.2f}×"


def test_alpha_table_shows_naive_slope_and_flat_ballot(gpu_report):
    table = _table(gpu_report, "α-sensitivity")
    slopes = {(r[0], r[1], r[2]): float(r[table.columns.index("slope µs/α")]) for r in table.rows}
    assert slopes[("naive", "32", "128")] == pytest.approx(25.0, rel=1e-3)
    assert slopes[("ballot", "32", "128")] == 0.0
    assert {r[2] for r in table.rows} == {"64", "128"}


def test_fused_table_finds_the_planted_crossover(gpu_report):
    table = _table(gpu_report, "Fused")
    assert _column(table, "winner")[0] == "fused_single_block"
    assert _column(table, "winner")[-1] == "ballot+pack_torch"
    # wall: 20 + x/90e3 = 60 + x/2.5e6 -> x = 3.73 MB; measured neighbours 2.52 MB and 5.03 MB
    note = next(note for note in table.notes if note.startswith("fused_single_block: crossover"))
    tau_mb = float(note.split("τ ≈ ")[1].split(" MB")[0])
    assert 2.52 < tau_mb < 5.04


def test_limits_classify_launch_bandwidth_and_divergence():
    config = ("verify", 32, 128, 0.9, 0, "binomial", "int64", "float16", 32000, False, "cuda", "H100")
    kv_config = ("verify_pack",) + config[1:4] + (2048,) + config[5:]

    def cell(wall, gpu, gbps=None, cfg=config):
        return report.Cell(cfg, "x", "cuda", False, 1e7,
                           {"wall": report.ViewStat(wall, 19.0, None), "gpu": report.ViewStat(gpu, 0.9, gbps)})

    assert report.classify(cell(200, 15), None, None)[0] == "launch-bound"
    assert report.classify(cell(30, 25, 2500.0, kv_config), 0.9, 3000.0)[0] == "bandwidth-bound"
    assert report.classify(cell(30, 25), 1.5, 3000.0)[0] == "divergence (α-sensitive)"
    assert report.classify(cell(30, 25, 500.0, kv_config), 1.5, 3000.0)[0] == "kernel latency"


def test_gpu_plots_are_all_written(gpu_report, tmp_path):
    written = page.write_report(gpu_report, tmp_path)
    names = {path.name for path in written}
    assert {"fused_vs_two_step.png", "bandwidth.png", "speedup_verify_ballot.png",
            "speedup_verify_pack_ballot-pack_torch.png", "latency_vs_gamma_verify_pack.png"} <= names
    assert all(path.stat().st_size > 5000 for path in written if path.suffix == ".png")


def test_impl_and_where_filters(gpu_results):
    built = report.build_report([gpu_results], [report.parse_where("gamma=128"), report.parse_where("b<=4")],
                                impls=["ballot"])
    latency = _table(built, "Median latency")
    assert set(_column(latency, "impl")) == {"ballot"}
    assert all("b=4 γ=128" in label for label in _column(latency, "config"))
    assert _column(latency, "vs torch_eager")[0] == f"{200 / 19.5:.2f}×"  # the baseline still counts


@pytest.mark.parametrize("text, column, operator, value", [
    ("gamma=128", "gamma", "=", "128"), ("alpha >= 0.5", "alpha", ">=", "0.5"), ("impl!=naive,ballot", "impl", "!=", "naive,ballot"),
    ("kv==2048", "kv_dim", "=", "2048"),
])
def test_parse_where(text, column, operator, value):
    where = report.parse_where(text)
    assert (where.column, where.operator, where.value) == (column, operator, value)


# --- compare -------------------------------------------------------------------------------------
def _compare_pair(tmp_path, factor: float) -> list:
    def slower(op, impl, config):
        return factor if (op, impl, config["batch_size"], config["gamma"]) == ("verify", "ballot", 32, 128) else 1.0

    a = synthetic_results.write(tmp_path / "a.parquet", synthetic_results.make_rows(seed=1, run_id="a"))
    b = synthetic_results.write(tmp_path / "b.parquet", synthetic_results.make_rows(seed=2, run_id="b", scale=slower))
    found, _ = compare.compare([a], [b], n_boot=400)
    return found


def test_compare_flags_a_planted_2x_regression_and_nothing_else(tmp_path):
    found = _compare_pair(tmp_path, 2.0)
    flagged = [c for c in found if c.verdict in ("SLOWER", "FASTER")]
    assert flagged and all(c.verdict == "SLOWER" and c.get("impl") == "ballot" for c in flagged)
    assert {(c.get("batch_size"), c.get("gamma")) for c in flagged} == {(32, 128)}
    assert len(flagged) == 3 * 3  # three α × three views
    assert all(c.low > 1.8 for c in flagged)


def test_compare_reads_copies_of_a_workload_one_vote_each_with_their_spread(tmp_path):
    """B timed on three copies at 10.0, 10.3 and 11.0 µs (the last with four times the samples), A on one at 10.0:
    B is 10.3 (the copies' median, not the pooled samples' 11.0), and the interval holds the copies' spread, so the
    verdict is not SLOWER. Without copies, the same samples pooled would have called it SLOWER."""
    rng = np.random.default_rng(5)
    base = [row for row in synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,))
            if row["op"] == "verify" and row["impl"] == "ballot" and row["view"] == "gpu"]
    (row,) = base

    def timed(center, count, **extra):
        samples = rng.normal(center, 0.02, count).tolist()
        return {**row, "samples_us": samples, "median_us": float(np.median(samples)), **extra}

    a = synthetic_results.write(tmp_path / "a.parquet", [timed(10.0, 100, run_id="a")])
    b_rows = [timed(center, count, run_id="b", placement=copy)
              for copy, (center, count) in enumerate(((10.0, 100), (10.3, 100), (11.0, 400)))]
    b = synthetic_results.write(tmp_path / "b.parquet", b_rows)
    (found,), _ = compare.compare([a], [b], n_boot=1000)
    assert found.b_us == pytest.approx(10.3, abs=0.02) and found.verdict != "SLOWER"
    assert found.low < 1.01 and found.high > 1.09
    pooled = synthetic_results.write(tmp_path / "pooled.parquet", [{**r, "placement": None} for r in b_rows])
    (naive,), _ = compare.compare([a], [pooled], n_boot=1000)
    assert naive.verdict == "SLOWER" and naive.b_us == pytest.approx(11.0, abs=0.02)


def test_compare_reads_a_config_timed_again_on_copies_from_the_copies_only(tmp_path):
    """Side A holds a config timed once at 30 µs and again on three copies (10.0, 10.3, 10.6) with the same settings
    but placements: A is the copies' 10.3, not a median with the one-copy row among them (10.45)."""
    rng = np.random.default_rng(6)
    (row,) = [row for row in synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,))
              if row["op"] == "verify" and row["impl"] == "ballot" and row["view"] == "gpu"]

    def timed(center, **extra):
        samples = rng.normal(center, 0.02, 100).tolist()
        return {**row, "settings": "warmup=5 iters=40", "samples_us": samples, "median_us": float(np.median(samples)),
                **extra}

    folder = tmp_path / "a"
    synthetic_results.write(folder / "part-plain.parquet", [timed(30.0, run_id="a")])
    synthetic_results.write(folder / "part-copies.parquet", [
        timed(center, run_id="a2", placement=copy, settings="warmup=5 iters=40 placements=3")
        for copy, center in enumerate((10.0, 10.3, 10.6))])
    b = synthetic_results.write(tmp_path / "b.parquet", [timed(10.3, run_id="b")])
    (found,), _ = compare.compare([folder], [b], n_boot=400)
    assert found.a_us == pytest.approx(10.3, abs=0.02)
    # a side matches without settings: copies swept with other iterations replace the one-copy row too
    other = tmp_path / "other"
    synthetic_results.write(other / "part-plain.parquet", [timed(30.0, run_id="a")])
    synthetic_results.write(other / "part-copies.parquet", [
        timed(center, run_id="a2", placement=copy, settings="warmup=5 iters=80 placements=3")
        for copy, center in enumerate((10.0, 10.3, 10.6))])
    (found,), _ = compare.compare([other], [b], n_boot=400)
    assert found.a_us == pytest.approx(10.3, abs=0.02)


def test_compare_one_copy_against_several_borrows_their_spread(tmp_path):
    """A timed once at 10.6 µs (one placement, its offset unknown) against B on copies at 9.5, 10.0 and 10.5: A's
    interval takes B's spread between copies, so a 6% gap no larger than that spread is not called FASTER."""
    rng = np.random.default_rng(9)
    (row,) = [row for row in synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,))
              if row["op"] == "verify" and row["impl"] == "ballot" and row["view"] == "gpu"]

    def timed(center, **extra):
        samples = rng.normal(center, 0.01, 100).tolist()
        return {**row, "samples_us": samples, "median_us": float(np.median(samples)), **extra}

    a = synthetic_results.write(tmp_path / "a.parquet", [timed(10.6, run_id="a")])
    b = synthetic_results.write(tmp_path / "b.parquet", [timed(center, run_id="b", placement=copy)
                                                         for copy, center in enumerate((9.5, 10.0, 10.5))])
    (found,), _ = compare.compare([a], [b], n_boot=2000)
    assert found.verdict != "FASTER" and found.high > 1.0, (found.low, found.high, found.verdict)


def test_compare_of_one_copy_a_side_is_the_plain_interval_draw_for_draw(tmp_path):
    """Rows tagged as copy 0 on both sides (sweep --placements with one copy surviving) give the same numbers as the
    same rows untagged: the copies' path reduces to the plain bootstrap."""
    rows = [row for row in synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,))
            if row["op"] == "verify" and row["impl"] == "ballot"]
    a = synthetic_results.write(tmp_path / "a.parquet", [{**row, "run_id": "a"} for row in rows])
    b = synthetic_results.write(tmp_path / "b.parquet", [{**row, "run_id": "b", "median_us": row["median_us"] * 1.1,
                                                          "samples_us": [v * 1.1 for v in row["samples_us"]]}
                                                         for row in rows])
    a0 = synthetic_results.write(tmp_path / "a0.parquet", [{**row, "run_id": "a", "placement": 0} for row in rows])
    b0 = synthetic_results.write(tmp_path / "b0.parquet", [{**row, "run_id": "b", "placement": 0,
                                                            "median_us": row["median_us"] * 1.1,
                                                            "samples_us": [v * 1.1 for v in row["samples_us"]]}
                                                           for row in rows])
    plain, _ = compare.compare([a], [b], n_boot=300)
    tagged, _ = compare.compare([a0], [b0], n_boot=300)
    assert [(c.a_us, c.b_us, c.low, c.high, c.verdict) for c in plain] == [
        (c.a_us, c.b_us, c.low, c.high, c.verdict) for c in tagged]


def test_compare_never_matches_graph_rows_timed_by_the_two_graph_methods(tmp_path):
    """Graph rows from before schema v3 (one replay, launch latency in it) against rows timed inside the graph
    (calls_per_sample set) are left out with a note; the other views still compare, and two new runs match."""
    old = synthetic_results.make_rows(seed=1, run_id="a")
    new = [{**row, "calls_per_sample": 8 if row["view"] == "graph" else None}
           for row in synthetic_results.make_rows(seed=2, run_id="b")]
    a = synthetic_results.write(tmp_path / "a.parquet", old)
    b = synthetic_results.write(tmp_path / "b.parquet", new)
    found, notes = compare.compare([a], [b], n_boot=200)
    assert found and {c.get("view") for c in found} == {"wall", "gpu"}
    assert any("graph rows left out" in note for note in notes), notes
    assert not any("only in" in note for note in notes), notes
    c = synthetic_results.write(tmp_path / "c.parquet", [{**row, "run_id": "c"} for row in new])
    found, notes = compare.compare([b], [c], n_boot=200)
    assert "graph" in {c.get("view") for c in found} and not notes


def _slowed_wall_pair(tmp_path, factor: float, rows_factor: float | None = None):
    """A and B of the wall view; in B every launch floor is `factor` times A's and every row `rows_factor`
    times (the floor's factor unless given)."""
    rows_factor = factor if rows_factor is None else rows_factor
    a_rows = synthetic_results.make_rows(seed=1, run_id="a", views=("wall",))
    b_rows = [{**row, "median_us": row["median_us"] * rows_factor, "samples_us": [x * rows_factor for x in row["samples_us"]],
               "launch_floor_us": row["launch_floor_us"] * factor if row["launch_floor_us"] else None, "run_id": "b"}
              for row in synthetic_results.make_rows(seed=2, run_id="b", views=("wall",))]
    return (synthetic_results.write(tmp_path / "a.parquet", a_rows),
            synthetic_results.write(tmp_path / "b.parquet", b_rows))


def test_compare_against_the_floor_forgives_a_host_that_slowed_everything_alike(tmp_path):
    """B ran on a host 10% slower at launching (within one host state): every row and its floor moved together.
    Raw medians call every row SLOWER; as multiples of their own floor in their own run they are the SAME."""
    a, b = _slowed_wall_pair(tmp_path, 1.1)
    raw, _ = compare.compare([a], [b], n_boot=200)
    assert raw and all(c.verdict == "SLOWER" for c in raw)
    floored, _ = compare.compare([a], [b], n_boot=200, against_floor=True)
    assert len(floored) == len(raw) and all(c.verdict == "SAME" for c in floored)
    assert all(abs(c.a_us - c.b_us) < 0.1 * c.a_us for c in floored)  # ×floor, not µs
    table = compare.compare_table(floored, [], "a", "b", 0.05, against_floor=True)
    assert "A ×fl" in table.columns and "own launch floor" in table.title


def test_compare_against_the_floor_needs_the_same_launch_path_on_both_sides(tmp_path):
    """A row A read against the custom-op floor (written before launch_path existed) and B against its own
    Triton floor is left out of --against-floor (the ratios would differ by the floors, not the code), and
    kept in a raw compare."""
    rows = synthetic_results.make_rows(seed=1, run_id="a", views=("wall",))
    b_rows = [{**row, "run_id": "b", "launch_path": ("triton" if row["impl"] == "naive" else "custom_op")
               if row["impl"] != "launch_floor" else None} for row in rows]
    a = synthetic_results.write(tmp_path / "a.parquet", rows)
    b = synthetic_results.write(tmp_path / "b.parquet", b_rows)
    floored, notes = compare.compare([a], [b], n_boot=100, against_floor=True)
    assert floored and "naive" not in {c.get("impl") for c in floored}
    assert any("different launch paths" in note for note in notes), notes
    raw, notes = compare.compare([a], [b], n_boot=100)
    assert "naive" in {c.get("impl") for c in raw} and not notes


def test_compare_does_not_flag_a_2_percent_change(tmp_path):
    found = _compare_pair(tmp_path, 1.02)
    assert all(c.verdict in ("SAME", "NOISY") for c in found)
    assert sum(c.verdict == "SAME" for c in found) > len(found) / 2


@pytest.mark.parametrize("ratio, low, high, noisy, verdict", [
    (2.0, 1.9, 2.1, None, "SLOWER"),
    (0.5, 0.45, 0.55, None, "FASTER"),
    (1.01, 0.99, 1.03, None, "SAME"),         # inside the ±5% band
    (1.03, 1.02, 1.04, None, "SAME"),         # real, but under the threshold
    (1.0, 0.7, 1.4, None, "NOISY"),           # too wide to tell either way
    (1.3, 0.9, 1.8, None, "NOISY"),           # large, but the interval includes 1
    (2.0, 1.9, 2.1, "run A flagged it", "NOISY"),  # a run said the row was noisy: never a verdict of change
    (1.01, 0.99, 1.03, "host state moved", "NOISY"),  # nor one of sameness
])
def test_the_compare_classifier(ratio, low, high, noisy, verdict):
    found, why = compare.judge(ratio, low, high, 0.05, noisy)
    assert found == verdict and (noisy is None or why == noisy)


@pytest.mark.parametrize("against_floor", [False, True])
def test_a_wall_pair_whose_floor_moved_beyond_the_host_tolerance_is_noisy(tmp_path, against_floor):
    """B met the host in its slow state: floors 1.7× A's, rows only 1.4× (wall ≈ s·host work + fixed device time,
    so rows do not move by the floor's factor). Neither the raw nor the floored ratio compares: NOISY, saying
    why; the gpu view, which has no host state, is judged as before."""
    a, b = _slowed_wall_pair(tmp_path, 1.7, rows_factor=1.4)
    found, _ = compare.compare([a], [b], n_boot=100, against_floor=against_floor)
    assert found and all(c.verdict == "NOISY" for c in found)
    assert all("launch floor moved +70% (19.0 → 32.3 µs): host state differs between runs" == c.why for c in found)
    loose, _ = compare.compare([a], [b], n_boot=100, against_floor=against_floor, host_tolerance=0.8)
    assert {c.verdict for c in loose} == ({"FASTER"} if against_floor else {"SLOWER"})


def test_the_host_state_rule_reaches_the_wall_view_only(tmp_path):
    a_rows = synthetic_results.make_rows(seed=1, run_id="a", views=("wall", "gpu"))
    b_rows = [{**row, "run_id": "b", "launch_floor_us": row["launch_floor_us"] * 1.7 if row["launch_floor_us"] else None}
              for row in synthetic_results.make_rows(seed=1, run_id="b", views=("wall", "gpu"))]
    a = synthetic_results.write(tmp_path / "a.parquet", a_rows)
    b = synthetic_results.write(tmp_path / "b.parquet", b_rows)
    found, _ = compare.compare([a], [b], n_boot=100)
    verdicts = {view: {c.verdict for c in found if c.get("view") == view} for view in ("wall", "gpu")}
    assert verdicts == {"wall": {"NOISY"}, "gpu": {"SAME"}}


def test_compare_says_which_run_flagged_a_row_and_why(tmp_path):
    rows = synthetic_results.make_rows(seed=1, run_id="a", views=("wall",))
    slowed = [{**row, "run_id": "b", "noisy": True, "host_slowed": 1.7} for row in rows]
    drifted = [{**row, "run_id": "b", "noisy": True, "floor_drift": 0.08} for row in rows]
    a = synthetic_results.write(tmp_path / "a.parquet", rows)
    for b_rows, why in ((slowed, "run B flagged this row noisy (measured in a slow host state: launch floor 1.70× its "
                                 "sweep's lowest)"),
                        (drifted, "run B flagged this row noisy (its ratio to its floor drifted 8% within the run)")):
        b = synthetic_results.write(tmp_path / "b.parquet", b_rows)
        found, _ = compare.compare([a], [b], n_boot=100)
        assert found and {(c.verdict, c.why) for c in found} == {("NOISY", why)}


def test_compare_cli(tmp_path):
    found = _compare_pair(tmp_path, 2.0)
    assert found
    result = runner.invoke(app, ["report", "--compare", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"),
                                 "--where", "op=verify", "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    assert "9 SLOWER" in result.output
    assert (tmp_path / "cmp" / "compare.md").read_text().count("| SLOWER |") == 9


# --- errors ---------------------------------------------------------------------------------------
def _error(args) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 or lines[0].startswith("error:"), result.output
    return result.output


def test_error_missing_file(tmp_path):
    assert "no such file or folder" in _error(["report", str(tmp_path / "nope.parquet")])


def test_error_not_parquet(tmp_path):
    bad = tmp_path / "x.parquet"
    bad.write_text("hello")
    assert "is not a parquet file" in _error(["report", str(bad)])


def test_error_not_sdbench_parquet(tmp_path):
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), other)
    assert "is not sdbench results (missing columns" in _error(["report", str(other)])


def test_error_schema_version_mismatch(tmp_path):
    table = pq.read_table(FIXTURE)
    index = table.column_names.index("schema_version")
    table = table.set_column(index, "schema_version", pa.array([99] * table.num_rows, pa.int32()))
    pq.write_table(table, tmp_path / "future.parquet")
    assert "has results schema version 99; this sdbench reads version 1" in _error(["report", str(tmp_path)])


def test_error_empty_filter_lists_the_values():
    output = _error(["report", str(FIXTURE), "--where", "gamma=999"])
    assert "no timed rows match --where gamma=999 (gamma takes 8, 64, 128)" in output


def test_error_bad_where_and_unknown_column_and_impl():
    assert "expected COLUMN OP VALUE" in _error(["report", str(FIXTURE), "--where", "gamma"])
    assert "did you mean 'gamma'" in _error(["report", str(FIXTURE), "--where", "gama=8"])
    assert "is an integer" in _error(["report", str(FIXTURE), "--where", "gamma=big"])
    assert "--impl 'balot' is not in these results" in _error(["report", str(FIXTURE), "--impl", "balot"])


def test_error_empty_folder_and_compare_arity(tmp_path):
    assert "holds no .parquet files" in _error(["report", str(tmp_path)])
    assert "exactly two results" in _error(["report", "--compare", str(FIXTURE)])


def test_report_cli_prints_tables_and_writes_out(tmp_path):
    result = runner.invoke(app, ["report", str(FIXTURE), "--out", str(tmp_path / "r"), "--max-rows", "5"])
    assert result.exit_code == 0, result.output
    assert "Median latency per implementation" in result.output and "serial_triton" in result.output
    assert (tmp_path / "r" / "report.html").is_file()


def test_missing_polars_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(SdbenchError, match="polars is needed for reports: pip install polars"):
        report.build_report([FIXTURE])


def test_import_sdbench_never_imports_polars():
    code = ("import sys, sdbench, sdbench.cli, sdbench.commands.report, sdbench.commands.calibrate_tau, sdbench.dispatch, sdbench.api; "
            "sdbench.verify; sys.exit('polars' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_prob_roofline_compares_gpu_time_with_the_read_floor(tmp_path):
    """Planted: 3 MB read in 2.5 µs (meets 1.5 × 1 µs + 3) and in 9 µs (misses it) at 3000 GB/s."""
    models = {("prob_verify", "fused"): lambda c, v: {"wall": 25.0, "graph": 12.0, "gpu": 2.5}[v],
              ("prob_verify", "torch_eager"): lambda c, v: {"wall": 200.0, "graph": 30.0, "gpu": 9.0}[v]}
    rows = synthetic_results.make_rows(models, batch_sizes=(32,), gammas=(8,), alphas=(0.6,), kv_dims=(0,))
    for row in rows:
        if row["impl"] != "launch_floor":
            row["bytes_moved"] = 3_000_000
            row["achieved_gbps"] = 3_000_000 / (row["median_us"] * 1e3)
    path = synthetic_results.write(tmp_path / "prob.parquet", rows)
    table = next(t for t in report.build_report([path], ceiling_gbps=3000.0).tables if "roofline" in t.title)
    by_impl = {row[1]: row for row in table.rows}
    assert by_impl["fused"][3] == "1.00" and by_impl["fused"][-1] == "yes"
    assert by_impl["torch_eager"][-1] == "no"


def test_kv_roofline_judges_cold_configs_of_4_mb_and_more_against_the_copy_floor(tmp_path):
    """Planted at 3000 GB/s: fused at 1.2 × floor + 2 µs (meets 1.3 × floor + 2), the two-step at 1.5 × floor
    + 2 (misses); warm rows and configs under 4 MB are not judged."""
    def floor_us(c):
        return 2 * c["kv_bytes"] / 3000.0 / 1e3

    models = {("verify_pack", "fused"): lambda c, v: 1.2 * floor_us(c) + 2.0,
              ("verify_pack", "ballot+pack_cuda"): lambda c, v: 1.5 * floor_us(c) + 2.0}
    rows = synthetic_results.make_rows(models, batch_sizes=(4, 32), gammas=(8, 128), alphas=(0.9,), kv_dims=(2048,),
                                       views=("gpu",))
    cold = [{**row, "cold_l2": True} for row in rows]
    path = synthetic_results.write(tmp_path / "kv.parquet", rows + cold)
    table = next(t for t in report.build_report([path], ceiling_gbps=3000.0).tables
                 if t.title.startswith("verify_pack roofline"))
    verdicts = _column(table, table.columns[-1])
    judged = [v for v in verdicts if v != "—"]
    # ≥ 4 MB accepted: b=32 γ=128 (15.1 MB) and b=4 γ=128 (1.9 MB: not judged) -> one cold config judged
    assert judged == ["fused: yes; best two-step: no"]
    assert verdicts.count("—") == len(verdicts) - 1
    assert any(note.startswith("fused: within 1.3 × floor + 2 µs at 1 of 1") for note in table.notes)
    assert any(note.startswith("best two-step: within 1.3 × floor + 2 µs at 0 of 1") for note in table.notes)
    row = table.rows[verdicts.index(judged[0])]
    floor = 2 * int(32 * 128 * 0.9 * 2048 * 2) / 3000.0 / 1e3
    assert row[table.columns.index("floor µs")] == f"{floor:.2f}"
    assert row[table.columns.index("fused µs (% of copy)")].endswith(f"({floor / (1.2 * floor + 2):.0%})")


def test_pack_roofline_gives_every_implementation_a_column_and_a_verdict(tmp_path):
    """Planted at 3000 GB/s: pack_scan at 1.1 × floor + 1 µs (meets 1.3 × floor + 2), pack_cuda at 2 × floor + 2
    (misses); pack has no two-step column. A report without pack rows has no pack table."""
    def floor_us(c):
        return 2 * c["kv_bytes"] / 3000.0 / 1e3

    models = {("pack", "pack_scan"): lambda c, v: 1.1 * floor_us(c) + 1.0,
              ("pack", "pack_cuda"): lambda c, v: 2.0 * floor_us(c) + 2.0}
    rows = synthetic_results.make_rows(models, batch_sizes=(32,), gammas=(128,), alphas=(0.9,), kv_dims=(2048,),
                                       views=("gpu",))
    path = synthetic_results.write(tmp_path / "pack.parquet", [{**row, "cold_l2": True} for row in rows])
    tables = report.build_report([path], ceiling_gbps=3000.0).tables
    table = next(t for t in tables if t.title.startswith("pack roofline"))
    assert table.columns[3:] == ["pack_cuda µs (% of copy)", "pack_scan µs (% of copy)", "≤ 1.3 × floor + 2 µs"]
    assert _column(table, table.columns[-1]) == ["pack_cuda: no; pack_scan: yes"]
    floor = 2 * int(32 * 128 * 0.9 * 2048 * 2) / 3000.0 / 1e3
    assert table.rows[0][table.columns.index("pack_scan µs (% of copy)")].endswith(f"({floor / (1.1 * floor + 1):.0%})")
    kv_only = synthetic_results.write(tmp_path / "kv.parquet", synthetic_results.make_rows(
        {("verify_pack", "fused"): lambda c, v: 5.0}, batch_sizes=(4,), gammas=(8,), alphas=(0.9,), kv_dims=(128,),
        views=("gpu",)))
    assert not [t for t in report.build_report([kv_only], ceiling_gbps=3000.0).tables if t.title.startswith("pack ")]


def test_fused_table_counts_ties_with_the_best_two_step(gpu_report):
    """By hand from the synthetic wall models: fused_single_block against the faster of the two others."""
    grid = [(b, g, a, kv) for b in (4, 32) for g in (8, 64, 128) for a in (0.3, 0.6, 0.9) for kv in (128, 2048)]
    sizes = [int(b * g * a * kv * 2) for b, g, a, kv in grid]
    ties = sum(20.0 + x / 90e3 <= 1.03 * min(60.0 + x / 2.5e6, 260.0 + x / 2.0e3) for x in sizes)
    note = next(note for note in _table(gpu_report, "Fused").notes if note.startswith("fused_single_block ≤ 1.03"))
    assert f"at {ties} of {len(grid)} configs" in note and 0 < ties < len(grid)


@pytest.mark.parametrize("view, fused, two_step, rest", [
    ("graph", 11.0, 30.0, 60.0), ("gpu", 3.0, 8.0, 30.0)])
def test_fused_table_counts_ties_in_the_gpu_and_graph_views_too(gpu_report, view, fused, two_step, rest):
    """Issue #17's bar is in GPU time and in the graph view: beside the primary (wall) view's count, each of the two
    gets its own, by hand from the synthetic models of that view."""
    grid = [(b, g, a, kv) for b in (4, 32) for g in (8, 64, 128) for a in (0.3, 0.6, 0.9) for kv in (128, 2048)]
    sizes = [int(b * g * a * kv * 2) for b, g, a, kv in grid]
    ratios = [(fused + x / 90e3) / min(two_step + x / 2.5e6, rest + x / 2.0e3) for x in sizes]
    notes = [note for note in _table(gpu_report, "Fused").notes if note.startswith(f"{view} view: fused_single_block")]
    assert notes == [f"{view} view: fused_single_block ≤ 1.03 × the best two-step at {sum(r <= 1.03 for r in ratios)} of "
                     f"{len(grid)} configs (worst {max(ratios):.2f}×)"]
    assert 0 < sum(r <= 1.03 for r in ratios) < len(grid)


def test_fused_table_counts_a_view_once_when_it_is_the_tables_own(gpu_results):
    """With --view graph the table's own notes are the graph view's; only the gpu view gets a prefixed count."""
    notes = _table(report.build_report([gpu_results], view="graph"), "Fused vs two-step").notes
    assert not [note for note in notes if note.startswith("graph view:")]
    assert len([note for note in notes if note.startswith("gpu view: fused_single_block ≤ 1.03")]) == 1
    assert len([note for note in notes if note.startswith("fused_single_block ≤ 1.03")]) == 1


def test_fused_table_says_when_a_view_holds_no_pair(tmp_path):
    """A view where no config holds both kinds says so, rather than leaving the count out."""
    rows = synthetic_results.make_rows({("verify_pack", "fused"): lambda c, v: 5.0,
                                        ("verify_pack", "ballot+pack_cuda"): lambda c, v: 6.0},
                                       batch_sizes=(4,), gammas=(8,), alphas=(0.9,), kv_dims=(128,), views=("wall", "gpu"))
    rows = [row for row in rows if not (row["view"] == "gpu" and row["impl"] == "ballot+pack_cuda")]
    built = report.build_report([synthetic_results.write(tmp_path / "part.parquet", rows)])
    notes = _table(built, "Fused vs two-step").notes
    assert "gpu view: no config holds both a fused kernel and a two-step pipeline" in notes
    assert "fused ≤ 1.03 × the best two-step at 1 of 1 configs (worst 0.83×)" in notes


# --- plots a reader can read -------------------------------------------------------------------------
def _labelled_ticks(axis, which: str) -> list[str]:
    """The tick labels a reader sees on one axis (inside its limits, non-empty); the figure is drawn."""
    low, high = sorted(axis.get_ylim() if which == "y" else axis.get_xlim())
    ticks = axis.yaxis.get_major_ticks() if which == "y" else axis.xaxis.get_major_ticks()
    return [tick.label1.get_text() for tick in ticks
            if tick.label1.get_visible() and tick.label1.get_text() and low <= tick.get_loc() <= high]


def _all_plots(built):
    from sdbench.commands.report import plots

    figures = {}
    for name, _, draw in plots.planned_plots(built):
        try:
            figures[name] = draw()
        except plots.Skip:
            continue
    return figures


@pytest.mark.parametrize("spread", ["narrow", "wide"])
def test_every_plot_has_labelled_ticks_on_every_axis(tmp_path, spread):
    """Narrow: the CPU case, every time within 2× (a log axis there used to show no label at all)."""
    import matplotlib.pyplot as plt

    rows = synthetic_results.make_rows() if spread == "wide" else synthetic_results.make_rows(
        models={("verify", "torch_eager"): lambda c, v: 30.0, ("verify", "ballot"): lambda c, v: 20.0 + c["alpha"]})
    built = report.build_report([synthetic_results.write(tmp_path / "part.parquet", rows)])
    figures = _all_plots(built)
    assert figures
    for name, figure in figures.items():
        figure.canvas.draw()
        for axis in figure.axes:
            if axis.get_label() == "<colorbar>" or not axis.get_visible():
                continue
            shared_y = len(axis.get_shared_y_axes().get_siblings(axis)) > 1
            for which in ("x", "y"):
                if which == "y" and shared_y and not axis.get_subplotspec().is_first_col():
                    continue  # a shared y axis is labelled once, on the row's first panel
                assert len(_labelled_ticks(axis, which)) >= 2, (name, axis.get_title(), which)
        plt.close(figure)


@pytest.mark.parametrize("high, most", [(256 * 10**7, 9), (256 * 10**3, 12)])
def test_a_wide_log_axis_labels_powers_of_ten_only(high, most):
    """Bytes from 256 B to 2.6 GB (the scale-kv grid) put 24 labels at 1, 2 and 5 of each decade on top of each
    other; past MAX_DECADES_AT_125 decades only powers of ten are labelled. Three decades keep 1, 2, 5."""
    import matplotlib.pyplot as plt

    from sdbench.commands.report import plots

    figure, axis = plt.subplots()
    axis.plot([256, high], [1, 100])
    plots.readable_axis(axis, [256, high], "x")
    figure.canvas.draw()
    labels = _labelled_ticks(axis, "x")
    assert 2 <= len(labels) <= most, labels
    assert any(label.startswith("2") for label in labels) == (high < 10**plots.MAX_DECADES_AT_125 * 256), labels
    plt.close(figure)


def test_plots_draw_one_panel_per_value_of_every_axis_they_do_not_show(gpu_report):
    """b ∈ {4, 32}, γ ∈ {8, 64, 128}, α ∈ {0.3, 0.6, 0.9}, kv_dim ∈ {128, 2048} (verify has no kv_dim)."""
    import matplotlib.pyplot as plt

    figures = _all_plots(gpu_report)
    expected = {"latency_vs_gamma_verify.png": 2 * 3, "latency_vs_alpha_verify.png": 2 * 3,
                "latency_vs_gamma_verify_pack.png": 2 * 3 * 2, "latency_vs_alpha_verify_pack.png": 2 * 3 * 2,
                "speedup_verify_ballot.png": 2, "speedup_verify_pack_fused_single_block.png": 2 * 2}
    for name, panels in expected.items():
        axes = [axis for axis in figures[name].axes if axis.get_visible() and axis.get_label() != "<colorbar>"]
        assert len(axes) == panels, name
        titles = [axis.get_title() for axis in axes]
        assert len(set(titles)) == panels and all("b=" in title for title in titles), titles
    assert "γ=128" in " ".join(axis.get_title() for axis in figures["latency_vs_alpha_verify.png"].axes)
    for figure in figures.values():
        plt.close(figure)


def test_a_heatmap_never_drops_a_vocabulary(tmp_path):
    """prob_verify at V = 32000 and 128256: the old heatmap kept 128256 and silently lost 32000."""
    import matplotlib.pyplot as plt

    rows = []
    for vocab in (32000, 128256):
        part = synthetic_results.make_rows(models={("verify", "torch_eager"): lambda c, v: 30.0 + c["gamma"],
                                                   ("verify", "ballot"): lambda c, v: 10.0 + c["alpha"]},
                                           batch_sizes=(32,), run_id="one-run")
        for row in part:
            row["vocab_size"] = vocab
        rows.extend(part)
    built = report.build_report([synthetic_results.write(tmp_path / "part.parquet", rows)])
    figure = _all_plots(built)["speedup_verify_ballot.png"]
    titles = sorted(axis.get_title() for axis in figure.axes if axis.get_label() != "<colorbar>")
    assert titles == ["vocab=128256", "vocab=32000"]
    plt.close(figure)


def test_plots_say_when_they_pool_runs(tmp_path):
    import matplotlib.pyplot as plt

    first = synthetic_results.write(tmp_path / "a.parquet", synthetic_results.make_rows(run_id="run-a"))
    second = synthetic_results.write(tmp_path / "b.parquet", synthetic_results.make_rows(run_id="run-b", seed=1))
    figures = _all_plots(report.build_report([first, second]))
    for name, figure in figures.items():
        title = figure.get_suptitle() or figure.axes[0].get_title()
        assert "median of 2 pooled runs" in title, name
        plt.close(figure)


def test_rows_below_their_own_floor_are_found_and_noted(tmp_path):
    """The floor rule on synthetic rows: one row above its own path's floor, one below it by more than its
    noise (reported), one below by less than its noise (not reported)."""
    from sdbench.ops.launch_floor import rows_below_own_floor

    base = synthetic_results.make_rows()[0]
    above = {**base, "impl": "ballot", "median_us": 30.0, "launch_floor_us": 20.0, "launch_path": "custom_op", "noise": 0.01}
    below = {**base, "impl": "fused", "median_us": 15.0, "launch_floor_us": 20.0, "launch_path": "triton_bound",
             "noise": 0.01}
    noisy = {**base, "impl": "flashspec", "median_us": 19.5, "launch_floor_us": 20.0, "launch_path": "triton",
             "noise": 0.05}
    # the wall view's 5% host-path tolerance: 4% below is at the floor there, 6% below is not
    wall_near = {**base, "impl": "naive", "view": "wall", "median_us": 19.2, "launch_floor_us": 20.0,
                 "launch_path": "custom_op", "noise": 0.0}
    wall_far = {**base, "impl": "ballot+pack_cuda", "view": "wall", "median_us": 18.8, "launch_floor_us": 20.0,
                "launch_path": "custom_op", "noise": 0.0}
    rows = [above, below, noisy, wall_near, wall_far]
    assert [row["impl"] for row in rows_below_own_floor(rows)] == ["fused", "ballot+pack_cuda"]
    path = synthetic_results.write(tmp_path / "part-0.parquet", rows)
    built = report.build_report([path])
    assert any("below their own launch floor" in note and "fused" in note and "ballot+pack_cuda" in note
               and "flashspec" not in note and "naive" not in note for note in built.notes), built.notes


def test_noisy_reason_reads_the_sweeps_own_host_tolerance():
    from sdbench.commands.report.compare import noisy_reason

    slowed = {"host_slowed": 1.2, "floor_drift": 0.0, "settings": "warmup=20 iters=200"}
    assert noisy_reason(slowed).startswith("measured in a slow host state: launch floor 1.20×")
    # a sweep run with --host-tolerance 0.3 did not call 1.2x slow: the flag had another cause
    assert noisy_reason({**slowed, "settings": "warmup=20 iters=200 host_tolerance=0.3"}) == \
        "median noise above its --max-noise"



def _rows_on(uuid: str | None, run_id: str) -> list[dict]:
    gpu = {**synthetic_results.H100, "gpu_uuid": uuid}
    return synthetic_results.make_rows(batch_sizes=(4,), gammas=(8,), alphas=(0.3,), gpu=gpu, run_id=run_id)


def _write_on(path: Path, uuid: str | None | type(...), run_id: str) -> Path:
    """A results file on GPU uuid; ... for a file written before the gpu_uuid column (the column absent)."""
    written = synthetic_results.write(path, _rows_on(None if uuid is ... else uuid, run_id))
    if uuid is ...:
        table = pq.read_table(written)
        pq.write_table(table.drop_columns(["gpu_uuid"]), written)
    return written


GPU_CASES = {"two GPUs": ("gpu-a", "gpu-b"), "one GPU": ("gpu-a", "gpu-a"), "unreadable": (None, None),
             "before the column": (..., ...), "one GPU and a file before the column": ("gpu-a", ...)}


@pytest.mark.parametrize("case", GPU_CASES)
def test_report_names_the_physical_gpus_when_rows_come_from_more_than_one(tmp_path, case):
    """Two runs of one model of GPU: the report names both GPUs when their gpu_uuid differ, and says how many timed
    rows name none when some do; one GPU, or none recorded at all, says nothing."""
    a_uuid, b_uuid = GPU_CASES[case]
    a = _write_on(tmp_path / "a.parquet", a_uuid, "run-a")
    b = _write_on(tmp_path / "b.parquet", b_uuid, "run-b")
    notes = [note for note in report.build_report([a, b]).notes if "physical GPU" in note]
    old_rows = sum(row["status"] == "ok" for row in _rows_on(None, "run-b"))  # every timed row of the older file
    expected = {"two GPUs": "timed on 2 physical GPUs (gpu-a, gpu-b): ",
                "one GPU and a file before the column": f"timed on 1 physical GPU (gpu-a) and {old_rows} timed rows on "
                                                        "an unrecorded one: "}.get(case)
    assert [note.split("two GPUs of one model")[0] for note in notes] == ([expected] if expected else [])
    assert all(note.endswith("--where gpu_uuid=UUID") for note in notes)


@pytest.mark.parametrize("case", GPU_CASES)
def test_compare_says_when_a_and_b_ran_on_other_physical_gpus(tmp_path, case):
    a_uuid, b_uuid = GPU_CASES[case]
    a = _write_on(tmp_path / "a.parquet", a_uuid, "run-a")
    b = _write_on(tmp_path / "b.parquet", b_uuid, "run-b")
    _, notes = compare.compare([a], [b], n_boot=50)
    said = [note.split(" (gpu_uuid)")[0] for note in notes if note.startswith("A ran on")]
    assert said == (["A ran on 1 physical GPU (gpu-a) and B on 1 physical GPU (gpu-b)"] if case == "two GPUs" else [])


def test_where_on_a_column_older_files_lack_matches_nothing_rather_than_failing(tmp_path):
    old = _write_on(tmp_path / "old.parquet", ..., "run-old")
    with pytest.raises(SdbenchError, match="no timed rows match --where gpu_uuid=gpu-a"):
        report.build_report([old], wheres=[report.parse_where("gpu_uuid=gpu-a")])
