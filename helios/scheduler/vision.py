"""Vision windows: image spans, whole-image windows, and where prefill may legally stop.

Spec ("Prerequisites and completion"): image dependencies are grouped into whole-image windows
bounded by prepared feature storage; vision prerequisites populate the active window; prefill
stops before the following window's first dependency; atomic image spans remain within one
prefill chunk. A request spanning several windows reserves one private snapshot row; at each
window boundary its submitted work drains, a SNAPSHOT copies the exact consumed state, a RESTORE
binds it to a fresh generation (epoch), and the next window's VISION graph writes compact feature
offsets from zero. The logical request (handle, prompt, limits, counters) is unchanged.

The per-request state machine, one window at a time:

    vision due (active window not populated)  --VISION completes-->  populated
    populated: prefill up to the next window's first image (or the prompt end)
    cursor at that image, drained  --SNAPSHOT (private) completes-->  restore due, epoch + 1
    restore due  --RESTORE (private) completes-->  next window active, vision due

Everything here is pure bookkeeping; candidates and their values are in vision_candidates.py.
The feature storage is the catalog's: the token capacity W of its VISION graphs (one row of a
B x W vision graph holds one request's window).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from helios.config import SchedulerConfig
from helios.errors import InvalidRequest, StalePlan
from helios.graphs import Catalog, GraphKind
from helios.scheduler.plan import RequestHandle, ScheduledPlan
from helios.scheduler.request_spec import ImageSpan, RequestSpec
from helios.scheduler.requests import DONE, PREFILL, RequestTable


@dataclass(frozen=True, slots=True)
class Window:
    """Whole images whose features fit the prepared storage together."""

    images: tuple[ImageSpan, ...]
    feature_offsets: tuple[int, ...]  # each image's features from offset zero of the storage

    @property
    def start(self) -> int:
        """The window's first dependency: prefill stops before it until the window is populated."""
        return self.images[0].offset

    @property
    def features(self) -> int:
        return self.feature_offsets[-1] + self.images[-1].features


def group_windows(images, storage: int) -> tuple[Window, ...]:
    """Consecutive whole images, greedily, while their features fit `storage`."""
    windows, current = [], []
    for i, image in enumerate(images):
        if image.features > storage:
            raise InvalidRequest(f"image {i} has {image.features} features; the prepared feature storage "
                                 f"holds {storage}")
        if current and sum(im.features for im in current) + image.features > storage:
            windows.append(current)
            current = []
        current.append(image)
    if current:
        windows.append(current)
    out = []
    for group in windows:
        offsets = np.concatenate([[0], np.cumsum([im.features for im in group])[:-1]]).astype(int).tolist()
        out.append(Window(tuple(group), tuple(offsets)))
    return tuple(out)


@dataclass(slots=True)
class WindowState:
    """One request's windows and where it stands."""

    windows: tuple[Window, ...]
    starts: tuple[int, ...]  # every image's offset (sorted), for the span lookup
    ends: tuple[int, ...]
    prompt_tokens: int
    active: int = 0
    populated: bool = False  # the active window's vision graph completed
    restore_due: bool = False  # the boundary snapshot completed; the restore has not
    busy: bool = False  # a window operation of this request is in flight
    row: bool = False  # holds a private snapshot row

    @property
    def multi(self) -> bool:
        return len(self.windows) > 1

    @property
    def needs_row(self) -> bool:
        """A vision graph must reserve the private row: a window boundary lies ahead, none held."""
        return not self.row and self.active + 1 < len(self.windows)

    def limit(self, active: int, populated: bool) -> int:
        """Prefill may consume up to here: the next window's first image once `active` is
        populated (the prompt end after the last window), else the active window's first image."""
        if populated:
            return self.windows[active + 1].start if active + 1 < len(self.windows) else self.prompt_tokens
        return self.windows[active].start

    def legal_end(self, cursor: int, want: int, active: int | None = None, populated: bool | None = None) -> int:
        """The largest chunk end <= `want` that passes no unpopulated window and splits no image."""
        a = self.active if active is None else active
        p = self.populated if populated is None else populated
        end = min(want, self.limit(a, p))
        if end <= cursor:
            return cursor
        i = bisect_right(self.starts, end - 1) - 1  # the last image starting before `end`
        if i >= 0 and self.ends[i] > end:
            end = self.starts[i]  # stop before an image the chunk would split
        return max(end, cursor)

    def boundary(self) -> int | None:
        """The next window's first image, where the boundary snapshot is taken (None: last window)."""
        return self.windows[self.active + 1].start if self.active + 1 < len(self.windows) else None

    def snapshot_due(self, cursor: int) -> bool:
        return self.populated and not self.restore_due and self.boundary() == cursor


