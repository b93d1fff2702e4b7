"""The `sdbench` command line: parse, validate, call the library, render with rich. No logic here.

Each command's body lives between its own `# --- <command> ---` markers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sdbench.errors import SdbenchError, writable_folder

app = typer.Typer(
    name="sdbench",
    help="Benchmark the verification step of batched speculative decoding on NVIDIA GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        import sdbench

        console.print(f"sdbench {sdbench.__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Benchmark the verification step of batched speculative decoding on NVIDIA GPUs."""


def command(name: str) -> Callable:
    """app.command(name) that turns SdbenchError into one red line on stderr and exit code 2."""

    def decorate(function: Callable) -> Callable:
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except SdbenchError as err:
                err_console.print(f"[bold red]error:[/] {err}", highlight=False)
                raise typer.Exit(2) from None

        return app.command(name)(wrapper)

    return decorate


# --- shared option parsing ---------------------------------------------------------------------
def parse_int_list(text: str, option: str, minimum: int | None = None) -> list[int]:
    """'1,4,16' -> [1, 4, 16]; a clear SdbenchError naming the option otherwise."""
    values = []
    for word in text.split(","):
        word = word.strip()
        try:
            value = int(word)
        except ValueError:
            raise SdbenchError(f"{option}: {word!r} is not an integer (expected a list like 1,4,16)") from None
        if minimum is not None and value < minimum:
            raise SdbenchError(f"{option}: {value} is below the minimum {minimum}")
        values.append(value)
    return values


def parse_float_list(text: str, option: str, low: float | None = None, high: float | None = None) -> list[float]:
    """'0.3,0.9' -> [0.3, 0.9], each checked against [low, high]."""
    values = []
    for word in text.split(","):
        word = word.strip()
        try:
            value = float(word)
        except ValueError:
            raise SdbenchError(f"{option}: {word!r} is not a number (expected a list like 0.3,0.6,0.9)") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise SdbenchError(f"{option}: {value} is outside [{low}, {high}]")
        values.append(value)
    return values


def parse_name_list(text: str | None) -> list[str]:
    return [word.strip() for word in text.split(",") if word.strip()] if text else []


FORMATS = ("table", "json", "csv", "md")
FormatOption = Annotated[str, typer.Option("--format", help="table (rich), json, csv or md (markdown), to stdout.")]


def emit(title: str, columns: list[str], rows: list[list], fmt: str, identifiers: int = 2) -> None:
    """Print rows in fmt. The first `identifiers` columns hold names a user types next (operation,
    implementation): a table never truncates or folds them; other columns fold instead."""
    import csv
    import io
    import json
    import sys

    if fmt not in FORMATS:
        raise SdbenchError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    plain = [[_plain(cell) for cell in row] for row in rows]
    if fmt == "json":
        sys.stdout.write(json.dumps([dict(zip(columns, row, strict=True)) for row in plain], indent=1) + "\n")
    elif fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(plain)
        sys.stdout.write(buffer.getvalue())
    elif fmt == "md":
        lines = [f"| {' | '.join(columns)} |", f"|{'---|' * len(columns)}"]
        lines.extend(f"| {' | '.join(str(cell).replace('|', '/') for cell in row)} |" for row in plain)
        sys.stdout.write("\n".join(lines) + "\n")
    else:
        table = Table(title=title)
        for index, column in enumerate(columns):
            if index < identifiers:
                table.add_column(column, no_wrap=True, min_width=max([len(column)] + [len(str(r[index])) for r in plain]))
            else:
                table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(str(cell) for cell in row))
        console.print(table)


def _plain(cell):
    """A cell without rich markup, for json / csv / md."""
    from rich.text import Text

    return Text.from_markup(cell).plain if isinstance(cell, str) else cell


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --- list --------------------------------------------------------------------------------------
@command("list")
def list_command(
    op: Annotated[str | None, typer.Option(help="Only this operation (verify, pack, verify_pack, prob_verify, verify_ragged, verify_pack_ragged, prob_verify_ragged).")] = None,
    device: Annotated[str | None, typer.Option(help="Check availability on this device (default: cuda if present).")] = None,
    dispatch: Annotated[bool, typer.Option("--dispatch", help="Show what verify_pack(impl='auto') picks for --b/--gamma/--alpha/--kv-dim, and why.")] = False,
    b: Annotated[int | None, typer.Option("--b", help="--dispatch: batch size.")] = None,
    gamma: Annotated[int | None, typer.Option(help="--dispatch: draft length γ.")] = None,
    alpha: Annotated[float | None, typer.Option(help="--dispatch: expected acceptance rate α.")] = None,
    kv_dim: Annotated[int | None, typer.Option(help="--dispatch: KV width per token.")] = None,
    kv_dtype: Annotated[str, typer.Option(help="--dispatch: float16 or bfloat16.")] = "float16",
    dist: Annotated[str, typer.Option(help="--dispatch: acceptance distribution giving E[k] (binomial: αγ; geometric).")] = "binomial",
    gpu: Annotated[str | None, typer.Option(help="--dispatch: decide for this GPU name's profile (default: this machine's GPU).")] = None,
    fmt: FormatOption = "table",
) -> None:
    """List every registered implementation, where it runs, and why it cannot run here."""
    from sdbench import registry

    if dispatch:
        _print_dispatch(b, gamma, alpha, kv_dim, kv_dtype, dist, gpu)
        return

    if op is not None and op not in registry.OPERATIONS:
        registry.get(op, "")  # raises the one-line error with a suggestion
    device = device or default_device()
    rows = []
    for impl in registry.implementations(op):
        reason = impl.unavailable_reason(device)
        notes = ", ".join(word for word, flag in (("syncs", impl.sync), ("peer", impl.peer)) if flag)
        available = "[green]yes[/]" if reason is None else f"[red]no[/]: {reason}"
        rows.append([impl.op, impl.name, impl.backend, available, notes, impl.description])
    emit(f"sdbench implementations (availability on {device})",
         ["operation", "name", "backend", "available", "notes", "description"], rows, fmt)


