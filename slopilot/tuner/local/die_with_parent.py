"""A child process that ends when the process that started it dies, SIGKILL included.

``close()`` and the ``with`` blocks stop what the demo started on any exit Python sees;
a SIGKILL runs none of them, and a Prometheus or a replica started by a killed demo ran
on under init. ``die_with_parent`` is a ``preexec_fn``: in the child, before exec, it
asks Linux (``prctl(PR_SET_PDEATHSIG)``) for SIGTERM when the parent goes.

Linux sends it when the *thread* that started the child ends, not only the process:
start such children from a thread that lives as long as the process (the demo's main
thread does). Elsewhere (not glibc Linux) it does nothing, and the context managers
remain the only stop.
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def _libc_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, in the parent: between fork and exec the child may not import nor load
# a library (another thread of the parent may have held the import lock at the fork,
# and the child would wait on it for ever).
_PRCTL = _libc_prctl()


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
