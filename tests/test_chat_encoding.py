"""One chat encoding path: the server, ``LLM.chat`` and ``generate --chat`` give a model the same
prompt ids, with a single BOS when the template writes one (issue 12, item 6)."""

from __future__ import annotations

import json

import openai
import pytest

from stallfree.cli import main
from stallfree.core import SamplingParams
from stallfree.engine import LLM
from stallfree.engine.tokenizer import RANDOM_BOS_ID, RANDOM_CHAT_TEMPLATE, random_tokenizer
from stallfree.server.launch import ServerThread, build_server

MESSAGES = [{"role": "user", "content": "kalo mefi tu"}]
# Llama-2/3 templates open with the BOS token; the random tokenizer ALSO adds one when encoding.
BOS_TEMPLATE = "{{ bos_token }}" + RANDOM_CHAT_TEMPLATE
ENGINE = {"dtype": "float32", "device": "cpu", "num_blocks": 64}


def test_encode_chat_keeps_the_templates_single_bos() -> None:
    tokenizer = random_tokenizer(1024)
    tokenizer.chat_template = BOS_TEMPLATE
    ids = tokenizer.encode_chat(MESSAGES)
    assert ids[0] == RANDOM_BOS_ID and ids.count(RANDOM_BOS_ID) == 1
    text = tokenizer.apply_chat_template(MESSAGES)
    assert tokenizer.encode(text)[:2] == [RANDOM_BOS_ID, RANDOM_BOS_ID]  # what the server used to send
    assert tokenizer.decode(ids) == text.removeprefix("<s>")


def test_server_and_llm_chat_see_the_same_prompt() -> None:
    llm = LLM("random:tiny", **ENGINE)
    llm.engine.tokenizer.chat_template = BOS_TEMPLATE
    offline = llm.chat(MESSAGES, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert list(offline.prompt_token_ids) == llm.engine.tokenizer.encode_chat(MESSAGES)

    app = build_server("random:tiny", **ENGINE)
    app.state.engine_thread.engine.tokenizer.chat_template = BOS_TEMPLATE
    with ServerThread(app) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0)
        served = client.chat.completions.create(
            model="random:tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    assert served.usage is not None
    assert served.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert served.choices[0].message.content == offline.text


def test_generate_chat_encodes_like_llm_chat(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--model", "random:tiny", "--dtype", "float32", "--num-blocks", "64"]
    argv += ["--chat", "--prompt", MESSAGES[0]["content"], "--max-tokens", "2", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["prompt_token_ids"] == random_tokenizer(1024).encode_chat(MESSAGES)
