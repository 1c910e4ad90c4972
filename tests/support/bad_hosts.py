"""``--host`` values no server here can listen on, with the start of the error each
command owes them: ``slopilot serve`` and ``slopilot meter`` name the flag alike
(``engine/listen_socket.py``)."""

from __future__ import annotations

BAD_HOSTS = [
    # The resolver's words vary with the machine's (no network: "Temporary failure").
    ("no.such.host.invalid", "--host no.such.host.invalid: cannot listen on "
                             "no.such.host.invalid:0: "),
    ("192.0.2.1", "--host 192.0.2.1: cannot listen on 192.0.2.1:0: Cannot assign "
                  "requested address; give an address of this machine"),  # TEST-NET-1
]
