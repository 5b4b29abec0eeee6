"""``stallfree generate`` and ``stallfree save-model`` through the real argv entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main

TINY = ["--model", "random:tiny", "--dtype", "float32", "--num-blocks", "64"]


def test_generate_json_one_object_per_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "generate",
        *TINY,
        "--prompt",
        "Hello",
        "--prompt",
        "kalo",
        "--max-tokens",
        "6",
        "--temperature",
        "0",
    ]
    assert main([*argv, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["Hello", "kalo"]
    for record in records:
        assert len(record["token_ids"]) == 6 or record["finish_reason"] == "stop"
        assert record["prompt_token_ids"] and isinstance(record["text"], str)
    assert main(argv) == 0  # plain text: one line per prompt, same greedy text
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == records[0]["text"]


def test_save_model_then_generate_from_the_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "ckpt"
    assert main(["save-model", "random:tiny", str(folder)]) == 0
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    capsys.readouterr()
    common = ["--prompt", "Hello", "--max-tokens", "5", "--temperature", "0", "--json", "--dtype", "float32"]
    assert main(["generate", "--model", str(folder), "--num-blocks", "64", *common]) == 0
    from_folder = json.loads(capsys.readouterr().out)
    assert main(["generate", *TINY, *common]) == 0
    assert json.loads(capsys.readouterr().out)["token_ids"] == from_folder["token_ids"]
    assert main(["save-model", "random:tiny", str(folder)]) == 2  # refuses to overwrite
    assert "not an empty folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["generate", "--model", "/no/such/model", "--prompt", "x"],
            "is not random:<preset>, a GGUF file",
        ),
        (["generate", "--model", "random:huge", "--prompt", "x"], "unknown random model preset"),
        (["generate", *TINY, "--prompt", "x " * 2000], "exceeds max_model_len"),
        (["generate", *TINY, "--prompt", "x", "--dtype", "int3"], "invalid choice: 'int3'"),
        (
            ["generate", *TINY, "--prompt", "x", "--quantization", "q8_0", "--dtype", "bfloat16"],
            "q8_0 weights run on the CPU with fp32 activations (--dtype float32), not bfloat16 on cpu",
        ),
        (["save-model", "/some/folder", "/tmp/x"], "random:<preset> models only"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # a bad choice exits from the parser itself
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_module_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, stallfree.cli, stallfree.cli.generate; stallfree.cli.build_parser(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_generate_chat_wraps_the_prompt_in_the_template(capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.engine.tokenizer import random_tokenizer

    argv = ["generate", *TINY, "--prompt", "Hello", "--max-tokens", "3", "--chat", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    tokenizer = random_tokenizer(1024)
    templated = tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert record["prompt_token_ids"] == tokenizer.encode(templated, add_special_tokens=False)
