"""LLMEngine / LLM end to end on a tiny fp32 model, scheduled by the real core scheduler.

Greedy tokens are checked against a plain transformers greedy loop on the same saved
checkpoint, under schedules that force chunked prefill, mixed steps and preemption.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from stallfree.core import SamplingParams
from stallfree.engine import LLM, LLMEngine
from stallfree.engine.random_models import random_spec
from stallfree.engine.tokenizer import random_tokenizer
from stallfree.engine.weights import build_random_model, save_pretrained

PROMPTS = ["Hello there", "kalo mefi tu ba " * 6, "a", "the quick brown fox jumps over"]
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = random_spec("tiny")
    folder = tmp_path_factory.mktemp("tiny")
    save_pretrained(
        build_random_model(spec, torch.float32, "cpu", seed=11), random_tokenizer(spec.vocab_size), folder
    )
    return folder


@pytest.fixture(scope="module")
def hf_greedy(checkpoint: Path) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (full re-forward per token, no cache)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokenizer = random_tokenizer(random_spec("tiny").vocab_size)
    outputs = []
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        generated: list[int] = []
        with torch.no_grad():
            for _ in range(MAX_TOKENS):
                logits = model(torch.tensor([ids + generated])).logits[0, -1]
                generated.append(int(logits.argmax()))
        outputs.append(generated)
    return outputs


def engine(checkpoint: Path, **kwargs: object) -> LLM:
    options: dict[str, object] = {"dtype": "float32", "device": "cpu", "block_size": 4, "num_blocks": 256}
    options.update(kwargs)
    return LLM(str(checkpoint), **options)


@pytest.mark.parametrize(
    "schedule",
    [
        {"policy": "chunked", "token_budget": 7},  # chunked prefill + mixed steps
        {"policy": "prefill-first"},
        {"policy": "decode-first"},
    ],
    ids=["chunked-7", "prefill-first", "decode-first"],
)
def test_greedy_matches_transformers(
    checkpoint: Path, hf_greedy: list[list[int]], schedule: dict[str, object]
) -> None:
    llm = engine(checkpoint, **schedule)
    outputs = llm.generate(PROMPTS, GREEDY)
    assert [list(o.token_ids) for o in outputs] == hf_greedy
    assert all(o.finish_reason == "length" for o in outputs)
    assert llm.engine.scheduler.block_manager.num_used_blocks == 0


def test_preempted_requests_recompute_the_same_tokens(checkpoint: Path, hf_greedy: list[list[int]]) -> None:
    # 4 requests of up to ~40 tokens need ~40 blocks of 4 at the end: 14 blocks force preemption.
    llm = engine(checkpoint, num_blocks=14, policy="chunked", token_budget=16)
    outputs = llm.generate(PROMPTS, GREEDY)
    assert llm.engine.scheduler.num_preemptions > 0
    assert [list(o.token_ids) for o in outputs] == hf_greedy


SHARED = "you are a helpful assistant who answers briefly. " * 3
SHARED_PROMPTS = [
    SHARED + "what is two and two",
    SHARED + "name a colour",
    SHARED,
    SHARED + "what is two and three",
]


@pytest.mark.parametrize(
    "schedule",
    [{"token_budget": 7}, {"token_budget": 16, "num_blocks": 36}],
    ids=["chunked-7", "chunked-16-preempting"],
)
def test_prefix_caching_reuses_blocks_and_changes_no_token(
    checkpoint: Path, schedule: dict[str, int]
) -> None:
    """Prompts that share a prefix, all at once (through chunked prefill and, with 36 blocks,
    preemption), then two again one by one (from freed, still cached blocks): the same greedy
    tokens as without the cache, with fewer prompt tokens computed."""
    runs = {}
    for caching in (True, False):
        llm = engine(checkpoint, policy="chunked", enable_prefix_caching=caching, **schedule)
        outputs = llm.generate(SHARED_PROMPTS, GREEDY)
        outputs += [llm.generate([p], GREEDY)[0] for p in SHARED_PROMPTS[:2]]
        state = llm.engine.scheduler.state
        runs[caching] = ([list(o.token_ids) for o in outputs], state.num_prefix_hit_tokens)
        assert llm.engine.scheduler.block_manager.num_used_blocks == 0
        if caching and "num_blocks" in schedule:  # without the cache they run one at a time
            assert llm.engine.scheduler.num_preemptions > 0
    assert runs[True][0] == runs[False][0]
    assert runs[False][1] == 0
    shared_blocks = len(random_tokenizer(random_spec("tiny").vocab_size).encode(SHARED)) // 4
    assert runs[True][1] >= 5 * shared_blocks * 4  # all but the first prompt hit at least the prefix


def test_a_next_turn_hits_the_blocks_of_the_answer_it_repeats(checkpoint: Path) -> None:
    """Turn 2's prompt is turn 1's prompt and generated answer plus a new message: the blocks the
    answer's tokens filled are cached as they are generated, so turn 2 computes only what is new
    (and the last of turn 1's tokens, whose KV never ran), with the same tokens as uncached."""
    prompt = random_tokenizer(random_spec("tiny").vocab_size).encode(SHARED)
    runs = {}
    for caching in (True, False):
        llm = engine(checkpoint, policy="chunked", token_budget=16, enable_prefix_caching=caching)
        answer = list(llm.generate([prompt], GREEDY)[0].token_ids)
        state = llm.engine.scheduler.state
        hits_before = state.num_prefix_hit_tokens
        second = llm.generate([[*prompt, *answer, 5, 6, 7]], GREEDY)[0]
        runs[caching] = (list(second.token_ids), state.num_prefix_hit_tokens - hits_before)
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] == (len(prompt) + MAX_TOKENS - 1) // 4 * 4