class VisionWindows:
    """Window state of every request with images, and the private snapshot rows."""

    def __init__(self, catalog: Catalog, config: SchedulerConfig, planned: bool = True):
        self.shapes = tuple(sorted(catalog.of_kind(GraphKind.VISION), key=lambda s: s.batch_capacity))
        self.snapshot_shapes = catalog.of_kind(GraphKind.SNAPSHOT)
        self.restore_shapes = catalog.of_kind(GraphKind.RESTORE)
        # Every vision graph must hold a whole window in one row: the storage is the smallest W.
        self.storage = min((s.token_capacity for s in self.shapes), default=0)
        self.enabled = planned and bool(self.shapes)
        self.crosses = bool(self.snapshot_shapes and self.restore_shapes)  # multi-window requests possible
        self.rows_total = config.window_snapshot_rows
        self.rows_free = config.window_snapshot_rows
        self.requests: dict[RequestHandle, WindowState] = {}

    # ---- admission ----------------------------------------------------------------------
    def check(self, spec: RequestSpec, max_chunk: int) -> tuple[Window, ...]:
        """The request's windows, or InvalidRequest when it cannot be served."""
        if not self.enabled:
            raise InvalidRequest("a request with images needs VISION graphs and a scheduler that plans them")
        images = tuple(im for im in spec.images if im.offset >= spec.cached_tokens)
        windows = group_windows(images, self.storage)
        if len(windows) > 1 and not self.crosses:
            raise InvalidRequest(f"the images need {len(windows)} windows of {self.storage} features; "
                                 "crossing a window needs SNAPSHOT and RESTORE graphs")
        big = max((im.tokens for im in images), default=0)
        if big > max_chunk:
            raise InvalidRequest(f"an image span of {big} tokens exceeds the largest prefill chunk ({max_chunk}): "
                                 "an image must fit one chunk")
        return windows

    def admitted(self, handle: RequestHandle, spec: RequestSpec, windows: tuple[Window, ...]) -> None:
        if not windows:
            return  # every image lies in the restored prefix
        images = [im for w in windows for im in w.images]
        self.requests[handle] = WindowState(windows, tuple(im.offset for im in images),
                                            tuple(im.end for im in images), spec.prompt_tokens)

    # ---- readiness -------------------------------------------------------------------------
    def not_ready(self, t: RequestTable, rows: np.ndarray) -> np.ndarray:
        """Mask over `rows`: prompts that can legally consume no token now (waiting for a window
        operation)."""
        mask = np.zeros(len(rows), dtype=bool)
        for i, (h, r) in enumerate(zip(t.handle[rows].tolist(), rows.tolist())):
            ws = self.requests.get(h)
            if ws is not None and t.phase[r] == PREFILL:
                cursor = int(t.prompt_done[r] + t.queued_prompt[r])
                mask[i] = ws.legal_end(cursor, int(t.prompt_tokens[r])) == cursor
        return mask

    def restrict(self, view, t: RequestTable) -> None:
        """Give each prefill pool holding image requests the clip of its lanes' legal work."""
        for pool, prow in view.prefill.values():
            states = [self.requests.get(h) for h in pool.handles.tolist()]
            if any(s is not None for s in states):
                pool.clip = _clipper(states, t.prompt_done[prow] + t.queued_prompt[prow])

    # ---- commit and completion -------------------------------------------------------------
    def is_window_plan(self, plan: ScheduledPlan) -> bool:
        return plan.shape.kind is GraphKind.VISION or plan.private_state

    def check_commit(self, plan: ScheduledPlan) -> None:
        need = self._rows_needed(plan)
        if need > self.rows_free:
            raise StalePlan(f"the plan needs {need} private snapshot rows; {self.rows_free} are free")

    def committed(self, plan: ScheduledPlan) -> None:
        self.rows_free -= self._rows_needed(plan)
        for h in plan.handles:
            ws = self.requests[h]
            ws.busy = True
            if plan.shape.kind is GraphKind.VISION and ws.needs_row:
                ws.row = True

    def _rows_needed(self, plan: ScheduledPlan) -> int:
        if plan.shape.kind is not GraphKind.VISION:
            return 0
        return sum(1 for h in plan.handles if self.requests[h].needs_row)

    def completed(self, plan: ScheduledPlan, t: RequestTable) -> None:
        """A window operation completed: advance each live lane's request."""
        kind = plan.shape.kind
        for h in plan.handles:
            ws, row = self.requests.get(h), t.index.get(h)
            if ws is None:
                continue
            ws.busy = False
            if row is None or t.phase[row] == DONE:
                continue  # cancelled in flight: its row is released at retirement
            if kind is GraphKind.VISION:
                ws.populated = True
            elif kind is GraphKind.SNAPSHOT:
                ws.restore_due = True
                t.rebind(row)  # the restore binds the consumed state to a fresh generation
            else:
                ws.restore_due, ws.populated = False, False
                ws.active += 1
                if ws.boundary() is None:
                    self._release(ws)  # no boundary left: the private row has done its work

    def retired(self, handle: RequestHandle) -> None:
        ws = self.requests.pop(handle, None)
        if ws is not None:
            self._release(ws)

    def _release(self, ws: WindowState) -> None:
        if ws.row:
            ws.row = False
            self.rows_free += 1


def _clipper(states, cursors: np.ndarray):
    """clip(idx, works): each pool entry's work cut to its largest legal chunk end (text-only
    lanes unchanged)."""
    cursors = cursors.tolist()

    def clip(idx: np.ndarray, works: np.ndarray) -> np.ndarray:
        out = np.array(works, dtype=np.int64)
        for j, i in enumerate(np.asarray(idx).tolist()):
            ws = states[i]
            if ws is not None:
                out[j] = ws.legal_end(cursors[i], cursors[i] + int(out[j])) - cursors[i]
        return out
    return clip
