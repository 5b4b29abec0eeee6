"""``LLMEngine``: the core scheduler driven on the wall clock by the PyTorch model runner.

Each :meth:`LLMEngine.step` is one :func:`stallfree.core.run_step`: the scheduler plans,
:meth:`LLMEngine._execute` (the executor) runs the model, samples, detects stops and
reports the measured ``duration_s``; the scheduler then counts tokens and finishes
requests. The engine owns the clock, the token ids and the text; the scheduler owns
queues and KV blocks. :meth:`LLMEngine.step` returns :class:`StepOutputs`: the requests'
outputs and, when anything ran, the step's plan / measured result / events, so a driver
(the measured explainer, a server) can timestamp every step and tell an idle one apart.

Bad input (unknown model, prompt longer than the context, max_tokens <= 0, a request the
KV cache can never hold) raises one-line ``ValueError`` before anything is allocated.
"""

from __future__ import annotations

import gc
import itertools
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from stallfree.core import (
    SamplingParams,
    StepPlan,
    StepResult,
    StepTimePredictor,
    ceil_div,
    run_step,
)
from stallfree.core.outputs import IDLE, EngineStep, StepOutputs
from stallfree.core.serving import ServingConfig
from stallfree.core.step import prompt_token_ids as prompt_token_ids_of
from stallfree.core.step import queue_prompt
from stallfree.engine.auto_budget import BudgetChoice, choose_token_budget
from stallfree.engine.config import EngineConfig
from stallfree.engine.cpu_share import CoreShare
from stallfree.engine.drafts import propose_ngram
from stallfree.engine.dtypes import choose_dtype
from stallfree.engine.kv_cache import KVCache, free_memory_bytes, kv_bytes_per_block
from stallfree.engine.model_runner import ModelRunner
from stallfree.engine.native import bf16_dot_products, chunk_kernel_for, kernel_for
from stallfree.engine.requests import RequestState
from stallfree.engine.sampler import sample_tokens, verify_drafts
from stallfree.engine.step_timing import measure_draft_cost
from stallfree.engine.weights import load_model

# Share of free memory the KV cache takes by default: the CPU is shared with everything else.
_DEFAULT_KV_FRACTION = {"cpu": 0.05, "cuda": 0.8}
_log = logging.getLogger(__name__)


@dataclass(slots=True)
class StepBudgetStats:
    """How a time-budgeted engine's real steps compared with the target and the prediction.

    ``prediction_error`` sums ``|predicted - measured| / measured`` over the steps (its mean is
    the predictor's error on this machine, now)."""

    step_budget_s: float
    num_steps: int = 0
    num_steps_over_budget: int = 0
    max_step_s: float = 0.0
    prediction_error: float = 0.0

    def add(self, predicted_s: float, measured_s: float) -> None:
        self.num_steps += 1
        self.num_steps_over_budget += measured_s > self.step_budget_s
        self.max_step_s = max(self.max_step_s, measured_s)
        if measured_s > 0:
            self.prediction_error += abs(predicted_s - measured_s) / measured_s

    @property
    def mean_prediction_error(self) -> float:
        return self.prediction_error / self.num_steps if self.num_steps else 0.0


class CalibratedPredictor:
    """A step-time predictor scaled to how fast this machine runs now.

    A profile is measured once; a shared host can then run every step tens of percent slower
    (or faster) for minutes. ``scale`` follows measured / predicted over the engine's recent
    steps (an exponential average, each ratio clamped to [1/4, 4]), so a time budget keeps
    holding when the machine drifts from its profile. ``scale`` starts at 1: the profile as is.
    """

    def __init__(self, base: StepTimePredictor, weight: float = 0.1) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.base = base
        self.weight = weight
        self.scale = 1.0

    def __call__(self, plan: StepPlan) -> float:
        return self.base(plan) * self.scale

    def observe(self, plan: StepPlan, measured_s: float) -> float:
        """Fold a step that ran into ``scale``; the prediction it was planned by (before this)."""
        predicted_s = self.base(plan)
        planned_s = predicted_s * self.scale
        if predicted_s > 0 and measured_s > 0:
            ratio = min(4.0, max(0.25, measured_s / predicted_s))
            self.scale += self.weight * (ratio - self.scale)
        return planned_s