def _print_dispatch(b, gamma, alpha, kv_dim, kv_dtype, dist, gpu) -> None:
    from sdbench import dispatch

    decision, lines = dispatch.explain(b, gamma, alpha, kv_dim, kv_dtype, gpu, dist)
    console.print(f"[bold]verify_pack(impl='auto') for b={b}, γ={gamma}, α={alpha:g}, kv_dim={kv_dim} ({kv_dtype})[/]",
                  highlight=False)
    for line in lines:
        console.print(f"  {line}", highlight=False, markup=False)


# --- doctor ------------------------------------------------------------------------------------
@command("doctor")
def doctor_command(
    json_output: Annotated[bool, typer.Option("--json", help="Print the checks as JSON (for scripts and CI).")] = False,
    env: Annotated[bool, typer.Option("--env", help='Print the export lines that fix what doctor found: eval "$(sdbench doctor --env)".')] = False,
    deep: Annotated[bool, typer.Option("--deep", help="Also run a tiny nsys profile and a tiny ncu profile (10-30 s on a GPU machine).")] = False,
) -> None:
    """Check what this machine can run, each finding PASS / WARN / FAIL with its fix. Exit code 1 on any FAIL.

    A tiny `nsys profile` runs when nsys and a GPU are both present, or with --deep; the ncu counter test runs only with --deep. On a GPU machine the first run builds the CUDA extension (about a minute, cached).
    """
    from sdbench.commands import doctor

    with err_console.status("checking this machine") as status:
        facts = doctor.gather(deep=deep, progress=lambda text: status.update(text))
    checks = doctor.diagnose(facts)
    if json_output:
        typer.echo(doctor.to_json(checks, facts))
    elif env:
        lines = doctor.export_lines(checks)
        typer.echo("# sdbench doctor --env: the exports that fix what doctor found (eval it, or save as setup_env.sh)")
        typer.echo("\n".join(lines) if lines else "# nothing to export: no finding needs an environment change")
    else:
        _print_doctor(checks, facts)
    raise typer.Exit(doctor.exit_code(checks))


def _print_doctor(checks, facts) -> None:
    from rich.markup import escape

    from sdbench.commands import doctor

    styles = {doctor.PASS: "green", doctor.WARN: "yellow", doctor.FAIL: "bold red"}
    table = Table(title="sdbench doctor")
    for column in ("check", "status", "finding", "fix"):
        table.add_column(column, overflow="fold")
    for check in checks:
        table.add_row(check.name, f"[{styles[check.status]}]{check.status}[/]", escape(check.detail), escape(check.fix))
    console.print(table, highlight=False)
    if facts.gpu is None:
        console.print(f"[yellow]{escape(doctor.cpu_only_summary(facts))}[/]", highlight=False)
    if doctor.export_lines(checks):
        console.print('fixes as shell lines: [bold]eval "$(sdbench doctor --env)"[/]')


# --- parity ------------------------------------------------------------------------------------
@command("parity")
def parity_command(
    op: Annotated[str | None, typer.Option(help="Only this operation (default: every operation).")] = None,
    impl: Annotated[str | None, typer.Option(help="Comma-separated implementation names (default: all).")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="A small grid of edge cases (seconds, not minutes).")] = False,
    b: Annotated[str | None, typer.Option("--b", help="Batch sizes, e.g. 1,33,4096 (overrides the grid).")] = None,
    gamma: Annotated[str | None, typer.Option(help="Draft lengths, e.g. 1,31,1024 (overrides the grid).")] = None,
    alpha: Annotated[str | None, typer.Option(help="Acceptance rates in [0, 1] (overrides the grid).")] = None,
    kv_dim: Annotated[str | None, typer.Option(help="KV widths for pack ops (overrides the grid).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda if present).")] = None,
    seed: Annotated[int, typer.Option(help="Base seed; config i uses seed + i.")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also show registers, shared memory and spills per kernel.")] = False,
    fmt: FormatOption = "table",
) -> None:
    """Prove every available implementation bit-exact against the PyTorch reference over a grid.

    Outputs are poisoned before each run. Exit code 1 on any failure.
    """
    import sys

    from rich.progress import Progress

    from sdbench import parity

    plan = parity.plan(
        op, parse_name_list(impl), quick, device,
        batch_sizes=b and parse_int_list(b, "--b", minimum=1), gammas=gamma and parse_int_list(gamma, "--gamma", minimum=1),
        alphas=alpha and parse_float_list(alpha, "--alpha", 0.0, 1.0),
        kv_dims=kv_dim and parse_int_list(kv_dim, "--kv-dim", minimum=1),
    )
    impls, device, total = plan.impls, plan.device, plan.total_configs
    if sys.stderr.isatty():
        with Progress(console=err_console, transient=True) as bar:
            task = bar.add_task("parity", total=total)
            tallies = parity.run_parity(impls, plan.grid, device, seed, progress=lambda: bar.advance(task))
    else:  # a log or a pipe: a plain line every 10% so a long run is visibly alive
        done = [0]

        def line() -> None:
            done[0] += 1
            if done[0] == total or done[0] % max(1, total // 10) == 0:
                err_console.print(f"parity: {done[0]}/{total} configs", highlight=False)

        tallies = parity.run_parity(impls, plan.grid, device, seed, progress=line)
    _print_parity(impls, tallies, device, fmt)
    if verbose:
        _print_ptxas_report()
    if any(t.failed for t in tallies.values()):
        raise typer.Exit(1)


def _print_parity(impls, tallies, device: str, fmt: str = "table") -> None:
    rows = []
    for impl in impls:
        tally = tallies[impl.key]
        skipped = sum(tally.skipped.values())
        reasons = "; ".join(f"{reason} ({n})" for reason, n in tally.skipped.items())
        fail = f"[red]{tally.failed}[/]" if tally.failed else 0
        rows.append([impl.op, impl.name, tally.passed, fail, skipped, reasons])
    emit(f"parity against the PyTorch reference ({device})",
         ["operation", "implementation", "pass", "fail", "skip", "skip reasons"], rows, fmt)
    for impl in impls:
        if tallies[impl.key].first_failure:
            console.print(f"[red]first failure of {impl.op}/{impl.name}:[/] {tallies[impl.key].first_failure}")


def _print_ptxas_report() -> None:
    try:
        from sdbench import ext

        rows = ext.ptxas_report()
    except Exception as err:  # the report is extra information; never fail parity over it
        console.print(f"no ptxas report: {err}")
        return
    table = Table(title="ptxas resource usage per kernel")
    for column in ("kernel", "registers", "shared memory (B)", "spill stores (B)", "spill loads (B)"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row.get(column, "")) for column in
                        ("kernel", "registers", "shared_bytes", "spill_store_bytes", "spill_load_bytes")))
    console.print(table)


