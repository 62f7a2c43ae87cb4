"""OpenMP wait policy for the torch engine's CPU threads.

Why: torch's CPU kernels run on libgomp threads that spin at every barrier waiting for their
peers. Spinning is what makes a decode's hundreds of small kernels fast; sleeping at every barrier
(OMP_WAIT_POLICY=PASSIVE, this server's choice before) made a B=16 decode 170-180 ms against 85 ms
on an idle 2-vCPU VM. But when another process holds a core, a spinning thread burns its time
slice waiting for a descheduled peer: with libgomp's default spin (300,000 rounds) and one CPU
burner, a B=1 decode took 719 ms against 62 ms on one thread.

So `flare run` asks for a short spin (GOMP_SPINCOUNT=10000: 39 ms for that decode when idle,
like the default) and lets helios.engine.cpu_threads drop torch threads while other processes
use the CPUs, which it reads from /proc/stat. Where there is no /proc/stat to read, it keeps the
passive policy instead. libgomp reads these once, when it is loaded with torch, so this must run
before the first `import torch`; a policy or spin count set in the environment is left as it is.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

SPIN_COUNT = "10000"


def choose_wait_policy() -> str | None:
    """Set the wait policy for the CPU threads; returns the variable set ("GOMP_SPINCOUNT" or
    "OMP_WAIT_POLICY"), or None when the environment chose one or torch is already loaded."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return None
    if "torch" in sys.modules:
        log.info("torch is already imported; the OpenMP wait policy can no longer be set")
        return None
    if os.access("/proc/stat", os.R_OK):
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
        return "GOMP_SPINCOUNT"
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return "OMP_WAIT_POLICY"