class LLMEngine:
    """Add requests, call :meth:`step` until :meth:`has_unfinished_requests` is False."""

    def __init__(self, config: EngineConfig | str = "random:small", **options: Any) -> None:
        """``config``: an :class:`~stallfree.engine.config.EngineConfig`, or a model whose other
        fields come as keyword ``options`` (:meth:`EngineConfig.from_options`: the engine's fields
        and the serving options, ``token_budget``, ``max_num_seqs``, ...). With
        ``serving.step_budget_ms`` the config's ``step_time_predictor`` is wrapped in a
        :class:`CalibratedPredictor` (``predictor``: scaled by measured / predicted over recent
        steps); ``step_budget_stats`` then compares every real step with the target and the
        prediction it was planned by."""
        if isinstance(config, str):
            config = EngineConfig.from_options(config, **options)
        elif options:
            raise ValueError("give either an EngineConfig or keyword options, not both")
        self.config = config
        serving = self.serving = config.serving
        dtype, quantization = config.dtype, config.quantization
        device, seed, step_time_predictor = config.device, config.seed, config.step_time_predictor
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if quantization is not None and dtype == "auto":
            dtype = "float32"  # quantized weights run with fp32 activations
        bf16_kernels = dtype == "auto" and self.device.type == "cpu" and bf16_dot_products()
        self.dtype_choice = choose_dtype(dtype, self.device, bf16_kernels=bf16_kernels)
        if self.dtype_choice.note:
            _log.warning("note: %s", self.dtype_choice.note)
        self.dtype = self.dtype_choice.dtype
        self.model, self.tokenizer = load_model(config.model, self.dtype, self.device, seed)
        self.model.prepack_cpu_weights(quantization or self.dtype_choice.quantization)
        spec = self.model.spec
        context = spec.max_position_embeddings
        self.max_model_len = serving.model_len(context)
        block_size = serving.block_size
        num_blocks = serving.num_blocks
        if num_blocks is None:
            num_blocks = self._default_num_blocks(serving, context, config.kv_cache_memory_fraction)
        self.model_runner = ModelRunner(
            self.model,
            KVCache(spec, num_blocks, block_size, self.dtype, self.device),
            kernel_for(self.device, self.dtype),
            chunk_kernel_for(self.device, self.dtype, self.model.weights.kind, spec.head_dim),
        )
        self.budget_choice: BudgetChoice | None = None
        if config.auto_token_budget and self.device.type == "cpu" and serving.budget_is_default:
            self.budget_choice = choose_token_budget(self.model_runner)
            serving = self.serving = replace(serving, max_num_batched_tokens=self.budget_choice.tokens)
        # A time budget's predictor follows this machine's speed as the steps run.
        self.predictor = (
            None
            if step_time_predictor is None or serving.step_budget_s is None
            else CalibratedPredictor(step_time_predictor)
        )
        # What a draft costs here decides how many each request gets (engine/drafts.py).
        self.draft_cost = (
            measure_draft_cost(self.model_runner, serving.num_speculative_tokens)
            if serving.num_speculative_tokens and config.adaptive_drafts
            else None
        )
        scheduler = serving.make_scheduler(context, num_blocks, predictor=self.predictor)
        self.step_budget_stats = (
            None if serving.step_budget_s is None else StepBudgetStats(serving.step_budget_s)
        )
        self.scheduler = scheduler
        self.core_share: CoreShare | None = None  # made at the first CPU step
        # The latest step that ran (for drivers written against it; step() returns the same EngineStep).
        self.last_step: EngineStep | None = None
        self._requests: dict[str, RequestState] = {}
        self._rng = random.Random(seed)
        self._ids = itertools.count()
        self._start_s = time.perf_counter()
        # Keep the collector's full passes off the start-up heap: walking it is a pause of
        # tens of ms inside some step, an inter-token gap that is not the scheduler's.
        gc.collect()
        gc.freeze()

    # -- requests ---------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str | None = None,
        prompt: str | None = None,
        sampling_params: SamplingParams | None = None,
        prompt_token_ids: Sequence[int] | None = None,
        priority: int = 0,
    ) -> str:
        """Queue a prompt (text or token ids); return its id. ValueError if it can never run.
        ``priority``: lower first under the ``priority`` scheduling policy (vLLM's)."""
        params = sampling_params or SamplingParams()
        ids = prompt_token_ids_of(prompt, prompt_token_ids, self.tokenizer.encode)
        vocab = self.model.spec.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use")
        queue_prompt(self.scheduler, rid, ids, params, time.perf_counter() - self._start_s, priority)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        generator = torch.Generator(device=self.device).manual_seed(seed)
        eos = self.model.spec.eos_token_ids
        self._requests[rid] = RequestState(rid, prompt, ids, params, generator, eos)
        return rid

    def abort_request(self, request_id: str) -> None:
        """Drop a request; its KV blocks are released at the next step."""
        self.scheduler.abort_request(request_id)
        self._requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_running + self.scheduler.num_waiting

    # -- the step ---------------------------------------------------------------------------

    def step(self) -> StepOutputs:
        """Run one step: the outputs of the requests that got a token, and the step that ran."""
        out = run_step(self.scheduler, self._execute)
        if out is None:
            return IDLE
        plan, result, events = out
        step = self.last_step = EngineStep(plan, result, events)
        if self.step_budget_stats is not None and self.predictor is not None:
            planned_s = self.predictor.observe(plan, result.duration_s)
            self.step_budget_stats.add(planned_s, result.duration_s)
        finish = dict(events.finished)
        outputs = []
        for rid in events.new_token_request_ids:
            state = self._requests[rid]
            state.update_text(self.tokenizer)
            reason = finish.get(rid)
            outputs.append(state.snapshot(None if reason is None else reason.value))
            if reason is not None:
                del self._requests[rid]
        return StepOutputs(tuple(outputs), step)

    def _execute(self, plan: StepPlan) -> StepResult:
        """The executor: forward, sample (or verify drafts), stop checks, the next drafts;
        ``duration_s`` is wall time."""
        if self.config.adapt_threads and self.device.type == "cpu":
            self._fit_threads()
        start = time.perf_counter()
        requests = self._requests
        token_ids = {}
        verifying: dict[str, int] = {}
        for c in plan.chunks:
            state = requests[c.request_id]
            token_ids[c.request_id] = state.token_ids
            if c.num_draft_tokens:
                verifying[c.request_id] = c.num_draft_tokens
                token_ids[c.request_id] = state.token_ids + state.drafts[: c.num_draft_tokens]
        rids, logits = self.model_runner.execute(plan, token_ids)
        if verifying:
            all_rids, verify_logits = rids, logits
            rows = [i for i, rid in enumerate(rids) if rid not in verifying]
            rids, logits = tuple(rids[i] for i in rows), logits[rows]
        states = [requests[rid] for rid in rids]
        picks = sample_tokens(logits, [s.params for s in states], [s.generator for s in states])
        stopped = {
            s.request_id
            for s, pick in zip(states, picks, strict=True)
            if s.append(pick.token_id, pick.logprob, self.tokenizer, pick.top_logprobs)
        }
        sampled = {rid: pick.token_id for rid, pick in zip(rids, picks, strict=True)}
        accepted: dict[str, tuple[int, ...]] = {}
        if verifying:
            self._verify(verifying, all_rids, verify_logits, sampled, accepted, stopped)
        proposed = self._propose(sampled, stopped) if self.serving.num_speculative_tokens else {}
        return StepResult(
            time.perf_counter() - start,
            sampled,
            frozenset(stopped),
            num_accepted_drafts={rid: len(ids) for rid, ids in accepted.items()},
            accepted_draft_ids=accepted,
            num_proposed_drafts=proposed,
        )

    def _verify(
        self,
        verifying: dict[str, int],
        rids: tuple[str, ...],
        logits: torch.Tensor,
        sampled: dict[str, int],
        accepted: dict[str, tuple[int, ...]],
        stopped: set[str],
    ) -> None:
        """Verify the drafts of the requests in ``verifying`` (request -> drafts run) against
        their rows of ``logits`` (``rids`` says whose each row is: ``d + 1`` in a row for a request
        verifying ``d``): the tokens kept go to the request (up to a stop), their last in
        ``sampled``, the drafts kept before it in ``accepted``."""
        first_row = {rid: row for row, rid in reversed(list(enumerate(rids)))}
        for rid, num_drafts in verifying.items():
            state = self._requests[rid]
            row = first_row[rid]
            rows = logits[row : row + num_drafts + 1]
            tokens = verify_drafts(rows, state.drafts[:num_drafts], state.params, state.generator)
            state.draft_history.verified(num_drafts, len(tokens) - 1)
            for i, token_id in enumerate(tokens):
                if state.append(token_id, None, self.tokenizer):
                    stopped.add(rid)
                    tokens = tokens[: i + 1]
                    break
            sampled[rid] = tokens[-1]
            accepted[rid] = tuple(tokens[:-1])

    def _propose(self, sampled: dict[str, int], stopped: set[str]) -> dict[str, int]:
        """Next step's drafts for every request that got a token and goes on, as many as are worth
        their rows here (none for one that wants logprobs: a verified token has none here); how
        many each has."""
        k = self.serving.num_speculative_tokens
        low, high = self.config.lookup_range
        cost = self.draft_cost  # None: every draft a lookup finds
        threshold = 0.0 if cost is None else cost.threshold(self.scheduler.num_running)
        proposed = {}
        for rid in sampled:
            state = self._requests[rid]
            if rid in stopped or state.params.logprobs:
                length = 0
            else:
                length = k if cost is None else state.draft_history.length(k, threshold)
            state.drafts = propose_ngram(state.token_ids, length, low, high) if length else []
            proposed[rid] = len(state.drafts)
        return proposed

    def describe_format(self) -> str:
        """What the engine runs in and why, for a start-up line: activations and KV dtype, the
        weights' format and kernels, and the dtype rule's reason."""
        kind = self.model.weights.kind
        weights = {
            "panels": "fp32 weights (compiled kernels)",
            "bf16": "bf16 weights (compiled kernels)",
            "q8_0": "Q8_0 weights (compiled kernels)",
            "onednn": f"{self.dtype_choice.name} weights (oneDNN)",
        }.get(kind, f"{self.dtype_choice.name} weights (torch)")
        return f"{self.dtype_choice.name} activations and KV cache, {weights}; {self.dtype_choice.reason}"

    def describe_budget(self) -> str:
        """How prompts are cut and why, for a start-up line."""
        serving = self.serving
        if serving.token_budget is None:
            chunks = f", {serving.chunk_tokens}-token chunks" if serving.chunk_tokens else ""
            return f"{serving.policy}{chunks}"
        why = self.budget_choice.reason() if self.budget_choice is not None else "asked"
        if self.budget_choice is None and self.config.serving.budget_is_default:
            why = "the default"
        return f"{serving.policy}, token budget {serving.token_budget} ({why})"

    def _fit_threads(self) -> None:
        """Size the kernels' pool to the cores other processes leave free (engine/cpu_share.py);
        at most the threads set when the first step ran."""
        if self.core_share is None:
            self.core_share = CoreShare(torch.get_num_threads())
        threads = self.core_share.update()
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    # -- sizing -----------------------------------------------------------------------------

    def _default_num_blocks(self, serving: ServingConfig, model_context: int, fraction: float | None) -> int:
        """Blocks that fit in a share of free memory, capped at what max_num_seqs full contexts need
        (:meth:`ServingConfig.full_contexts_num_blocks`, which the simulator sizes a profile's by)."""
        if fraction is None:
            fraction = _DEFAULT_KV_FRACTION.get(self.device.type, 0.5)
        if not 0 < fraction <= 1:
            raise ValueError(f"kv_cache_memory_fraction must be in (0, 1], got {fraction}")
        block_size = serving.block_size
        per_block = kv_bytes_per_block(self.model.spec, block_size, self.dtype)
        num_blocks = int(fraction * free_memory_bytes(self.device)) // per_block
        blocks_per_seq = ceil_div(self.max_model_len, block_size)
        needed = serving.full_contexts_num_blocks(model_context)
        if num_blocks < blocks_per_seq:
            raise ValueError(
                f"the KV cache fits only {num_blocks} blocks of {block_size} tokens, fewer than one "
                f"{self.max_model_len}-token sequence needs; lower max_model_len or pass num_blocks"
            )
        return min(num_blocks, needed)