# --- sweep -------------------------------------------------------------------------------------
@command("sweep")
def sweep_command(
    preset: Annotated[str | None, typer.Option(help="A published grid: main, gamma-sensitivity, fused, quick, scale, scale-kv, scale-pack (options below override it).")] = None,
    b: Annotated[str | None, typer.Option("--b", help="Batch sizes (default: 1,4,16,32).")] = None,
    gamma: Annotated[str | None, typer.Option(help="Draft lengths γ (default: 8,64,128).")] = None,
    alpha: Annotated[str | None, typer.Option(help="Acceptance rates in [0, 1] (default: 0.3,0.6,0.9).")] = None,
    kv_dim: Annotated[str | None, typer.Option(help="KV widths, pack / verify_pack only (default: 128,512,1024,2048).")] = None,
    points: Annotated[str | None, typer.Option(help="Configs b:γ:α[:kv_dim], comma-separated, in place of the --b × --gamma × --alpha × --kv-dim grid, e.g. a grid's near-bar configs swept again with --placements into its folder.")] = None,
    vocab: Annotated[str | None, typer.Option(help="Vocabulary sizes; prob_verify and prob_verify_ragged sweep them (default: 32000).")] = None,
    impl: Annotated[str | None, typer.Option(help="Comma-separated implementation names (default: every one of --op).")] = None,
    op: Annotated[str | None, typer.Option(help="verify, pack, verify_pack, prob_verify, verify_ragged, verify_pack_ragged or prob_verify_ragged (default: verify).")] = None,
    dist: Annotated[str | None, typer.Option(help="Accepted-length distribution: binomial, geometric, fixed (--fixed-length), trace (--trace: k_i drawn from it), trace-rounds (one recorded round in batch order) or trace-rounds-sorted (that round sorted: the best batch order) (default: binomial).")] = None,
    fixed_length: Annotated[int | None, typer.Option(help="--dist fixed: every sequence accepts this many draft tokens.")] = None,
    draft_lengths: Annotated[str | None, typer.Option(help="--op verify_ragged / verify_pack_ragged / prob_verify_ragged: draft lengths γ_i uniform in [0, γ], full (all γ) or bimodal (γ or 1) (default: uniform).")] = None,
    trace: Annotated[str | None, typer.Option(help="--dist trace: a file of observed accepted lengths (integers).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda if present).")] = None,
    out: Annotated[str, typer.Option(help="Results folder: one parquet part per config.")] = "results",
    warmup: Annotated[int | None, typer.Option(help="Untimed iterations per view (default: 20).")] = None,
    iters: Annotated[int | None, typer.Option(help="Timed iterations per view, every sample kept (default: 200).")] = None,
    cold_l2: Annotated[bool, typer.Option("--cold-l2", help="Flush L2 (read a buffer of 2x its size, leaving it clean) before every iteration, untimed.")] = False,
    shard: Annotated[str | None, typer.Option(help="i/n: run every n-th config starting at i (0-based), e.g. for SLURM arrays.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Skip configs already written to --out.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed of every config's inputs (default: 0).")] = None,
    run_id: Annotated[str | None, typer.Option(help="Run id shared by the rows (give shards the same one).")] = None,
    token_dtype: Annotated[str | None, typer.Option(help="Token dtypes: int64, int32 (default: int64).")] = None,
    kv_dtype: Annotated[str | None, typer.Option(help="KV dtypes: float16, bfloat16 (default: float16).")] = None,
    prob_dtype: Annotated[str | None, typer.Option(help="prob_verify / prob_verify_ragged probability dtypes: float32, bfloat16 (default: float32).")] = None,
    max_noise: Annotated[float | None, typer.Option(help="wall/graph: keep sampling while the median's relative standard error is above this (default 0.01).")] = None,
    max_time: Annotated[float | None, typer.Option(help="...for at most this many seconds per view and config (default 0.5; 0: exactly --iters samples).")] = None,
    min_time: Annotated[float | None, typer.Option(help="wall/graph: sample at least this many seconds per view and config, noisy or not (default 0; at most --max-time).")] = None,
    views: Annotated[str | None, typer.Option(help="Views to measure, e.g. gpu,graph (default: every view of the device: wall, graph, gpu on CUDA).")] = None,
    host_tolerance: Annotated[float | None, typer.Option(help="wall: a config whose launch floor is more than this above the sweep's lowest of its path ran in a slow host state; its wall view is measured again at the end, and flagged noisy if still slow (default 0.15).")] = None,
    placements: Annotated[int | None, typer.Option(help="Copies of each config's workload, each in fresh memory, every implementation timed on each (rows say which: `placement`); the report, compare and calibrate-tau count each copy once. Where buffers land moved the scan kernel's copy by up to 9% on an H200. Use 3 or more: two copies cannot tell an interval their spread (default 1).")] = None,
    fmt: FormatOption = "table",
) -> None:
    """Time every implementation over a grid (parity first) and write parquet rows per config and view.

    Views on CUDA: wall (events around eager calls), graph (cost inside a CUDA graph: copies per replay,
    host launch latency excluded), gpu (CUPTI kernel time); on the CPU: cpu (host clock). Each config also
    times an empty kernel per launch path: the launch floors.
    """
    from pathlib import Path

    from rich import progress

    from sdbench.commands import sweep

    shard_index, shard_count = sweep.parse_shard(shard) if shard is not None else (None, None)
    if points is not None and any(given is not None for given in (b, gamma, alpha, kv_dim)):
        raise SdbenchError("--points gives whole configs: leave out --b, --gamma, --alpha and --kv-dim with it")
    spec = sweep.build_spec(
        preset,
        points=points and sweep.parse_points(points),
        batch_sizes=b and parse_int_list(b, "--b", minimum=1),
        gammas=gamma and parse_int_list(gamma, "--gamma", minimum=1),
        alphas=alpha and parse_float_list(alpha, "--alpha", 0.0, 1.0),
        kv_dims=kv_dim and parse_int_list(kv_dim, "--kv-dim", minimum=1),
        vocab_sizes=vocab and parse_int_list(vocab, "--vocab", minimum=2),
        impls=parse_name_list(impl) or None, op=op, dist=dist, fixed_length=fixed_length, trace_path=trace,
        draft_lengths=draft_lengths,
        device=device or default_device(), out_dir=Path(out), warmup=warmup, iters=iters, cold_l2=cold_l2 or None, shard_index=shard_index,
        shard_count=shard_count, resume=resume or None, seed=seed, run_id=run_id,
        token_dtypes=parse_name_list(token_dtype) or None, kv_dtypes=parse_name_list(kv_dtype) or None,
        prob_dtypes=parse_name_list(prob_dtype) or None, max_noise=max_noise, max_time=max_time,
        min_time=min_time, host_tolerance=host_tolerance, views=parse_name_list(views) or None, placements=placements,
    )
    sweep.validate(spec)  # bad input fails here, before the progress bar draws
    sweep.check_op_available(spec.op)
    columns = (
        progress.TextColumn("{task.description}"), progress.BarColumn(), progress.MofNCompleteColumn(),
        progress.TimeElapsedColumn(), progress.TextColumn("eta"), progress.TimeRemainingColumn(),
    )
    with progress.Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("sweep", total=None)

        def show(update: sweep.SweepProgress) -> None:
            bar.update(task, total=update.total, completed=update.done, description=update.current or "sweep")

        summary = sweep.run_sweep(spec, progress=show)
    _print_sweep_summary(summary, fmt)
    if summary.interrupted:
        raise typer.Exit(130)
    if summary.measured and not summary.timed_rows:
        raise typer.Exit(1)


