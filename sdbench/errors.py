"""The one exception type the CLI turns into a one-line error (never a traceback)."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path


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


def writable_folder(path: str | Path, option: str = "--out") -> Path:
    """Create path (and its parents) and prove it takes a file, before any work is done: every command's
    file-system failure is one SdbenchError naming the path and the fix, never a traceback mid-run."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise SdbenchError(f"{option} {str(folder)!r} is a file, not a folder: name a folder (or remove the file)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".sdbench-write-test-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise SdbenchError(f"{option} {str(folder)!r} cannot be written ({err.strerror or err}): "
                           f"choose a folder you can write, e.g. {option} results") from None
    return folder
