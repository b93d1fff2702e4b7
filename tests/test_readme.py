"""The README's headline tables are exactly what the command in their comment prints from the committed parquet."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sdbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- headline:(\w+) \(generated: `sdbench (.+?)`; [^>]*-->\n(.*?)\n<!-- headline:\1:end -->", re.S)
BLOCKS = BLOCK.findall((ROOT / "README.md").read_text())


def test_the_readme_has_its_headline_blocks():
    assert {name for name, _, _ in BLOCKS} == {"greedy", "prob"}


@pytest.mark.parametrize("name, command, shown", BLOCKS, ids=[name for name, _, _ in BLOCKS])
def test_readme_headline_equals_what_the_command_prints(name, command, shown, monkeypatch):
    pytest.importorskip("polars")
    monkeypatch.chdir(ROOT)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, shlex.split(command))
    assert result.exit_code == 0, result.output
    printed = result.output.split("\n", 2)[2].strip()  # the table, without its title line
    assert shown.strip() == printed