def _print_sweep_summary(summary, fmt: str = "table") -> None:
    title = (
        f"sweep {summary.run_id} on {summary.device}: {summary.measured} configs measured"
        f"{f', {summary.skipped} already present' if summary.skipped else ''} -> {summary.out_dir}"
    )
    statuses = ("ok", "failed", "unavailable", "error")
    rows = []
    for name in summary.impls:
        counts = summary.statuses[name]
        cells = [counts.get(status, 0) for status in statuses]
        for view in summary.views:
            median = summary.median_of_medians(name, view)
            cells.append("-" if median is None else f"{median:.1f}")
        rows.append([name, *cells])
    emit(title, ["implementation", *statuses, *(f"{view} µs" for view in summary.views)], rows, fmt, identifiers=1)
    if fmt == "table":
        console.print("µs: median over configs of each config's median", highlight=False)
    if summary.host_remeasured:
        err_console.print(
            f"host state (wall): {summary.host_remeasured} configs ran with a launch floor more than the tolerance "
            f"above the sweep's lowest and were measured again ({summary.host_kept} faster the second time); "
            f"{summary.host_slowed_configs} stayed slow, their wall rows flagged noisy (host_slowed)", highlight=False)
    if summary.interrupted:
        err_console.print(
            f"[yellow]interrupted:[/] {summary.measured} finished configs kept in {summary.out_dir}; "
            f"{summary.remaining} left (rerun with --resume to finish)"
        )
    if summary.measured and (summary.failed_rows or not summary.timed_rows):
        headline = ("[bold red]no row was timed[/]" if not summary.timed_rows else
                    f"[yellow]{summary.failed_rows} rows failed or raised[/] ({summary.timed_rows} timed)")
        err_console.print(f"{headline}; why, by reason:", highlight=False)
        for reason, names in summary.reasons.items():
            if not summary.timed_rows or not reason.startswith("unavailable"):
                err_console.print(f"  {', '.join(names)}: {reason}", highlight=False, markup=False)


# --- profile -----------------------------------------------------------------------------------
def _one_number(text: str, option: str, parse, **limits):
    """A single value through the shared list parsers (profile measures one config)."""
    values = parse(text, option, **limits)
    if len(values) != 1:
        raise SdbenchError(f"{option}: profile takes one value, got {len(values)} ({text}); use `sdbench sweep` for grids")
    return values[0]


