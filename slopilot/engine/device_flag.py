"""The ``--device`` flag of ``slopilot serve`` and ``slopilot calibrate``: one check for
both, before any model loads.

torch's own refusal of a device string it cannot parse ("tpu", "cuda:x") reached serve's
user as a RuntimeError traceback; calibrate already checked the flag, in words.
"""

from __future__ import annotations


class DeviceError(ValueError):
    """``--device`` names no device this machine has; the message names the fix."""


def check_device(device: str) -> None:
    """Refuse a device this machine does not have before any model is loaded. torch is
    imported only for ``cuda``: serve checks a CPU device before its OpenMP placement,
    which must be set before torch loads (cpu_threads.py)."""
    kind, sep, index = device.partition(":")
    # cpu:0 is torch's too (serve took it before this check); "cuda:" is no device.
    if kind not in ("cpu", "cuda") or (sep and not (index.isascii() and index.isdigit())):
        raise DeviceError(f"--device {device!r}: use cpu, cuda or cuda:N (or cpu:N)")
    if kind != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(
            f"--device {device}: torch {torch.__version__} sees no CUDA device on this "
            "machine; use --device cpu here, or run on the GPU node")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise DeviceError(f"--device {device}: this machine has {count} CUDA device(s), "
                          f"cuda:0 to cuda:{count - 1}")
