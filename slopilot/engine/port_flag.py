"""The argparse type of a TCP port flag, shared by ``slopilot serve`` and ``slopilot meter``.

Checked when the command line is read, before a model loads or a socket binds: the
socket layer took 99999 modulo 65536 (uvicorn logged :99999 while listening on :34463),
and turned -1 into the resolver's "Servname not supported", naming no flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def port(flag: str) -> Callable[[str], int]:
    """argparse type: a TCP port, 0 (a free one) to 65535."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if not 0 <= value <= 65535:
            raise argparse.ArgumentTypeError(f"{flag} {text}: expected a port number, 0 to "
                                             "65535 (0 picks a free one)")
        return value
    return parse