@command("profile")
def profile_command(
    impl: Annotated[str | None, typer.Option(help="Comma-separated implementation names (default: every one that runs here).")] = None,
    op: Annotated[str, typer.Option(help="verify, pack or verify_pack.")] = "verify",
    b: Annotated[str, typer.Option("--b", help="Batch size.")] = "32",
    gamma: Annotated[str, typer.Option(help="Draft length γ.")] = "128",
    alpha: Annotated[str, typer.Option(help="Acceptance rate in [0, 1].")] = "0.9",
    kv_dim: Annotated[str, typer.Option(help="KV width (pack ops; 0 = no KV).")] = "0",
    dist: Annotated[str, typer.Option(help="Accepted-length distribution: binomial or geometric.")] = "binomial",
    tool: Annotated[str, typer.Option(help="auto, nsys, ncu or torch (auto: best timing tool + ncu counters when readable).")] = "auto",
    out: Annotated[str, typer.Option(help="Results folder: writes <out>/profile-<run id>/ (parquet + tool reports).")] = "results",
    warmup: Annotated[int, typer.Option(help="Untimed calls before the wall timing and before each profile.")] = 20,
    iters: Annotated[int, typer.Option(help="Timed calls for the host wall median.")] = 200,
    profile_iters: Annotated[int, typer.Option(help="Calls recorded by torch / nsys (ncu records 2).")] = 10,
    seed: Annotated[int, typer.Option(help="Seed of the inputs.")] = 0,
) -> None:
    """Decompose host wall time into launch overhead + GPU time, per kernel and per implementation.

    GPU time comes from nsys or torch.profiler (CUPTI); ncu adds warp efficiency, branch uniformity, achieved occupancy and DRAM throughput per kernel. Writes <out>/profile-<run id>/. See docs/profiling.md.
    """
    from sdbench.commands import profile
    from sdbench.ops.workload import VerifyConfig

    config = VerifyConfig(
        batch_size=_one_number(b, "--b", parse_int_list, minimum=1),
        gamma=_one_number(gamma, "--gamma", parse_int_list, minimum=1),
        alpha=_one_number(alpha, "--alpha", parse_float_list, low=0.0, high=1.0),
        kv_dim=_one_number(kv_dim, "--kv-dim", parse_int_list, minimum=0),
        dist=dist, seed=seed,
    )
    request = profile.ProfileRequest(
        op=op, impls=tuple(parse_name_list(impl)), config=config, tool=tool, warmup=warmup, iters=iters,
        profiled_iters=profile_iters, out_dir=out,
    )
    with console.status("profiling") as status:
        report = profile.run_profile(request, progress=lambda text: status.update(f"profiling {text}"))
    _print_profile(report)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _print_profile(report) -> None:
    from rich.markup import escape

    from sdbench.commands import profile

    cfg, choice = report.request.config, report.choice
    counters_from = " + ncu counters" if choice.counters and choice.timing != "ncu" else ""
    title = (f"{report.request.op}: b={cfg.batch_size}, γ={cfg.gamma}, α={cfg.alpha}, kv_dim={cfg.kv_dim} — "
             f"host wall = launch overhead + GPU time (GPU time from {choice.timing}{counters_from})")
    table = Table(title=title, caption="µs per call; wall: median of CUDA-event pairs around each call; "
                  "overhead = wall - GPU; launches: device operations per call")
    for column in ("implementation", "wall µs", "GPU µs", "overhead µs", "overhead %", "launches"):
        table.add_column(column, justify="left" if column == "implementation" else "right")
    for p in report.impls:
        share = None if p.launch_overhead_us is None or not p.wall_us else 100.0 * p.launch_overhead_us / p.wall_us
        launches = "-" if p.launches_per_iter is None else f"{p.launches_per_iter:g}"
        table.add_row(p.impl, _us(p.wall_us), _us(p.gpu_us), _us(p.launch_overhead_us),
                      "-" if share is None else f"{share:.0f}", launches)
    console.print(table)
    kernels = Table(title="kernels per call")
    for column in ("implementation", "kernel", "calls", "GPU µs", "% of GPU"):
        kernels.add_column(column, overflow="fold")
    for profiled in report.impls:
        for kernel in profiled.kernels:
            share = ("-" if not profiled.gpu_us or kernel.gpu_us is None
                     else f"{100.0 * kernel.gpu_us / profiled.gpu_us:.0f}")
            kernels.add_row(profiled.impl, escape(kernel.short_name), f"{kernel.calls_per_iter:g}", _us(kernel.gpu_us),
                            share)
    console.print(kernels)
    if any(p.counters for p in report.impls):
        counters = Table(title="ncu counters per kernel (means over launches; ncu µs are replayed at base clocks)")
        for column in ("implementation", "kernel", "calls", "ncu µs", "warp efficiency %", "branch uniformity %",
                       "achieved occupancy %", "DRAM % of peak"):
            counters.add_column(column, overflow="fold")
        for profiled in report.impls:
            for kernel in profiled.counters:
                cells = [profile.warp_efficiency_pct(kernel)] + [kernel.metrics.get(metric) for metric in
                                                                 list(profile.COUNTER_COLUMNS)[1:]]
                counters.add_row(profiled.impl, escape(kernel.short_name), f"{kernel.calls_per_iter:g}",
                                 _us(kernel.gpu_us), *("-" if v is None else f"{v:.1f}" for v in cells))
        console.print(counters)
    for tool_name, why in choice.skipped:
        console.print(f"[dim]not used: {tool_name}: {escape(str(why))}[/]", highlight=False)
    for name, why in report.skipped_impls:
        console.print(f"[dim]skipped implementation {name}: {escape(why)}[/]", highlight=False)
    for note in report.notes:
        console.print(f"[yellow]{escape(note)}[/]", highlight=False)
    for p in report.impls:
        for problem in (p.error, p.counters_error):
            if problem:
                console.print(f"[red]{p.impl}:[/] {escape(problem)}", highlight=False)
    console.print(f"rows -> {report.parquet_path}")


