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


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["simulate", "--speculative-tokens", "2", "--num-requests", "5"],
            "stallfree simulate: error: --speculative-tokens needs --acceptance-rate",
        ),
        (
            ["simulate", "--acceptance-rate", "0.5", "--num-requests", "5"],
            "stallfree simulate: error: --acceptance-rate applies with --speculative-tokens N",
        ),
        (
            ["simulate", "--speculative-tokens", "2", "--acceptance-rate", "0.5,0.7", "--num-requests", "5"],
            "stallfree simulate: error: --acceptance-rate: acceptance rates by position must not rise",
        ),
        (
            [
                "simulate",
                "--speculative-tokens",
                "2",
                "--acceptance-rate",
                "0.5",
                "--policy",
                "prefill-first",
            ],
            "stallfree simulate: error: --speculative-tokens applies to the chunked policy only",
        ),
    ],
)
def test_a_wrong_combination_of_flags_is_one_line_and_exit_2(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and len(err.splitlines()) == 1
