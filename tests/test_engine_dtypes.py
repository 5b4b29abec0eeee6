"""The one dtype rule (stallfree.engine.dtypes) on faked CPUs, and the engine without prepacked weights."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stallfree.cli import main  # noqa: E402
from stallfree.cli.common import DTYPE_CHOICES, QUANTIZATIONS  # noqa: E402
from stallfree.engine import dtypes, model  # noqa: E402
from stallfree.engine.dtypes import CpuIsa, choose_dtype, cpu_isa  # noqa: E402
from stallfree.engine.engine import LLMEngine  # noqa: E402

ZEN3 = CpuIsa(frozenset({"avx", "avx2", "fma", "f16c"}))  # AVX2 only: the crash's machine
SKYLAKE = CpuIsa(ZEN3.flags | {"avx512f", "avx512bw", "avx512vl", "avx512dq"})
ZEN4 = CpuIsa(SKYLAKE.flags | {"avx512_bf16"})
SAPPHIRE_RAPIDS = CpuIsa(ZEN4.flags | {"amx_bf16", "amx_tile", "avx512_fp16"})
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("isa", "expected"),
    [
        (ZEN3, torch.float32),
        (SKYLAKE, torch.bfloat16),
        (ZEN4, torch.bfloat16),
        (SAPPHIRE_RAPIDS, torch.bfloat16),
    ],
)
def test_auto_is_bf16_only_where_the_cpu_runs_it_fast(isa: CpuIsa, expected: torch.dtype) -> None:
    choice = choose_dtype("auto", CPU, isa)
    assert choice.dtype == expected
    assert choice.note is None
    assert isa.name in choice.reason


@pytest.mark.parametrize("isa", [ZEN4, SAPPHIRE_RAPIDS])
def test_auto_takes_the_compiled_bf16_kernels_where_they_run(isa: CpuIsa) -> None:
    """bf16 weights in pair dot products, fp32 activations and KV: the reason names the KV cost."""
    choice = choose_dtype("auto", CPU, isa, bf16_kernels=True)
    assert (choice.dtype, choice.quantization) == (torch.float32, "bf16")
    assert "KV bytes" in choice.reason and isa.name in choice.reason
    assert choose_dtype("bfloat16", CPU, isa, bf16_kernels=True).quantization is None  # asked: as asked


def test_the_engine_runs_auto_in_the_format_this_cpu_runs_fastest() -> None:
    from stallfree.engine import LLMEngine
    from stallfree.engine.native import bf16_dot_products, native_module

    engine = LLMEngine("random:tiny", device="cpu", num_blocks=16)
    kind = engine.model.weights.kind
    if bf16_dot_products():
        assert (engine.dtype, kind) == (torch.float32, "bf16")
    elif native_module() is not None and not cpu_isa().fast_bf16:
        assert (engine.dtype, kind) == (torch.float32, "panels")
    assert engine.dtype_choice.reason in engine.describe_format()


def test_auto_on_cuda_is_bf16_whatever_the_cpu() -> None:
    assert choose_dtype("auto", torch.device("cuda"), ZEN3).dtype == torch.bfloat16


def test_an_explicit_dtype_runs_as_asked_with_a_note_where_its_kernels_are_slow() -> None:
    slow = choose_dtype("bfloat16", CPU, ZEN3)
    assert slow.dtype == torch.bfloat16
    assert slow.note is not None and "AVX2" in slow.note and "float32" in slow.note
    assert choose_dtype("bfloat16", CPU, ZEN4).note is None
    assert choose_dtype("float16", CPU, ZEN4).note is not None  # no AVX512-FP16
    assert choose_dtype("float16", CPU, SAPPHIRE_RAPIDS).note is None
    assert choose_dtype("float32", CPU, ZEN3) == dtypes.DtypeChoice(torch.float32, "as asked")


def test_a_dtype_the_cpu_cannot_run_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtypes, "_cpu_failure", lambda dtype: "no kernel for this dtype")
    with pytest.raises(ValueError, match=r"^--dtype float16 does not run on this CPU .*use float32$"):
        choose_dtype("float16", CPU, ZEN3)
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        choose_dtype("fp8", CPU, ZEN3)


def test_the_cli_refuses_it_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(dtypes, "_cpu_failure", lambda dtype: "no kernel for this dtype")
    argv = [
        "generate",
        "--model",
        "random:tiny",
        "--dtype",
        "bfloat16",
        "--prompt",
        "hi",
        "--max-tokens",
        "2",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not run on this CPU" in err[0]


def test_cli_parsing_offers_the_engine_dtypes() -> None:
    assert DTYPE_CHOICES == dtypes.DTYPE_CHOICES


def test_cli_parsing_offers_the_engine_quantizations() -> None:
    assert QUANTIZATIONS == model.QUANTIZATIONS


def test_this_cpus_flags_agree_with_torchs_dispatch_level() -> None:
    isa = cpu_isa()
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX512", "AMX"):
        assert {"avx512bw", "avx512vl", "avx512dq"} <= isa.flags
    if capability == "AVX2":
        assert "avx2" in isa.flags


def test_explain_on_an_avx2_cpu_runs_its_defaults_in_fp32(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(dtypes, "cpu_isa", lambda: ZEN3)
    argv = ["explain", "--engine", "torch", "--device", "cpu", "--model", "random:tiny"]
    assert main([*argv, "--prompt-tokens", "64", "--streams", "2", "--context-tokens", "16"]) == 0
    assert "torch float32 on cpu" in capsys.readouterr().out


def test_bf16_without_prepacked_weights_generates_the_same_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an AVX2-only CPU does: torch cannot pack bf16 weights there, so they stay unpacked."""

    def greedy(engine: LLMEngine) -> list[int]:
        from stallfree.core import SamplingParams

        engine.add_request(
            "r",
            prompt_token_ids=list(range(3, 40)),
            sampling_params=SamplingParams(max_tokens=8, temperature=0.0),
        )
        tokens: list[int] = []
        while engine.has_unfinished_requests():
            for output in engine.step().outputs:
                tokens = list(output.token_ids)
        return tokens

    packed = LLMEngine("random:tiny", dtype="bfloat16", device="cpu")
    monkeypatch.setattr("stallfree.engine.model.prepacks", lambda dtype: False)
    unpacked = LLMEngine("random:tiny", dtype="bfloat16", device="cpu")
    assert not unpacked.model.is_prepacked
    assert greedy(unpacked) == greedy(packed)