# --- report ------------------------------------------------------------------------------------
@command("report")
def report_command(
    results: Annotated[list[str], typer.Argument(help="Parquet files or folders from `sdbench sweep` (with --compare: A then B).")],
    where: Annotated[list[str] | None, typer.Option("--where", help="Keep rows where COLUMN OP VALUE, OP one of = != < > <= >= (repeatable; = takes a comma list), e.g. gamma=128.")] = None,
    impl: Annotated[str | None, typer.Option(help="Comma-separated implementations to show (speedups still use the baseline and peers).")] = None,
    baseline: Annotated[str, typer.Option(help="Implementation the speedup column is quoted against.")] = "torch_eager",
    view: Annotated[str | None, typer.Option(help="View the speedups use: wall, graph, gpu or cpu (default: wall, else cpu).")] = None,
    out: Annotated[str | None, typer.Option(help="Write report.md, PNG plots and a self-contained report.html into this folder.")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="Compare two results A B: per-config B/A with bootstrap intervals.")] = False,
    threshold: Annotated[float, typer.Option(help="--compare: smallest |B/A - 1| flagged as a change.")] = 0.05,
    seed: Annotated[int, typer.Option(help="--compare: bootstrap seed.")] = 0,
    against_floor: Annotated[bool, typer.Option("--against-floor", help="--compare: each row as a multiple of its own launch floor in its own run (what repeats when the host's launch cost drifts between sessions).")] = False,
    host_tolerance: Annotated[float | None, typer.Option(help="--compare: a wall row whose own launch floor moved more than this between A and B is NOISY: the host was in another state (default 0.15).")] = None,
    ceiling_gbps: Annotated[float | None, typer.Option(help="Copy-bandwidth ceiling in GB/s (default: the GPU's profile, else the best achieved).")] = None,
    max_rows: Annotated[int, typer.Option(help="Rows per table printed here (report.md holds them all).")] = 60,
    table: Annotated[str | None, typer.Option("--table", help="Only the tables whose title contains this (e.g. latency).")] = None,
    trace: Annotated[list[str] | None, typer.Option("--trace", help="Accepted-length traces (`sdbench e2e --trace-out`): histogram against binomial and geometric fits (repeatable).")] = None,
    trace_gamma: Annotated[int | None, typer.Option(help="--trace: the draft length γ the trace was recorded at (default: the e2e results' γ when they hold one, else the largest k).")] = None,
    fmt: FormatOption = "table",
) -> None:
    """Tables (and with --out, plots and HTML) from sweep and e2e results; --compare A B hunts regressions."""
    from pathlib import Path

    from sdbench.commands import report
    from sdbench.commands.report import e2e

    wheres = [report.parse_where(text) for text in where or []]
    if compare:
        _report_compare(results, wheres, threshold, seed, out, max_rows, against_floor, host_tolerance)
        return
    sweep_paths, e2e_files = e2e.split_paths(results)
    extra = _e2e_tables(e2e_files, trace or [], trace_gamma)
    built = None
    if sweep_paths or not extra:
        built = report.build_report(sweep_paths or results, wheres, parse_name_list(impl) or None, baseline, view,
                                    ceiling_gbps)
        built.tables.extend(extra)
    tables = report.select_tables(built, table) if built is not None else [
        shown for shown in extra if table is None or table.lower() in shown.title.lower()]
    if fmt != "table":  # machine-readable: the tables alone, every row
        for shown in tables:
            if fmt == "md":
                console.print(shown.markdown(), end="", highlight=False, markup=False, soft_wrap=True)
            else:
                emit(shown.title, shown.columns, shown.rows, fmt, identifiers=3)
    else:
        for note in built.notes if built is not None else []:
            console.print(f"[dim]{note}[/]", highlight=False)
        for shown in tables:
            console.print(shown.rich(max_rows=max_rows))
    if out is None:
        return
    if built is None:  # e2e results alone: one markdown page
        folder = writable_folder(Path(out), "--out")
        (folder / "e2e.md").write_text("# sdbench report: end to end\n\n" + "\n".join(shown.markdown() for shown in extra))
        _say(fmt, f"wrote {folder / 'e2e.md'}")
        return
    from sdbench.commands.report import page

    written = page.write_report(built, Path(out))
    _say(fmt, f"wrote {len(written)} files to {out}: report.md, report.html and {len(written) - 2} plots")


def _say(fmt: str, message: str) -> None:
    """A status line: on stdout for the rich table, on stderr when stdout is machine-readable."""
    if fmt == "table":
        console.print(message)
    else:
        typer.echo(message, err=True)


def _e2e_tables(e2e_files: list[str], traces: list[str], trace_gamma: int | None) -> list:
    from pathlib import Path

    from sdbench.commands.report import e2e

    tables = []
    gammas: list[int] = []
    if e2e_files:
        frame = e2e.read_e2e(e2e_files)
        tables.append(e2e.step_table(frame))
        gammas = sorted(set(frame["gamma"].to_list()))
    for path in traces:
        lengths = e2e.read_lengths(path)
        gamma = trace_gamma or (gammas[0] if len(gammas) == 1 else max(lengths))
        tables.append(e2e.acceptance_table(lengths, gamma, Path(path).name))
    return tables


def _report_compare(results: list[str], wheres, threshold: float, seed: int, out: str | None, max_rows: int,
                    against_floor: bool = False, host_tolerance: float | None = None) -> None:
    from pathlib import Path

    from sdbench.commands.report import compare

    found, notes = compare.compare_runs(results, wheres, threshold=threshold, seed=seed, against_floor=against_floor,
                                        host_tolerance=host_tolerance)
    table = compare.compare_table(found, notes, results[0], results[1], threshold, against_floor=against_floor)
    console.print(table.rich(max_rows=max_rows))
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "compare.md").write_text(table.markdown())
        console.print(f"wrote {Path(out) / 'compare.md'}")


# --- calibrate-tau -----------------------------------------------------------------------------
@command("calibrate-tau")
def calibrate_tau_command(
    results: Annotated[list[str] | None, typer.Argument(help="verify_pack sweep results (default: run a mini-sweep on this GPU).")] = None,
    impls: Annotated[str | None, typer.Option(help="Comma-separated implementations to race per size (default: fused, fused_scan, ballot+pack_cuda, ballot+pack_scan: those the results hold).")] = None,
    small: Annotated[str | None, typer.Option(help="Fit one τ between two instead: the implementation that wins on small work (default with --large: fused_single_block).")] = None,
    large: Annotated[str | None, typer.Option(help="... and the one that wins on large work (default with --small: ballot+pack_torch).")] = None,
    tolerance: Annotated[float, typer.Option(help="Per-size race: merge segments while the rule costs at most this much over the best byte rule (geometric mean over configs).")] = 0.01,
    view: Annotated[str, typer.Option(help="Timing view to fit on: wall (what a caller waits for), graph or gpu.")] = "wall",
    gpu: Annotated[str | None, typer.Option(help="The GPU to calibrate when the results hold several (its gpu_name).")] = None,
    profiles: Annotated[str | None, typer.Option(help="Folder to write <gpu-slug>.toml into (default: profiles/).")] = None,
    sweep_out: Annotated[str, typer.Option(help="Where the mini-sweep writes its results when none are given.")] = "results/calibrate-tau",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Fit and print, but write no profile.")] = False,
    seed: Annotated[int, typer.Option(help="Bootstrap seed (τ band).")] = 0,
    copy_gbps: Annotated[float | None, typer.Option(help="Offline: the GPU's device-to-device copy bandwidth in GB/s (bytes read + written), measured on that GPU (calibrate_tau.copy_ceiling_gbps); the profile's copy ceiling, which the report's floors read. Default: measured here on a GPU of the results' kind, else the replaced profile's measured one, else the results' best achieved.")] = None,
) -> None:
    """Which verify_pack implementation wins at each size of accepted KV: a per-size rule (or, with
    --small/--large, one threshold τ between two), written to the GPU's profile for impl="auto"."""
    from sdbench.commands import calibrate_tau as tau

    pair = small is not None or large is not None
    names = parse_name_list(impls)
    options = dict(impls=names or None, small=small, large=large, view=view, gpu_name=gpu, profiles_dir=profiles,
                   write=not dry_run, seed=seed, tolerance=tolerance, copy_gbps=copy_gbps)
    if results:
        result = tau.calibrate(results, **options)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from sdbench.commands import sweep

        raced = [small or tau.DEFAULT_SMALL, large or tau.DEFAULT_LARGE] if pair else names or list(tau.DEFAULT_CANDIDATES)
        err_console.print(f"no results given: measuring {', '.join(raced)} on this GPU (mini-sweep into {sweep_out})")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            task = bar.add_task("calibration sweep", total=None)

            def show(update) -> None:
                bar.update(task, total=update.total, completed=update.done, description=update.current or "sweep")

            swept = sweep.run_calibration_sweep(sweep_out, raced, progress=show,
                                                grid=sweep.CALIBRATION_GRID if pair else sweep.RACE_GRID)
        result = tau.calibrate([swept], **options, swept=swept)
    if isinstance(result.fit, tau.TauFit):
        console.print(_tau_table(result.fit, result.profile.gpu_name, view))
    else:
        console.print(_race_table(result.fit, result.profile.gpu_name, view))
        console.print(_segments_table(result.fit))
    if result.swept is not None:
        console.print(f"mini-sweep results: {result.swept}")
    if result.superseded:
        console.print(f"{result.superseded} config(s) timed on one copy and again on several (sweep --placements): "
                      "only the copies' rows were read for them", highlight=False)
    console.print(result.fit.message(), highlight=False)
    if result.fused is not None:
        console.print(result.fused.message(), highlight=False)
    console.print(f"[bold]{result.profile.rule()}[/]", highlight=False)
    if not tau.copy_ceiling_is_measured(result.profile.copy_bandwidth_source):
        err_console.print(f"note: no copy ceiling was measured, so the profile's is the results' best achieved "
                          f"({result.profile.copy_bandwidth_gbps:.0f} GB/s; warm-L2 rows can beat a DRAM copy): "
                          "give the one measured on that GPU with --copy-gbps", highlight=False)
    if result.path is not None:
        console.print(f"wrote {result.path}")


