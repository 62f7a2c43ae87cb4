"""OpenMP wait policy for the torch engine's CPU threads.

Why: torch's CPU kernels run on libgomp threads that, by default, spin at every barrier waiting
for their peers. When another process holds a core, the peer is descheduled and the spinning
thread burns its time slice: measured on this project's 2-core machine under load, a B=1 decode
took 390-530 ms with spinning threads and 90-220 ms with passive ones (1 thread: 90-140 ms), and
a 64-token prefill 2.4-6.1 s against 0.5-1.1 s. Those inflated runs are what seeded the startup
warm-up with 1.66 s decodes. Passive threads sleep at a barrier and cost a wake-up per parallel
region instead, which matters far less.

libgomp reads OMP_WAIT_POLICY once, when it is loaded with torch, so this must run before the
first `import torch`; an explicit setting in the environment is left as it is.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)


def prefer_passive_threads() -> bool:
    """Ask libgomp for passive waiting unless the user chose a policy; False (and a log line)
    when torch is already loaded, so the setting can no longer take effect."""
    if "OMP_WAIT_POLICY" in os.environ:
        return False
    if "torch" in sys.modules:
        log.info("torch is already imported; OMP_WAIT_POLICY=PASSIVE would not take effect")
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
