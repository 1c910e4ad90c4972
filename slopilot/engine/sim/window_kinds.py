"""The kinds of window a trace is judged on (``windows.trace_windows`` chooses them), in
the order chosen, and how each is said: one list for the help, the refusals and the
plan's own description. Three hand-written copies said "its busiest and a typical one"
after the heaviest prompts' window was added, beside a run that judged four windows.

No heavy import: the CLI's help reads it at registration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowKind:
    name: str
    """``WindowChoice.name``: ``busiest arrivals``."""
    said: str
    """As a sentence names one window: ``busiest window by arrivals``."""
    short: str
    """As a list of kinds names it: ``busiest by arrivals``."""
    always: bool
    """Chosen on every trace with traffic; else only where it lies outside the others."""


KINDS = (
    WindowKind("busiest arrivals", "busiest window by arrivals", "busiest by arrivals", True),
    WindowKind("busiest tokens", "busiest window by tokens", "busiest by tokens", True),
    WindowKind("sharpest burst", "sharpest burst's window", "sharpest burst's", False),
    WindowKind("typical", "typical window", "typical", True),
    WindowKind("heaviest prompts", "heaviest prompts' window", "heaviest prompts'", False),
    WindowKind("fullest KV cache", "fullest KV cache's window", "fullest KV cache's", False),
)


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def kinds_text() -> str:
    """The windows a trace may be judged on, for help and refusals: ``busiest by
    arrivals, busiest by tokens and typical, and sharpest burst's, ... where those lie
    outside them``."""
    always = _listed([k.short for k in KINDS if k.always])
    sometimes = _listed([k.short for k in KINDS if not k.always])
    return f"{always}, and {sometimes} where those lie outside them"