def _config_cell(point) -> str:
    return ", ".join(str(value) for value in point.config[1:5])  # (b, γ, α, kv_dim) of the config key


def _tau_table(fit, gpu_name: str, view: str) -> Table:
    from sdbench.thresholds import format_bytes

    table = Table(title=f"{fit.small} vs {fit.large} on {gpu_name} ({view} view, µs)")
    for column in ("accepted KV", "config (b, γ, α, kv_dim)", fit.small, fit.large, "rule picks", "faster"):
        table.add_column(column, justify="right")
    for point in fit.points:
        picked = fit.small if point.kv_bytes < fit.tau_bytes else fit.large
        faster = fit.small if point.small_us < point.large_us else fit.large
        table.add_row(format_bytes(point.kv_bytes), _config_cell(point), f"{point.small_us:.1f}", f"{point.large_us:.1f}",
                      picked, faster if faster == picked else f"[red]{faster}[/]")
    return table


def _race_table(fit, gpu_name: str, view: str) -> Table:
    """Every config: each raced median, the rule's pick (red when neither the fastest nor within noise of it),
    and fused over the best sync-free two-step (red above 1.03)."""
    from sdbench.commands import calibrate_tau as tau
    from sdbench.thresholds import format_bytes

    two_steps = tau.sync_free_two_steps(fit.impls) if tau.FUSED in fit.impls else []
    table = Table(title=f"{len(fit.impls)} implementations per size on {gpu_name} ({view} view, µs)")
    for column in ("accepted KV", "config (b, γ, α, kv_dim)", *fit.impls):
        table.add_column(column, justify="right")
    for column in ("rule picks", "fastest"):
        table.add_column(column, no_wrap=True)  # names the user types next: never folded
    if two_steps:
        table.add_column(f"{tau.FUSED} ÷ best two-step", justify="right")
    for point in fit.points:
        picked = fit.rule_impl(point)
        cells = [format_bytes(point.kv_bytes), _config_cell(point), *(f"{point.median_us[impl]:.1f}" for impl in fit.impls),
                 picked if picked == point.fastest or point.tied(picked) else f"[red]{picked}[/]", point.fastest]
        if two_steps:
            best = min(two_steps, key=point.median_us.__getitem__)
            ratio = point.median_us[tau.FUSED] / point.median_us[best]
            cells.append(f"{ratio:.2f}" if ratio <= tau.FUSED_PARITY else f"[red]{ratio:.2f}[/]")
        table.add_row(*cells)
    return table


def _segments_table(fit) -> Table:
    """The rule, segment by segment, with what each costs against the per-config best."""
    from sdbench.thresholds import format_bytes

    caption = (f"the rule costs {fit.geomean_loss:+.1%} over the per-config best (geometric mean; the finest byte "
               f"rule: {fit.best_rule_loss:+.1%}), {fit.total_loss:+.1%} in total latency; loss beyond noise with at most 1, 2, "
               f"... segments: {', '.join(f'{loss:+.1%}' for loss in fit.loss_by_count[:12])}")
    if fit.dropped or fit.absent:
        caption += "; " + "; ".join(
            ([f"{fit.dropped} configs lack some candidate"] if fit.dropped else [])
            + ([f"not in these results: {', '.join(fit.absent)}"] if fit.absent else []))
    table = Table(title=f"per-size rule ({len(fit.segments)} segments, tolerance {fit.tolerance:.1%})", caption=caption)
    table.add_column("segment (accepted KV)", justify="right")
    table.add_column("impl", no_wrap=True)
    for column in ("configs", "wins", "within noise", "worst loss", "at"):
        table.add_column(column, justify="right")
    for segment in fit.segments:
        worst = segment.worst
        table.add_row(f"[{format_bytes(segment.low_bytes)}, {format_bytes(segment.high_bytes)})", segment.impl,
                      str(len(segment.points)), str(segment.wins), str(segment.ties),
                      f"{worst.ratio(segment.impl) - 1:+.1%}", f"{format_bytes(worst.kv_bytes)} ({_config_cell(worst)})")
    return table


