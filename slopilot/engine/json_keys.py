"""``json.loads`` for the JSON files a user hands in, refusing an object that gives a
key twice.

JSON keeps the last silently: an SLO file whose class said ``"ttft_p99_ms": 900`` and,
further down, ``9000`` was judged on 9 s, a knobs file's second ``token_budget`` won, a
trace row's prompt of 5,000 tokens read as the 100 given first. A YAML file is refused
so too (``sim/yaml_load.py``). JSON a program wrote (the Kubernetes API's, a client's
request) is read as JSON reads it, not here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slopilot.engine.bounded_read import read_bounded
from slopilot.engine.read_errors import unreadable


class DuplicateKey(Exception):
    """Not a ValueError: a caller's ``except ValueError`` says "not valid JSON", and the
    text is valid JSON; its message is the fix."""

    def __init__(self, key: str) -> None:
        shown = repr(key if len(key) <= 60 else key[:57] + "...")
        super().__init__(f"{shown} given twice in one object; JSON keeps only the last, "
                         "silently: keep the one you mean")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: the object, or DuplicateKey."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return obj


def loads_unique(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing an object that gives a key twice (DuplicateKey)."""
    return json.loads(text, object_pairs_hook=unique_keys)


class JsonFileError(Exception):
    """A file a user named that cannot be read as JSON; the message names the file and
    why, for the caller's own error (an SLO's, the alert factors')."""


def read_json_file(path: Path, max_bytes: int) -> Any:
    """The JSON value in ``path``, read within ``max_bytes`` (``bounded_read``), a key
    given twice refused; JsonFileError where it cannot be read or is not JSON."""
    try:
        return loads_unique(read_bounded(path, max_bytes).decode("utf-8"))
    except DuplicateKey as exc:
        raise JsonFileError(f"{path}: {exc}") from None
    except OSError as exc:
        raise JsonFileError(f"{path}: {unreadable(exc)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise JsonFileError(f"{path}: not valid JSON: {exc}") from None
