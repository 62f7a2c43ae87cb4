"""Request resources: state slots and KV pages, held by table rows."""

from __future__ import annotations

import numpy as np

from helios.errors import ResourceExhausted
from helios.scheduler.request_spec import RequestSpec
from helios.scheduler.requests import NO_SLOT, RequestTable


class ResourcePool:
    """Slots and pages. A request holds one slot and its full page extent while resident."""

    def __init__(self, slots: int, pages: int, page_tokens: int, max_context: int, draft_tokens: int = 0):
        self.page_tokens = page_tokens
        self.draft_tokens = draft_tokens
        self.max_context = max_context
        self.total_pages = pages
        self.free_pages = pages
        self._free_slots = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.total_slots = slots

    @property
    def free_slots(self) -> int:
        return len(self._free_slots)

    def extent_pages(self, spec: RequestSpec) -> int:
        # The whole context extent plus declared draft storage, pinned while resident.
        tokens = min(spec.prompt_tokens + spec.max_output_tokens, self.max_context) + self.draft_tokens
        return -(-tokens // self.page_tokens)

    def extent_pages_of(self, table: RequestTable, rows) -> np.ndarray:
        tokens = np.minimum(table.prompt_tokens[rows] + table.max_output[rows], self.max_context) + self.draft_tokens
        return -(-tokens // self.page_tokens)

    def acquire(self, table: RequestTable, rows) -> None:
        """Give each row a slot (in row order) and its page extent; all or nothing."""
        rows = np.asarray(rows, dtype=np.int64)
        need = self.extent_pages_of(table, rows)
        total = sum(need.tolist())
        if len(rows) > len(self._free_slots) or total > self.free_pages:
            raise ResourceExhausted(f"{len(rows)} requests need {total} pages; "
                                    f"{len(self._free_slots)} slots and {self.free_pages} pages are free")
        for r, n in zip(rows.tolist(), need.tolist()):
            table.slot[r] = self._free_slots.pop()
            table.pages[r] = n
        self.free_pages -= total

    def release(self, table: RequestTable, row: int) -> None:
        slot = int(table.slot[row])
        if slot == NO_SLOT:
            return
        self._free_slots.append(slot)
        self.free_pages += int(table.pages[row])
        table.slot[row], table.pages[row] = NO_SLOT, 0
