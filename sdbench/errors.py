"""The one exception type the CLI turns into a one-line error (never a traceback)."""

from __future__ import annotations

import difflib


class SdbenchError(ValueError):
    """Bad input or an unmet requirement, phrased for the user: what is wrong and how to fix it."""


def closest(name: str, choices: list[str]) -> str:
    """A ' (did you mean X?)' suffix naming the closest choice, or '' when nothing is close."""
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def describe_error(err: BaseException) -> str:
    """'TypeName: first line of the message': how a caught error is recorded in a row's reason."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")
