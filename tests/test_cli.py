"""CLI behaviour common to every command: help everywhere, one-line errors, never a traceback."""

from typer.testing import CliRunner

from sdbench.cli import app, parse_float_list, parse_int_list

runner = CliRunner()


def test_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("list", "parity"):
        assert name in result.output


def test_list_shows_the_registry():
    result = runner.invoke(app, ["list", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "torch_eager" in result.output


def test_list_unknown_operation_is_one_line_error():
    result = runner.invoke(app, ["list", "--op", "verfy"])
    assert result.exit_code == 2
    assert "unknown operation 'verfy'" in result.output and "Traceback" not in result.output


def test_parse_lists():
    assert parse_int_list("1, 4,16", "--b", minimum=1) == [1, 4, 16]
    assert parse_float_list("0.3,0.9", "--alpha", 0, 1) == [0.3, 0.9]


def test_parse_list_errors_name_the_option():
    import pytest

    from sdbench.errors import SdbenchError

    with pytest.raises(SdbenchError, match="--gamma: 'x' is not an integer"):
        parse_int_list("8,x", "--gamma")
    with pytest.raises(SdbenchError, match="--b: 0 is below the minimum 1"):
        parse_int_list("0", "--b", minimum=1)
    with pytest.raises(SdbenchError, match=r"--alpha: 1.5 is outside \[0, 1\]"):
        parse_float_list("1.5", "--alpha", 0, 1)
