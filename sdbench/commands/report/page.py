"""`sdbench report --out`: the report page (markdown and a self-contained HTML) with its plots, written atomically."""

from __future__ import annotations

import html
import os
import shutil
import tempfile
from pathlib import Path

from sdbench.commands.report import Report, plots
from sdbench.errors import SdbenchError, writable_folder


# --- output -----------------------------------------------------------------------------------------------
def markdown(report: Report, plots: list[tuple[str, str]] | None = None, plot_notes: list[str] | None = None) -> str:
    lines = [f"# sdbench report: {report.gpu_label}", "",
             f"Sources: {', '.join(report.sources)}. Speedups use the **{report.primary_view}** view; "
             f"baseline `{report.baseline}`.", ""]
    lines.extend(f"> {note}" for note in report.notes)
    for table in report.tables:
        lines.extend(["", table.markdown()])
    if plots or plot_notes:
        lines.extend(["", "## Plots", ""])
        lines.extend(f"![{title}]({name})\n" for name, title in plots or [])
        lines.extend(f"> {note}" for note in plot_notes or [])
    return "\n".join(lines).rstrip() + "\n"


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;"
        "margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:nth-child(-n+3),"
        "th:nth-child(-n+3){text-align:left}th{background:#f0f0f0}.note{color:#555;font-size:90%}"
        "img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}")


def to_html(report: Report, plots: list[tuple[str, bytes, str]], plot_notes: list[str]) -> str:
    """A self-contained page: tables inline, plots as base64 PNGs."""
    import base64

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>sdbench report: {html.escape(report.gpu_label)}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>sdbench report: {html.escape(report.gpu_label)}</h1>",
             f"<p>Sources: {html.escape(', '.join(report.sources))}. Speedups use the "
             f"<b>{html.escape(report.primary_view)}</b> view; baseline <code>{html.escape(report.baseline)}</code>.</p>"]
    parts.extend(f"<p class='note'>{html.escape(note)}</p>" for note in report.notes)
    parts.extend(table.html() for table in report.tables)
    if plots or plot_notes:
        parts.append("<h2>Plots</h2>")
    for name, png, title in plots:
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure><img alt='{html.escape(title)}' src='data:image/png;base64,{encoded}'>"
                     f"<figcaption>{html.escape(name)}</figcaption></figure>")
    parts.extend(f"<p class='note'>{html.escape(note)}</p>" for note in plot_notes)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(report: Report, out_dir: str | Path) -> list[Path]:
    """report.md, one PNG per plot that has data, and a self-contained report.html; returns the paths.

    Everything is written into a temporary sibling folder and swapped in at the end, so an interrupted
    report (Ctrl-C, a full disk) leaves the previous report whole. A folder that cannot be written is
    one SdbenchError naming it and the fix.
    """
    out = Path(out_dir)
    staging = _staging_folder(out)
    try:
        written, plot_notes = plots.write_plots(report, staging)
        plot_files = [(path.name, title) for path, title in written]
        (staging / "report.md").write_text(markdown(report, plot_files, plot_notes))
        pngs = [(path.name, path.read_bytes(), title) for path, title in written]
        (staging / "report.html").write_text(to_html(report, pngs, plot_notes))
        _swap_in(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return [out / "report.md", *(out / path.name for path, _ in written), out / "report.html"]


def _staging_folder(out: Path) -> Path:
    if out.exists() and not out.is_dir():
        raise SdbenchError(f"--out {str(out)!r} is a file, not a folder: name a folder for the report")
    try:
        writable_folder(out.parent)
    except SdbenchError:
        raise SdbenchError(f"--out {str(out)!r}: its folder cannot be written; choose a folder you can write, "
                           "e.g. --out results/report") from None
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as err:
        raise SdbenchError(f"cannot write the report into {str(out)!r} ({err.strerror or err}): "
                           "choose a folder you can write with --out") from None


def _swap_in(staging: Path, out: Path) -> None:
    """Move the finished files into out one rename each, the pages last (a reader never finds a page whose
    plots are missing). Files of out that the report does not write (its data/, other reports) are kept."""
    out.mkdir(parents=True, exist_ok=True)
    pages = ("report.md", "report.html")
    for path in sorted(staging.iterdir(), key=lambda path: path.name in pages):
        os.replace(path, out / path.name)
