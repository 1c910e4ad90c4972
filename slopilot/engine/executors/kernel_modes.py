"""The names of the CPU kernel modes, without torch: the CLI's ``--help``, the profile
reader and the demo's replicas name them, and none of those may load torch to do so.

``auto`` runs the fused CPU kernels where they build and load, torch's ops otherwise;
``native`` refuses to start without them; ``torch`` always runs torch's ops
(``native_kernels.choose_kernels``). A cost profile records which of the two it was
timed with (``PROFILE_KERNELS``), never ``auto``: the twin must know what it measured; a
CUDA profile records ``torch``, ``cuda-graphs`` when its decode iterations were graph
replays (``decode_graphs.py``: a decode costs a tenth as much there), or
``cuda-graphs-piecewise`` when its passes with prefill chunks were piece replays too
(``piecewise_graphs.py``).
The torch executor's dtypes are named here too, for ``serve --dtype``; ``auto`` is the
executor's default (float32 on CPU, bfloat16 on CUDA).
"""

from __future__ import annotations

KERNEL_CHOICES = ("auto", "native", "torch")
PROFILE_KERNELS = ("native", "torch", "cuda-graphs", "cuda-graphs-piecewise")
DECODE_GRAPH_CHOICES = ("auto", "cuda", "padded", "off")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def executor_modes(profile_kernels: str | None) -> tuple[str, str, str]:
    """The executor's ``(cpu_kernels, decode_graphs, piecewise_graphs)`` that run what a
    profile recorded as ``profile_kernels``, so a twin and the engine it predicts run the
    same code; the defaults where the profile does not say."""
    if profile_kernels is None:
        return "auto", "auto", "off"
    if profile_kernels == "cuda-graphs":
        return "auto", "cuda", "off"
    if profile_kernels == "cuda-graphs-piecewise":
        return "auto", "cuda", "cuda"
    return profile_kernels, "off", "off"