def test_streaming_outputs_add_up(checkpoint: Path) -> None:
    eng = LLMEngine(
        str(checkpoint), dtype="float32", block_size=4, num_blocks=64, policy="chunked", token_budget=8
    )
    rid = eng.add_request(prompt="Hello there", sampling_params=GREEDY)
    pieces: list[str] = []
    ids: list[int] = []
    final = None
    steps = 0
    while eng.has_unfinished_requests():
        stepped = eng.step()
        for out in stepped.outputs:
            pieces.append(out.new_text)
            ids.extend(out.new_token_ids)
            final = out
        steps += 1
        assert stepped.step is not None and stepped.step.result.duration_s > 0
        assert stepped.step is eng.last_step
    assert final is not None and final.request_id == rid and final.finished
    assert "".join(pieces) == final.text
    assert tuple(ids) == final.token_ids and len(ids) == MAX_TOKENS
    assert final.text == eng.tokenizer.decode(final.token_ids)


def test_same_seed_same_text_regardless_of_batch(checkpoint: Path) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, top_k=50, seed=1234)
    alone = engine(checkpoint).generate(["Hello there"], params)[0]
    batched = engine(checkpoint).generate(["Hello there", "other prompt", "Hello there"], params)
    assert batched[0].token_ids == alone.token_ids == batched[2].token_ids
    other = engine(checkpoint).generate(
        ["Hello there"], SamplingParams(max_tokens=10, temperature=1.0, seed=99)
    )[0]
    assert other.token_ids != alone.token_ids


def test_unseeded_requests_follow_the_engine_seed(checkpoint: Path) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0)
    first = [o.token_ids for o in engine(checkpoint, seed=5).generate(PROMPTS, params)]
    again = [o.token_ids for o in engine(checkpoint, seed=5).generate(PROMPTS, params)]
    assert first == again


