"""Fair admission (issue 42): one request's `n`, or one client, never takes the whole admission
limit.

The server admits at most `limit` = slots + --max-queue sequences (choices) at once and answers
429 past it. vLLM and llama.cpp bound only the total (vLLM's max_num_seqs with an unbounded
waiting queue, llama.cpp's slots with a task queue), so a single `n=64` request, or a client that
keeps many requests open, fills the bound and every other client gets 429 until it is done.
Here one client holds at most `share` of the limit (default half, --client-share): a request
whose sequences exceed the share can never be admitted (400 naming `n`), and a client at its
share gets 429 while others are still admitted. Past admission the scheduler's fairness prices
divide the slots among clients (docs/scheduling-utility.md).

The client is the request's `user` field when it sends one (the unit the scheduler prices and
the service-class tenants key on), else the connection's address.
"""

from __future__ import annotations

import math

from helios.server.errors import APIError


def client_key(user: str | None, address: str | None) -> str:
    """The unit of fair admission, and the scheduler's client (its tenant, its slot share): `user`
    when given, as the service classes' tenant tables name it, else "addr:" and the client's address."""
    return user if user else f"addr:{address or 'unknown'}"


class Admission:
    """Live sequences in total and by client; not thread-safe (the Service's lock guards it)."""

    def __init__(self, limit: int, share: float = 0.5):
        if not 0 < share <= 1:
            raise ValueError(f"the client share must be in (0, 1], got {share}")
        self.limit = limit
        self.per_client = max(1, math.floor(limit * share))
        self.share = share
        self.live = 0
        self.by_client: dict[str, int] = {}

    def check(self, key: str | None, sequences: int) -> None:
        """A 400 for a request that can never be admitted, a 429 for one that cannot be now."""
        cap = self.limit if key is None else self.per_client
        if sequences > cap:
            whole = sequences > self.limit
            raise APIError(400, f"the request asks for {sequences} sequences (n x prompts); this server runs or "
                                f"queues at most {self.limit} at once" + ("" if whole else
                                f", and one client may hold at most {cap} of them (--client-share {self.share:g})"),
                           param="n", code="invalid_value")
        if self.live + sequences > self.limit:
            raise APIError(429, f"the server is at capacity ({self.live} requests running or queued; the "
                                f"limit is {self.limit}); retry later", code="queue_full", headers={"retry-after": "1"})
        held = self.by_client.get(key, 0) if key is not None else 0
        if key is not None and held + sequences > cap:
            raise APIError(429, f"this client already holds {held} of the {cap} sequences one client may have "
                                f"running or queued (of {self.limit}); retry later", code="client_share_full",
                           headers={"retry-after": "1"})

    def take(self, key: str | None, sequences: int) -> None:
        self.check(key, sequences)
        self.live += sequences
        if key is not None:
            self.by_client[key] = self.by_client.get(key, 0) + sequences

    def release(self, key: str | None, sequences: int = 1) -> None:
        self.live -= sequences
        if key is not None:
            left = self.by_client.get(key, 0) - sequences
            if left > 0:
                self.by_client[key] = left
            else:
                self.by_client.pop(key, None)
