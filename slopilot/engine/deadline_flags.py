"""The flags that set what a client may make a connection wait for
(``http_deadlines.Deadlines``), shared by ``slopilot serve`` and ``slopilot meter``, and
the parser of both commands' body sizes (``mib``), and their connection cap's
(``--max-connections``, ``connection_cap.py``).

Registration imports nothing heavy: uvicorn loads with the deadlines, in the handler.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slopilot.engine.http_deadlines import Deadlines


def add_deadline_flags(p: Any) -> None:
    """The four deadlines' flags on the command parser ``p``, each unset by default
    (``deadlines_from_flags`` keeps a deadline's default where its flag is not given)."""
    p.add_argument("--head-timeout", type=_seconds("--head-timeout"), default=None,
                   metavar="SECONDS", help="how long a request's head may take (default 30); "
                   "past it the answer is 408 and the connection closes")
    p.add_argument("--body-idle-timeout", type=_seconds("--body-idle-timeout"), default=None,
                   metavar="SECONDS", help="how long a request's body may send nothing while "
                   "the server waits for it (default 30); past it the connection closes and "
                   "the request ends as if its client left")
    p.add_argument("--send-timeout", type=_number("--send-timeout"), default=None,
                   metavar="SECONDS", help="how long a client may take no byte of the "
                   "answer the server holds for it (default 60, 0: no limit); past it the "
                   "connection is dropped and its request aborted, freeing its KV blocks")
    p.add_argument("--keep-alive-timeout", type=_seconds("--keep-alive-timeout"),
                   default=None, metavar="SECONDS", help="how long an idle connection is "
                   "kept for its next request (default 5, as vLLM's); behind a proxy or "
                   "mesh that keeps idle connections to the server, set it above the "
                   "proxy's idle timeout, or a request sent as the server closes is lost")


def _seconds(flag: str) -> Callable[[str], float]:
    """argparse type: a number of seconds above 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{flag} {text}: expected seconds above 0, "
                                             "e.g. 30")
        return value
    return parse


def _number(flag: str) -> Callable[[str], float]:
    """argparse type: a number; its bounds are its dataclass's to check
    (``deadlines_from_flags``)."""
    def parse(text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text}: expected a number of "
                                             "seconds, e.g. 60") from None
    return parse


# Each deadline's flag, by its field in ``Deadlines`` (the operator renders them too).
DEADLINE_FLAGS = {"head_s": "--head-timeout", "body_idle_s": "--body-idle-timeout",
                   "send_s": "--send-timeout", "keep_alive_s": "--keep-alive-timeout"}


def deadlines_from_flags(args: argparse.Namespace) -> Deadlines:
    """The flags given, each replacing its default (http_deadlines' constants); checked
    by ``Deadlines`` alone, its error told with the flag."""
    from slopilot.engine.http_deadlines import DeadlineError, Deadlines

    given = {name: value for name, value in (
        ("head_s", args.head_timeout), ("body_idle_s", args.body_idle_timeout),
        ("send_s", args.send_timeout), ("keep_alive_s", args.keep_alive_timeout))
        if value is not None}
    try:
        return Deadlines(**given)
    except DeadlineError as exc:
        raise ValueError(f"{DEADLINE_FLAGS[exc.field]} {exc.value:g}: {exc.expected}") \
            from None


def mib(flag: str, example: int) -> Callable[[str], int]:
    """argparse type of a size flag (``--max-body-mb``): MiB as a number above 0,
    returned in bytes."""
    def parse(text: str) -> int:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0 and value * 2**20 >= 1):
            raise argparse.ArgumentTypeError(f"{flag} {text}: expected MiB above 0, "
                                             f"e.g. {example}")
        return int(value * 2**20)
    return parse


MAX_CONNECTIONS_FLAG = "--max-connections"


def add_max_connections_flag(p: Any, default_text: str) -> None:
    """``--max-connections`` on ``p``, unset by default (``max_connections_from_flag``
    derives the default from ``ulimit -n``); ``default_text`` says what it is."""
    p.add_argument(MAX_CONNECTIONS_FLAG, type=_count(MAX_CONNECTIONS_FLAG), default=None,
                   metavar="N", help="connections held for clients at once (default "
                   f"{default_text}); past it a request is answered 503 with Retry-After "
                   "and its connection closed, while /health, /ping and /metrics still "
                   "answer")


def _count(flag: str) -> Callable[[str], int]:
    """argparse type: a whole number from 1 to ``connection_cap.MAX_CONNECTIONS``."""
    most = 1_000_000  # connection_cap.MAX_CONNECTIONS, not imported: uvicorn loads there

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{flag} {text!r}: expected a whole number of connections, e.g. 512"
            ) from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(
                f"{flag} {value}: expected 1 to {most} connections, e.g. 512 (0 would "
                "refuse every client; leave the flag out for the default)")
        return value
    return parse


def max_connections_from_flag(given: int | None, fds_per_connection: int) -> int:
    """The cap: ``given`` where the process can hold it, else ``ConnectionCapError``
    (naming the flag, the value and the fix); the default from ``ulimit -n`` unless given."""
    from slopilot.engine.connection_cap import (
        check_max_connections,
        default_max_connections,
        open_files_limit,
    )

    open_files = open_files_limit()
    if given is None:
        return default_max_connections(fds_per_connection, open_files)
    return check_max_connections(given, fds_per_connection, open_files)
