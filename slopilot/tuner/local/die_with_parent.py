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

import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not glibc Linux: close() and the context managers still stop the child