def test_stop_token_ids_and_stop_strings(checkpoint: Path, hf_greedy: list[list[int]]) -> None:
    llm = engine(checkpoint)
    greedy = hf_greedy[0]
    stop_id = greedy[4]
    out = llm.generate(
        ["Hello there"], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop_token_ids=(stop_id,))
    )[0]
    assert out.finish_reason == "stop"
    assert list(out.token_ids) == greedy[: greedy.index(stop_id) + 1]

    full_text = llm.engine.tokenizer.decode(greedy)
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 2]
    out = llm.generate(["Hello there"], SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert out.text == full_text[: full_text.index(stop)]


def test_streamed_text_never_shows_what_a_stop_string_cuts(checkpoint: Path) -> None:
    """A stop string whose first characters arrive a token before its last: the deltas hold
    them back, so what was streamed is always a prefix of the final text."""

    def deltas(params: SamplingParams) -> tuple[list[str], str]:
        eng = engine(checkpoint).engine
        rid = eng.add_request(prompt="Hello there", sampling_params=params)
        pieces, final = [], ""
        while eng.has_unfinished_requests():
            for out in eng.step().outputs:
                assert out.request_id == rid
                pieces.append(out.new_text)
                final = out.text
        return pieces, final

    pieces, _ = deltas(SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    full = "".join(pieces)
    # Two characters ending one token's text and one starting the next, first seen there.
    spans = [
        (j, pieces[j][-2:] + pieces[j + 1][:1])
        for j in range(len(pieces) - 1)
        if len(pieces[j]) >= 2 and pieces[j + 1]
    ]
    stop = next(s for j, s in spans if full.index(s) == len("".join(pieces[: j + 1])) - 2)
    streamed, final = deltas(
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, stop=(stop,))
    )
    assert final == full[: full.index(stop)]
    assert "".join(streamed) == final
    for k in range(len(streamed)):
        assert final.startswith("".join(streamed[: k + 1]))


@pytest.mark.parametrize("eos_file", ["config.json", "generation_config.json"])
def test_eos_stops_unless_ignored(
    checkpoint: Path, hf_greedy: list[list[int]], tmp_path: Path, eos_file: str
) -> None:
    # Declare a token greedy decoding emits as EOS, then expect a STOP there.
    greedy = hf_greedy[3]
    for item in checkpoint.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    config = json.loads((checkpoint / "config.json").read_text()) if eos_file == "config.json" else {}
    (tmp_path / eos_file).write_text(json.dumps(config | {"eos_token_id": [greedy[2]]}))
    llm = engine(tmp_path)
    stopped = llm.generate([PROMPTS[3]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))[0]
    assert (
        stopped.finish_reason == "stop" and list(stopped.token_ids) == greedy[: greedy.index(greedy[2]) + 1]
    )
    ignored = llm.generate([PROMPTS[3]], GREEDY)[0]
    assert list(ignored.token_ids) == greedy


def test_logprobs_are_of_the_chosen_tokens(checkpoint: Path) -> None:
    out = engine(checkpoint).generate(["Hello"], SamplingParams(max_tokens=5, temperature=0, logprobs=True))[
        0
    ]
    assert out.logprobs is not None and len(out.logprobs) == 5
    assert all(lp <= 0 for lp in out.logprobs)


def test_token_id_prompts(checkpoint: Path, hf_greedy: list[list[int]]) -> None:
    llm = engine(checkpoint)
    ids = llm.engine.tokenizer.encode(PROMPTS[0])
    out = llm.generate([ids], GREEDY)[0]
    assert list(out.prompt_token_ids) == ids and list(out.token_ids) == hf_greedy[0] and out.prompt is None


def test_bad_requests_raise_and_leave_nothing_allocated(checkpoint: Path) -> None:
    llm = engine(checkpoint, max_model_len=64)
    eng = llm.engine
    with pytest.raises(ValueError, match=r"prompt \(64\) \+ max_tokens \(16\) exceeds max_model_len \(64\)"):
        eng.add_request(prompt_token_ids=[5] * 64)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request(prompt_token_ids=[5] * 10, sampling_params=SamplingParams(max_tokens=60))
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="empty"):
        eng.add_request(prompt_token_ids=[])
    with pytest.raises(ValueError, match="token ids"):
        eng.add_request(prompt_token_ids=[10**6])
    with pytest.raises(ValueError, match="max_model_len"):  # a bad prompt in a batch aborts the good ones
        llm.generate(["ok", "x " * 200], GREEDY)
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.block_manager.num_used_blocks == 0
    assert llm.generate(["ok"], SamplingParams(max_tokens=3))[0].finish_reason == "length"


