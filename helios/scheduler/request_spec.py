"""What a caller tells the scheduler about a request: lengths, limits, endpoints, images."""

from __future__ import annotations

from dataclasses import dataclass

import math

from helios.errors import InvalidRequest
from helios.scheduler.service_class import DEFAULT_CLASS, ServiceClass


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """One image in a prompt: `tokens` prompt positions from `offset` that the vision graph's
    `features` feature rows fill (the features default to one per token). The span is atomic: no
    prefill chunk ends inside it."""

    offset: int
    tokens: int
    features: int | None = None

    def __post_init__(self) -> None:
        for name in ("offset", "tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "offset" else 1):
                raise InvalidRequest(f"image {name} must be a {'nonnegative' if name == 'offset' else 'positive'} "
                                     f"integer, got {v!r}")
        if self.features is None:
            object.__setattr__(self, "features", self.tokens)
        elif isinstance(self.features, bool) or not isinstance(self.features, int) or self.features < 1:
            raise InvalidRequest(f"image features must be a positive integer, got {self.features!r}")

    @property
    def end(self) -> int:
        return self.offset + self.tokens


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What the scheduler needs to know about a request: lengths, limits, endpoints.

    `endpoints` are the token offsets where completed messages end (checkpoint anchors);
    the prompt end is implicit. `host_feedback` marks requests whose every step needs the
    host (grammar, host-side stop strings), which keeps them out of queued frames.
    """

    prompt_tokens: int
    max_output_tokens: int
    cached_tokens: int = 0
    endpoints: tuple[int, ...] = ()
    client: str = "default"
    host_feedback: bool = False
    score_prompt: bool = False  # needs prompt log-probabilities: scored-prefill graphs only
    request_id: str | None = None
    images: tuple[ImageSpan, ...] = ()  # sorted, non-overlapping, inside the prompt (vision.py)
    # Service class and tenant (service_class.py): `client` names the tenant, `tenant_weight` is its
    # weight; `priority` is vLLM's integer (lower is more urgent; None: the class's tier).
    service_class: ServiceClass = DEFAULT_CLASS
    tenant_weight: float = 1.0
    priority: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_tokens, int) or self.prompt_tokens < 1:
            raise InvalidRequest(f"prompt_tokens must be a positive integer, got {self.prompt_tokens!r}")
        if not isinstance(self.max_output_tokens, int) or self.max_output_tokens < 1:
            raise InvalidRequest(f"max_output_tokens must be a positive integer, got {self.max_output_tokens!r}")
        if not isinstance(self.cached_tokens, int) or not 0 <= self.cached_tokens < self.prompt_tokens:
            raise InvalidRequest("cached_tokens must be in [0, prompt_tokens)")
        if any(not 0 < e < self.prompt_tokens for e in self.endpoints) or list(self.endpoints) != sorted(set(self.endpoints)):
            raise InvalidRequest("endpoints must be strictly increasing offsets inside the prompt")
        if self.images:
            _check_images(self.images, self.prompt_tokens, self.cached_tokens)
        if not isinstance(self.service_class, ServiceClass):
            raise InvalidRequest(f"service_class must be a ServiceClass, got {self.service_class!r}")
        w = self.tenant_weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (math.isfinite(w) and w > 0):
            raise InvalidRequest(f"tenant_weight must be a positive number, got {w!r}")
        if self.priority is not None and (isinstance(self.priority, bool) or not isinstance(self.priority, int)):
            raise InvalidRequest(f"priority must be an integer, got {self.priority!r}")

    @property
    def effective_priority(self) -> int:
        """vLLM's priority of this request: its own, else its class's tier."""
        return self.service_class.priority if self.priority is None else self.priority


def _check_images(images, prompt_tokens: int, cached_tokens: int) -> None:
    if not isinstance(images, tuple) or not all(isinstance(i, ImageSpan) for i in images):
        raise InvalidRequest("images must be a tuple of ImageSpan")
    end = 0
    for i, image in enumerate(images):
        if image.offset < end:
            raise InvalidRequest(f"image {i} at offset {image.offset} overlaps or precedes the previous image "
                                 f"(ending at {end}): images must be sorted and non-overlapping")
        if image.end > prompt_tokens:
            raise InvalidRequest(f"image {i} ends at {image.end}, past the {prompt_tokens}-token prompt")
        if image.offset < cached_tokens < image.end:
            raise InvalidRequest(f"image {i} straddles the cached prefix end {cached_tokens}")
        end = image.end
