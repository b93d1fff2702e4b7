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

from sdbench.errors import SdbenchError

app = typer.Typer(
    name="sdbench",
    help="Benchmark the verification step of batched speculative decoding on NVIDIA GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


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
# --- sweep -------------------------------------------------------------------------------------
# --- profile -----------------------------------------------------------------------------------
# --- report ------------------------------------------------------------------------------------
# --- calibrate-tau -----------------------------------------------------------------------------
# --- end of commands ---------------------------------------------------------------------------


def main() -> None:
    """Console-script entry point."""
    app()
