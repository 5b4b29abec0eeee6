"""ServingConfig: the one place the simulator, the engine, the server and tune take their scheduling rules from."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from stallfree.cli.serving_args import SERVING_FLAGS, add_serving_args, serving_config
from stallfree.core import DEFAULT_TOKEN_BUDGET, ChunkedPolicy, PrefillFirstPolicy, ServingConfig


def test_defaults_are_a_chunked_budget_and_256_seqs() -> None:
    serving = ServingConfig()
    assert serving.token_budget == DEFAULT_TOKEN_BUDGET
    assert serving.num_seqs_limit == 256
    policy = serving.make_policy(4096)
    assert isinstance(policy, ChunkedPolicy) and policy.token_budget == DEFAULT_TOKEN_BUDGET


def test_a_default_max_num_seqs_is_capped_at_the_budget_an_explicit_one_is_checked() -> None:
    assert ServingConfig(max_num_batched_tokens=64).num_seqs_limit == 64
    assert ServingConfig(max_num_batched_tokens=64, max_num_seqs=16).num_seqs_limit == 16
    with pytest.raises(ValueError, match="smaller than max_num_seqs 128"):
        ServingConfig(max_num_batched_tokens=64, max_num_seqs=128)
    # The cap is the chunked budget's; a whole-prompt batch cap leaves the default alone.
    assert ServingConfig(policy="prefill-first", max_num_batched_tokens=64).num_seqs_limit == 256


def test_whole_prompt_policies_batch_up_to_max_model_len_by_default() -> None:
    policy = ServingConfig(policy="prefill-first").make_policy(8192)
    assert isinstance(policy, PrefillFirstPolicy) and policy.max_num_batched_tokens == 8192
    capped = ServingConfig(policy="prefill-first", max_model_len=2048).make_scheduler(8192)
    assert capped.config.max_model_len == 2048
    assert capped.policy.max_num_batched_tokens == 2048  # type: ignore[attr-defined]


def test_step_token_cap_sizes_the_largest_step() -> None:
    assert ServingConfig().step_token_cap(8192) == DEFAULT_TOKEN_BUDGET
    assert ServingConfig(chunk_tokens=256, max_num_seqs=16).step_token_cap(8192) == 256 + 16
    assert ServingConfig(policy="prefill-first", max_num_batched_tokens=512).step_token_cap(8192) == 8192


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"policy": "fifo"}, "unknown policy 'fifo'"),
        ({"policy": "prefill-first", "chunk_tokens": 64}, "chunked policy only"),
        ({"chunk_tokens": 64, "max_num_batched_tokens": 512}, "not both"),
        ({"max_num_seqs": 0}, "max_num_seqs must be positive"),
        ({"watermark": 1.5}, "watermark"),
    ],
)
def test_bad_combinations_say_what_is_wrong(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServingConfig(**options)  # type: ignore[arg-type]


def test_model_len_may_not_exceed_the_models_context() -> None:
    assert ServingConfig().model_len(4096) == 4096
    with pytest.raises(ValueError, match="exceeds the model's context of 4096"):
        ServingConfig(max_model_len=8192).model_len(4096)


def test_options_accept_the_token_budget_alias_and_refuse_unknown_names() -> None:
    assert ServingConfig.from_options(token_budget=128).max_num_batched_tokens == 128
    with pytest.raises(ValueError, match="unknown serving option"):
        ServingConfig.from_options(max_batch=4)


def test_every_field_has_a_flag_and_the_flags_build_the_same_config() -> None:
    assert set(SERVING_FLAGS) == {f.name for f in dataclasses.fields(ServingConfig)}
    parser = argparse.ArgumentParser()
    add_serving_args(parser)
    assert serving_config(parser.parse_args([])) == ServingConfig()
    args = parser.parse_args(["--policy", "prefill-first", "--token-budget", "2048", "--block-size", "32"])
    assert serving_config(args) == ServingConfig(
        policy="prefill-first", max_num_batched_tokens=2048, block_size=32
    )
