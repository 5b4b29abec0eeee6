"""Argument errors name the command the user typed and only flags the user typed."""

from __future__ import annotations

import pytest

from stallfree.cli import main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["tune", "--qps-st", "0"],
            "stallfree tune: error: unrecognized arguments: --qps-st 0",
        ),  # no abbreviation
        (["explain", "--bogus"], "stallfree explain: error: unrecognized arguments: --bogus"),
        (["simulate", "--num-req", "5"], "stallfree simulate: error: unrecognized arguments: --num-req 5"),
        (["explain", "--streams", "x"], "stallfree explain: error: argument --streams"),
    ],
)
def test_an_argument_error_names_the_command_and_the_flag_typed(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and len(err.splitlines()) == 1
