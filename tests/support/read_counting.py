"""A server's HTTP protocol that counts the bytes it has read, so a live test can wait
until the server has handled everything it sent before moving its clock."""

from __future__ import annotations

import asyncio


def counting(cls: type[asyncio.Protocol], read: list[int]) -> type[asyncio.Protocol]:
    """``cls``, adding up the bytes it has read (each read counted once it is handled)."""

    class Counting(cls):  # type: ignore[valid-type, misc]
        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            read.append(len(data))

    return Counting
