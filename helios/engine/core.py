"""The Core protocol: what every engine offers the step loop (helios.runtime)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from helios.graphs import Catalog, GraphShape
from helios.scheduler.plan import CompletionRecord, ExecutionTiming, Fence, RequestHandle, ScheduledPlan


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One output token's log-probability under the model's raw distribution (before bias,
    penalties, temperature and filters), and the `logprobs` most likely tokens' (id, logprob)."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


# The `attach` options asking a core for log-probabilities of the output tokens and of the prompt's
# (scored prefill), as how many top alternatives per token.
LOGPROBS_OPTION = "logprobs"
PROMPT_LOGPROBS_OPTION = "prompt_logprobs"
MAX_LOGPROBS = 20  # vLLM's default max_logprobs; OpenAI's chat API allows 20 too


@dataclass(frozen=True, slots=True)
class Execution:
    """A finished frame: one record per lane, the timing, and the true duration it took."""

    records: tuple[CompletionRecord, ...]
    timing: ExecutionTiming
    duration_ns: int
    confidence: object = None  # FP32 [2, slots, draft_capacity] sidecar of a device-allocated round
    survival: dict | None = None  # completion_speculative_survival rows by handle
    # For requests attached with LOGPROBS_OPTION: by handle, one entry per token of its record.
    logprobs: dict[RequestHandle, tuple[TokenLogprobs, ...]] | None = None
    # For requests attached with PROMPT_LOGPROBS_OPTION, whose prompt chunk ran in a scored prefill:
    # by handle, the entries of the prompt tokens this chunk's positions predict, in prompt order
    # (a chunk at positions s..s+n-1 scores tokens s+1..s+n inside the prompt; one that starts the
    # prompt first gives None for token 0, which nothing predicts). Over all of a request's chunks
    # the entries cover its prompt, one per token.
    prompt_logprobs: dict[RequestHandle, tuple[TokenLogprobs | None, ...]] | None = None
    # Rows whose request failed alone (a grammar matcher error): by handle, the reason. The
    # runtime ends those requests with an error; the frame's other rows complete as usual.
    row_errors: dict[RequestHandle, str] | None = None


@runtime_checkable
class CostModel(Protocol):
    def duration_ns(self, shape: GraphShape, context_lens: Sequence[int]) -> int: ...


@runtime_checkable
class ChunkedCostModel(CostModel, Protocol):
    """A cost model that also knows the prompt tokens each active row consumes (`chunks`, one per
    row of `context_lens`): packed prefill rows pay only their own tokens, and a mixed graph's prompt
    row (chunk > 0) is told apart from its decode rows (chunk 0)."""

    def chunked_duration_ns(self, shape: GraphShape, chunks: Sequence[int], context_lens: Sequence[int]) -> int: ...


@runtime_checkable
class PackedCostModel(CostModel, Protocol):
    """A cost model that can also price one packed varlen forward (GraphKind.PACKED): row i runs
    chunks[i] prompt tokens (0: one decode query) over context_lens[i] cached tokens."""

    def packed_duration_ns(self, chunks: Sequence[int], context_lens: Sequence[int]) -> int: ...


class Core(Protocol):
    catalog: Catalog

    def attach(self, handle: RequestHandle, prompt: Sequence[int] | int, **options) -> None: ...

    def detach(self, handle: RequestHandle) -> None: ...

    def execute(self, plan: ScheduledPlan, fence: Fence) -> Execution: ...