def test_abort_frees_blocks(checkpoint: Path) -> None:
    eng = engine(checkpoint).engine
    rid = eng.add_request(prompt="Hello there", sampling_params=GREEDY)
    eng.step()
    assert eng.scheduler.block_manager.num_used_blocks > 0
    eng.abort_request(rid)
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.block_manager.num_used_blocks == 0


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "no config.json"),
        (
            lambda d: (d / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]})),
            "GPT2LMHeadModel",
        ),
        (lambda d: (d / "model.safetensors").unlink(), "no model.safetensors"),
    ],
    ids=["no-config", "unsupported-architecture", "no-weights"],
)
def test_bad_model_folders(checkpoint: Path, tmp_path: Path, setup: object, message: str) -> None:
    for item in checkpoint.iterdir():
        (tmp_path / item.name).write_bytes(item.read_bytes())
    setup(tmp_path)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        LLMEngine(str(tmp_path), dtype="float32", num_blocks=8)


def test_sharded_checkpoint_loads_and_missing_shard_is_named(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(checkpoint / "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(tmp_path / shard), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: s for s, ns in shards.items() for n in ns}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    sharded = LLM(str(tmp_path), dtype="float32", num_blocks=64).generate(["Hello there"], GREEDY)[0]
    single = engine(checkpoint).generate(["Hello there"], GREEDY)[0]
    assert sharded.token_ids == single.token_ids
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="model-00002-of-00002"):
        LLMEngine(str(tmp_path), dtype="float32", num_blocks=8)


def test_chat_uses_the_template(checkpoint: Path) -> None:
    llm = engine(checkpoint)
    messages = [{"role": "user", "content": "hi there"}]
    out = llm.chat(messages, GREEDY)
    prompt = llm.engine.tokenizer.apply_chat_template(messages)
    assert list(out.prompt_token_ids) == llm.engine.tokenizer.encode(prompt, add_special_tokens=False)
    assert len(out.token_ids) == MAX_TOKENS


@pytest.mark.parametrize(
    "params", [{"top_p": 1e-300}, {"temperature": 1e-300}, {"temperature": 1e-300, "top_p": 1e-300}]
)
def test_extreme_sampling_values_do_not_crash_the_step(params: dict[str, float]) -> None:
    """A tiny top_p rounds to 0 in fp32 and a tiny temperature overflows the logits: both
    must still pick the top token rather than crash the engine step."""
    llm = LLM("random:tiny", dtype="float32", device="cpu")
    greedy = llm.generate(["abc"], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
    out = llm.generate(["abc"], SamplingParams(max_tokens=4, ignore_eos=True, **params))[0]
    assert out.token_ids == greedy.token_ids


def test_step_says_whether_anything_ran(checkpoint: Path) -> None:
    eng = LLMEngine(str(checkpoint), dtype="float32", block_size=4, num_blocks=64, token_budget=8)
    idle = eng.step()
    assert not idle.ran and idle.outputs == () and idle.step is None
    rid = eng.add_request(prompt="Hello there", sampling_params=GREEDY)
    first = eng.step()
    assert first.ran and first.step is not None
    assert [c.request_id for c in first.step.plan.chunks] == [rid]
    assert first.step.result.duration_s > 0


@pytest.mark.parametrize(("policy", "max_num_seqs"), [("chunked", 8), ("prefill-first", 256)])
def test_only_a_chunked_token_budget_caps_max_num_seqs(
    checkpoint: Path, policy: str, max_num_seqs: int
) -> None:
    eng = LLMEngine(str(checkpoint), dtype="float32", num_blocks=64, policy=policy, token_budget=8)
    assert eng.scheduler.config.max_num_seqs == max_num_seqs


def test_engine_config_from_options_splits_engine_and_serving_fields() -> None:
    from stallfree.core.serving import ServingConfig
    from stallfree.engine.config import EngineConfig

    config = EngineConfig.from_options(
        "random:tiny", dtype="float32", seed=3, token_budget=64, max_num_seqs=8
    )
    assert (config.model, config.dtype, config.seed) == ("random:tiny", "float32", 3)
    assert config.serving == ServingConfig(max_num_batched_tokens=64, max_num_seqs=8)
    with pytest.raises(ValueError, match="unknown serving option"):
        EngineConfig.from_options("random:tiny", dtyp="float32")
    with pytest.raises(ValueError, match="either serving or its options"):
        EngineConfig.from_options("random:tiny", serving=ServingConfig(), max_num_seqs=8)
    with pytest.raises(ValueError, match="either an EngineConfig or keyword options"):
        LLMEngine(config, seed=1)
