"""What every tensor-parallel rank does with a plan (the rank contract: helios/engine/tensor_parallel.py),
and the main loop of ranks 1..N-1, each in its own spawned process."""

from __future__ import annotations

import datetime
import hashlib
import logging
import pickle
import signal

import torch
import torch.distributed as dist

from helios.engine.sharding import Collectives, build_rank_core
from helios.engine.torch_core import TorchCore
from helios.engine.torch_state import validate_plan

log = logging.getLogger(__name__)


def apply_ops(core: TorchCore, ops) -> None:
    for op in ops:
        try:
            if op[0] == "attach":
                if op[1] not in core.requests:  # rank 0 attached it already
                    core.attach(op[1], op[2], **dict(op[3]))
            else:
                core.detach(op[1])
        except Exception:  # a disagreement shows up at the next plan's identity check
            log.exception("rank op %s failed", op[0])


def _records_digest(records) -> str:
    return hashlib.sha1(pickle.dumps([(r.handle, r.epoch, r.tokens, r.eos, r.offered) for r in records])).hexdigest()


def run_step(core: TorchCore, coll: Collectives, rank: int, world: int, plan, fence, fault):
    """Preflight identity all-gather, the forward, then a result all-gather.
    Returns (execution or None, preflight list, results list)."""
    try:
        if fault == "preflight":
            raise RuntimeError(f"injected fault on rank {rank}")
        works = validate_plan(plan, core.requests, core._free_slots, core.catalog, core.max_context)
        ident = (plan.shape, fence, tuple((w.lane.handle, w.lane.epoch, w.slot, w.request.kv_len,
                                           len(w.request.generated)) for w in works))
        if fault == "identity":
            ident = (ident[0], ident[1], ident[2] + (("corrupted", rank),))
        pre = ("ok", ident)
    except Exception as exc:
        pre = ("error", f"{type(exc).__name__}: {exc}")
    pres: list = [None] * world
    dist.all_gather_object(pres, pre)
    if any(p[0] != "ok" for p in pres) or any(p[1] != pres[0][1] for p in pres):
        return None, pres, None
    coll.ns = coll.calls = 0
    execution = None
    try:
        extra = 0
        if isinstance(fault, tuple) and fault[0] == "skew":
            # Test hook: this rank reports `seconds` more than it measured. (A rank that really
            # sleeps makes the others wait in the next all-reduce, and their intervals grow too.)
            extra = int(fault[1] * 1e9)
        execution = core.execute(plan, fence)
        if fault == "execute":
            raise RuntimeError(f"injected fault on rank {rank} after the forward")
        post = ("ok", execution.duration_ns + extra, coll.ns, _records_digest(execution.records))
    except Exception as exc:
        post = ("error", f"{type(exc).__name__}: {exc}")
    posts: list = [None] * world
    dist.all_gather_object(posts, post)
    return execution, pres, posts


def _serve(core: TorchCore, coll: Collectives, rank: int, world: int) -> None:
    """Ranks 1..N-1: follow rank 0's broadcasts until it says stop (or goes away)."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        msg = box[0]
        if msg[0] == "stop":
            return
        apply_ops(core, msg[1])
        if msg[0] == "run":
            _, _, plan, fence, faults = msg
            run_step(core, coll, rank, world, plan, fence, faults.get(rank))
        elif msg[0] == "time":
            _, _, shape, context = msg
            out: list = [None] * world
            dist.all_gather_object(out, core.time_graph(shape, context))


def _die_with_parent() -> None:
    try:  # Linux: SIGTERM this rank when rank 0's process dies, however it dies
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - not Linux
        pass


def worker_main(rank, world, init_method, backend, timeout_s, model_path, device, num_threads,
                 core_kwargs):
    _die_with_parent()
    if num_threads:
        torch.set_num_threads(num_threads)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        core, coll = build_rank_core(rank, world, model_path, device, core_kwargs)
        dist.barrier()
        _serve(core, coll, rank, world)
    except Exception as exc:  # rank 0 went away or a collective timed out
        log.warning("rank %d stops: %s", rank, exc)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
