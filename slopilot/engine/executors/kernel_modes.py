"""The names of the CPU kernel modes, without torch: the CLI's ``--help``, the profile
reader and the demo's replicas name them, and none of those may load torch to do so.

``auto`` runs the fused CPU kernels where they build and load, torch's ops otherwise;
``native`` refuses to start without them; ``torch`` always runs torch's ops
(``native_kernels.choose_kernels``). A cost profile records which of the two it was
timed with (``PROFILE_KERNELS``), never ``auto``: the twin must know what it measured.
The torch executor's dtypes are named here too, for ``serve --dtype``; ``auto`` is the
executor's default (float32 on CPU, bfloat16 on CUDA).
"""

from __future__ import annotations

KERNEL_CHOICES = ("auto", "native", "torch")
PROFILE_KERNELS = ("native", "torch")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")
