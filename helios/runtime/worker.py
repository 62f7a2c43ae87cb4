"""The worker thread that owns the core: attach, execute and detach run there, one after another
in the order they were queued, so a core never sees two threads. Results go back through `post`
(the runtime thread's inbox): ("done", fence, execution, completion ns), ("fault", fence,
exception) and ("attach_failed", handle, exception)."""

from __future__ import annotations

import logging
import queue
from typing import Callable

log = logging.getLogger(__name__)


class CoreWorker:
    def __init__(self, core, post: Callable[[tuple], None], clock: Callable[[], int]):
        self.core = core
        self._post = post
        self._clock = clock
        self._work: queue.SimpleQueue = queue.SimpleQueue()  # runtime -> worker, FIFO

    def attach(self, handle, prompt, options: dict) -> None:
        self._work.put(("attach", handle, prompt, options))

    def execute(self, plan, fence: int) -> None:
        self._work.put(("execute", plan, fence))

    def detach(self, handle) -> None:
        self._work.put(("detach", handle))

    def close(self) -> None:
        """The worker ends after the work queued before this."""
        self._work.put(None)

    def run(self) -> None:
        while (item := self._work.get()) is not None:
            kind = item[0]
            try:
                if kind == "execute":
                    _, plan, fence = item
                    try:
                        execution = self.core.execute(plan, fence)
                    except Exception as exc:
                        self._post(("fault", fence, exc))
                    else:
                        self._post(("done", fence, execution, int(self._clock())))
                elif kind == "attach":
                    _, handle, prompt, options = item
                    try:
                        self.core.attach(handle, prompt, **options)
                    except Exception as exc:
                        self._post(("attach_failed", handle, exc))
                elif kind == "detach":
                    self.core.detach(item[1])
            except Exception:
                log.exception("helios worker: %s failed", kind)
