"""Keep glibc from handing a forward pass's large freed buffers back to the OS.

A decode step gathers each layer's padded keys and values (tens of MB near saturation),
frees them, and gathers again at the next layer. glibc returns a freed chunk above its
mmap threshold to the OS at once, and trims the heap's top once more than its trim
threshold lies free there (both adapt to a few tens of MB, then stop adapting), so every
layer faulted its buffers back in page by page: at 32 decodes padded to 30-32k tokens on
SmolLM2 about 350,000 minor faults an iteration and twice the step time of a batch just
under that size, the knee the twin's form had to model (docs/twin.md). With the trim
threshold raised and the mmap threshold at its ceiling the memory stays in the heap for
the next layer: about one fault an iteration. The cost is that the process keeps the
peak it reached instead of shrinking back, as a long-running engine does anyway.

Process-wide, like the tcmalloc the container preloads (which glibc's mallopt does not
touch). Only on CPU, where the "device" buffers are host memory; ``SLOPILOT_KEEP_FREED_MEMORY=0``
leaves glibc's defaults (for a process that must give memory back).
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

# glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above half its largest heap: 32 MiB on 64-bit.
MMAP_THRESHOLD_MAX = 32 << 20
TRIM_THRESHOLD = 1 << 30

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the thresholds once per process; whether this libc took them."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get("SLOPILOT_KEEP_FREED_MEMORY", "1") == "0":
        _applied = False
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no glibc (musl, macOS): nothing to tune
        _applied = False
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _applied:
        log.warning("mallopt refused the host allocator's thresholds: large decode "
                    "batches may page-fault their buffers on every layer")
    return _applied