# --- e2e ---------------------------------------------------------------------------------------
@command("e2e")
def e2e_command(
    target: Annotated[str | None, typer.Option(help="Local HuggingFace causal LM folder (with --draft); default: the built-in pair.")] = None,
    draft: Annotated[str | None, typer.Option(help="Local draft model folder sharing the target's tokenizer.")] = None,
    verify_impl: Annotated[str | None, typer.Option(help="Comma-separated verify (greedy) or prob_verify (--temperature > 0) implementations (default: torch_eager).")] = None,
    gamma: Annotated[int, typer.Option(help="Draft tokens per round.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Sequences decoded together.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per sequence.")] = 64,
    temperature: Annotated[float, typer.Option(help="0: greedy (verify); > 0: sampling (prob_verify).")] = 0.0,
    prompt: Annotated[list[str] | None, typer.Option(help="A prompt (repeatable; cycled to the batch).")] = None,
    sort_by_acceptance: Annotated[bool, typer.Option("--sort-by-acceptance", help="Order sequences by their acceptance EMA before verifying.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of prompts, sampling and the built-in pair.")] = 0,
    device: Annotated[str, typer.Option(help="cuda, cpu or auto.")] = "auto",
    dtype: Annotated[str, typer.Option(help="Model dtype: float32, bfloat16, float16.")] = "float32",
    peers: Annotated[bool, typer.Option("--peers/--no-peers", help="Also time the target alone.")] = True,
    hf_assisted: Annotated[bool, typer.Option("--hf-assisted/--no-hf-assisted", help="Also time HuggingFace assisted generation (batch 1).")] = True,
    out: Annotated[str | None, typer.Option(help="Parquet file for the rows (docs/e2e.md has the schema).")] = None,
    trace_out: Annotated[str | None, typer.Option(help="Write every round's accepted lengths here (for sweep --dist trace).")] = None,
    builtin_steps: Annotated[int | None, typer.Option(help="Training steps of the built-in pair (default: its recipe's).")] = None,
) -> None:
    """Batched speculative decoding end to end, with every verify implementation inside the loop."""
    from rich import progress

    from sdbench.e2e import E2EOptions, run_e2e

    columns = (progress.TextColumn("{task.description}"), progress.BarColumn(), progress.MofNCompleteColumn(),
               progress.TimeElapsedColumn())
    with progress.Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("e2e", total=None)

        def show(what: str, done: int, total: int) -> None:
            bar.update(task, description=what, completed=done, total=total)

        options = E2EOptions(
            target=target, draft=draft, verify_impls=tuple(parse_name_list(verify_impl)) or ("torch_eager",),
            gamma=gamma, batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature,
            prompts=tuple(prompt) if prompt else None, sort_by_acceptance=sort_by_acceptance, seed=seed,
            device=device, dtype=dtype, peers=peers, hf_assisted=hf_assisted, out=out, trace_out=trace_out,
            builtin_steps=builtin_steps, progress=show,
        )
        result = run_e2e(options)
    table = Table(title=f"e2e: b={batch_size}, γ={gamma}, T={temperature}")
    for column in ("method", "verify impl"):
        table.add_column(column, no_wrap=True)  # names the user types next: never folded
    for column in ("tokens/s", "mean k", "target fwd/token", "verify share", "= target"):
        table.add_column(column, overflow="fold")
    for row in result.rows:
        step, verify_us = row.get("step_us"), row.get("verify_us")
        share = f"{verify_us / step:.1%}" if step and verify_us == verify_us and step == step else "-"
        mean_k = row.get("mean_accepted_length")
        table.add_row(row["method"], row.get("verify_impl") or "-", f"{row['tokens_per_s']:.0f}",
                      "-" if mean_k is None or mean_k != mean_k else f"{mean_k:.2f}",
                      f"{row['target_forwards_per_token']:.3f}" if row.get("target_forwards_per_token") == row.get("target_forwards_per_token") else "-",
                      share, {True: "yes", False: "NO", None: "-"}[row.get("matches_target")])
    console.print(table)
    if result.pair_metrics:
        metrics = result.pair_metrics
        console.print(f"built-in pair: held-out loss target {metrics.get('target_held_out_loss', float('nan')):.3f}, "
                      f"draft {metrics.get('draft_held_out_loss', float('nan')):.3f}; greedy acceptance "
                      f"{metrics.get('greedy_acceptance_rate', float('nan')):.2f}", highlight=False)
    for path in (result.parquet_path, result.trace_path):
        if path is not None:
            console.print(f"wrote {path}")


# --- end of commands ---------------------------------------------------------------------------


def main() -> None:
    """Console-script entry point."""
    app()


# --- asbs ------------------------------------------------------------------------------------------
@command("asbs")
def asbs_command(
    batch: Annotated[int, typer.Option(help="Requests (the four acceptance profiles in turn).")] = 32,
    target_len: Annotated[int, typer.Option(help="Tokens each request generates.")] = 256,
    capacity_pages: Annotated[int | None, typer.Option(help="KV capacity in pages of 16 (default: 90% of what max blocks need).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the acceptance hash.")] = 0,
    time_rounds: Annotated[str | None, typer.Option("--time", help="On a GPU: also time the persistent loop, a host loop and a CUDA graph per round for these round counts (e.g. 10,100,1000) and write --out.")] = None,
    out: Annotated[str, typer.Option(help="CSV for --time.")] = "results/asbs.csv",
) -> None:
    """Adaptive speculative block sizing: fixed block sizes against ASBS (the simulator, docs/asbs.md); with
    --time, the per-round cost of the launch-once loop on this GPU (csrc/asbs_loop.cu)."""
    from pathlib import Path

    from sdbench.asbs.__main__ import main as simulate_main

    args = ["--batch", str(batch), "--target-len", str(target_len), "--seed", str(seed)]
    if capacity_pages is not None:
        args += ["--capacity-pages", str(capacity_pages)]
    simulate_main(args)
    if time_rounds is None:
        return
    import torch

    if not torch.cuda.is_available():
        raise SdbenchError("--time needs a CUDA device: the loop under test is a CUDA kernel")
    from sdbench.commands import asbs_bench

    writable_folder(Path(out).parent, "--out")
    asbs_bench.main(["--out", out, "--b", str(batch), "--rounds", time_rounds])
    console.print(f"wrote {out}")
