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

from sdbench.errors import SdbenchError, closest

app = typer.Typer(
    name="sdbench",
    help="Benchmark the verification step of batched speculative decoding on NVIDIA GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


@app.callback()
def _root() -> None:
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


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


# --- list --------------------------------------------------------------------------------------
@command("list")
def list_command(
    op: Annotated[str | None, typer.Option(help="Only this operation (verify, pack, verify_pack, prob_verify).")] = None,
    device: Annotated[str | None, typer.Option(help="Check availability on this device (default: cuda if present).")] = None,
) -> None:
    """List every registered implementation, where it runs, and why it cannot run here."""
    from sdbench import registry

    if op is not None and op not in registry.OPERATIONS:
        registry.get(op, "")  # raises the one-line error with a suggestion
    device = device or default_device()
    table = Table(title=f"sdbench implementations (availability on {device})")
    for column in ("operation", "name", "backend", "available", "notes", "description"):
        table.add_column(column)
    for impl in registry.implementations(op):
        reason = impl.unavailable_reason(device)
        notes = ", ".join(word for word, flag in (("syncs", impl.sync), ("peer", impl.peer)) if flag)
        available = "[green]yes[/]" if reason is None else f"[red]no[/]: {reason}"
        table.add_row(impl.op, impl.name, impl.backend, available, notes, impl.description)
    console.print(table)


# --- doctor ------------------------------------------------------------------------------------
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
) -> None:
    """Prove every available implementation bit-exact against the PyTorch reference over a grid.

    Outputs are poisoned before each run. Exit code 1 on any failure.
    """
    import dataclasses

    from rich.progress import Progress

    from sdbench import parity, registry

    device = _check_device(device)
    grid = parity.QUICK_GRID if quick else parity.ParityGrid()
    overrides = {
        "batch_sizes": b and parse_int_list(b, "--b", minimum=1),
        "gammas": gamma and parse_int_list(gamma, "--gamma", minimum=1),
        "alphas": alpha and parse_float_list(alpha, "--alpha", 0.0, 1.0),
        "kv_dims": kv_dim and parse_int_list(kv_dim, "--kv-dim", minimum=1),
    }
    grid = dataclasses.replace(grid, **{k: tuple(v) for k, v in overrides.items() if v})
    if op is not None:
        registry.get(op, "torch_eager")  # validates the operation name with a suggestion
    impls = [i for o in ([op] if op else registry.OPERATIONS) for i in registry.implementations(o)]
    names = parse_name_list(impl)
    for name in names:
        if name not in {i.name for i in impls}:
            raise SdbenchError(
                f"unknown implementation {name!r}{closest(name, sorted({i.name for i in impls}))}; "
                "see `sdbench list`"
            )
    impls = [i for i in impls if not names or i.name in names]
    total = sum(parity.count_configs(o, grid) for o in {i.op for i in impls})
    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task("parity", total=total)
        tallies = parity.run_parity(impls, grid, device, seed, progress=lambda: bar.advance(task))
    _print_parity(impls, tallies, device)
    if verbose:
        _print_ptxas_report()
    if any(t.failed for t in tallies.values()):
        raise typer.Exit(1)


def _check_device(device: str | None) -> str:
    import torch

    device = device or default_device()
    if device not in ("cuda", "cpu"):
        raise SdbenchError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise SdbenchError("--device cuda: no CUDA device is visible here (use --device cpu)")
    return device


def _print_parity(impls, tallies, device: str) -> None:
    table = Table(title=f"parity against the PyTorch reference ({device})")
    for column in ("operation", "implementation", "pass", "fail", "skip", "skip reasons"):
        table.add_column(column)
    for impl in impls:
        tally = tallies[impl.key]
        skipped = sum(tally.skipped.values())
        reasons = "; ".join(f"{reason} ({n})" for reason, n in tally.skipped.items())
        fail = f"[red]{tally.failed}[/]" if tally.failed else "0"
        table.add_row(impl.op, impl.name, str(tally.passed), fail, str(skipped), reasons)
    console.print(table)
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
        table.add_row(*(str(row.get(k, "")) for k in ("kernel", "registers", "shared_bytes", "spill_stores", "spill_loads")))
    console.print(table)


# --- sweep -------------------------------------------------------------------------------------
# --- profile -----------------------------------------------------------------------------------
# --- report ------------------------------------------------------------------------------------
# --- calibrate-tau -----------------------------------------------------------------------------
# --- end of commands ---------------------------------------------------------------------------


def main() -> None:
    """Console-script entry point."""
    app()
