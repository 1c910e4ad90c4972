"""Engine knobs: one frozen dataclass, bounds checked once, presets per latency tier.

Every knob the tuner moves lives here. A config is immutable; a live change builds a
new one (``with_overrides``) and the engine swaps it in between iterations, so the
scheduler never sees a half-applied change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A knob value is out of range or of the wrong type; the message names the fix.

    ``field`` is the knob to change (None when the error is about no single knob);
    ``fields`` lists every knob involved, ``field`` first: more than one means a
    cross-field rule (chunk_size against token_budget), judged only on the whole config.
    """

    def __init__(self, message: str, field: str | None = None, *,
                 related: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.field = field
        self.fields: tuple[str, ...] = ((field,) if field else ()) + related


class PreemptionMode(enum.StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"
    AUTO = "auto"


def _knob(default: Any, doc: str, lo: float | None = None, hi: float | None = None,
          choices: tuple[Any, ...] | None = None, live: bool = True) -> Any:
    return field(default=default, metadata={
        "doc": doc, "lo": lo, "hi": hi, "choices": choices, "live": live})


@dataclass(frozen=True, slots=True)
class EngineConfig:
    token_budget: int = _knob(
        1024, "Max tokens one iteration processes (vLLM max_num_batched_tokens); "
        "rounded up to budget_align.", 128, 16384)
    budget_align: int = _knob(
        256, "Tile quantization: the budget is rounded up to a multiple of this.",
        choices=(1, 64, 128, 256))
    chunk_size: int = _knob(
        512, "Max prefill tokens one request gets in one iteration "
        "(vLLM long_prefill_token_threshold); at most token_budget.", 64, 16384)
    max_num_seqs: int = _knob(
        256, "Max running requests; at most the (aligned) token budget are run, so that "
        "every running decode gets its token each iteration.", 1, 4096)
    preemption_mode: PreemptionMode = _knob(
        PreemptionMode.AUTO, "recompute, swap, or auto (hybrid by recompute_max_tokens).",
        choices=tuple(PreemptionMode))
    recompute_max_tokens: int = _knob(
        512, "In auto mode a victim with fewer computed tokens than this is recomputed, "
        "a longer one swapped.", 0, 65536)
    max_preemptions_per_step: int = _knob(2, "Max victims in one iteration.", 0, 64)
    swap_timeout_ms: float = _knob(
        50.0, "A victim whose estimated swap-out time exceeds this is not preempted; "
        "the newcomer waits.", 0, 10000)
    p0_preempt_utilization: float = _knob(
        0.9, "A waiting P0 request may preempt running P1/P2 for KV blocks only while "
        "KV usage is above this; for a seq slot it may whenever every slot is taken.",
        0.0, 1.0)
    kv_watermark: float = _knob(
        0.05, "Fraction of KV blocks kept free when admitting new requests.", 0.0, 0.5)
    block_size: int = _knob(16, "Tokens per KV block.", 8, 128, live=False)
    swap_space_gb: float = _knob(
        32.0, "Host memory for swapped-out KV blocks.", 0, 1024, live=False)
    max_waiting: int = _knob(
        4096, "Max queued requests, preempted ones included; beyond it a newcomer gets "
        "429 unless a less urgent request not yet started gives way to it.", 1, 1_000_000)
    enable_prefix_caching: bool = _knob(True, "Reuse full KV blocks across requests.")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            meta = f.metadata
            default = f.default
            if isinstance(default, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{f.name}={value!r}: expected true or false", f.name)
            elif isinstance(default, int):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{f.name}={value!r}: expected an integer", f.name)
            elif isinstance(default, float) and (
                    isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ConfigError(f"{f.name}={value!r}: expected a finite number", f.name)
            choices = meta.get("choices")
            if choices is not None and value not in choices:
                allowed = ", ".join(str(getattr(c, "value", c)) for c in choices)
                raise ConfigError(f"{f.name}={value!r} is not allowed; use one of: {allowed}",
                                  f.name)
            lo, hi = meta.get("lo"), meta.get("hi")
            if lo is not None and hi is not None and not lo <= value <= hi:
                raise ConfigError(
                    f"{f.name}={value!r} is out of range; use a value in [{lo}, {hi}]", f.name)
        if self.chunk_size > self.effective_budget:
            rounded = "" if self.effective_budget == self.token_budget else \
                f" (token_budget={self.token_budget} rounded up to " \
                f"budget_align={self.budget_align})"
            raise ConfigError(
                f"chunk_size={self.chunk_size} exceeds the token budget "
                f"{self.effective_budget}{rounded}; lower chunk_size or raise token_budget",
                "chunk_size", related=("token_budget",))

    @property
    def effective_budget(self) -> int:
        """The budget after rounding up to the tile alignment."""
        a = self.budget_align
        return -(-self.token_budget // a) * a

    @property
    def effective_max_num_seqs(self) -> int:
        """The most requests that run at once: ``max_num_seqs``, at most the budget.

        One iteration gives every running decode a token of the budget, so more running
        requests than the budget would leave some decodes without a token (and the same
        ones every step: ``running`` is in rank order). vLLM refuses such a config; here
        it is capped, because the tuner draws the two knobs independently and a refused
        trial would be a wasted one (the operator gives vLLM the same value)."""
        return min(self.max_num_seqs, self.effective_budget)

    def with_overrides(self, overrides: Mapping[str, Any], *, live_only: bool = False
                       ) -> EngineConfig:
        """A new validated config; unknown names and non-live knobs (if asked) are refused."""
        known = {f.name: f for f in dataclasses.fields(self)}
        changes: dict[str, Any] = {}
        for name, raw in overrides.items():
            if name not in known:
                raise ConfigError(
                    f"unknown knob {name!r}; known knobs: {', '.join(sorted(known))}", name)
            if live_only and not known[name].metadata["live"] and raw != getattr(self, name):
                raise ConfigError(
                    f"{name} cannot change on a running engine; restart it with the new value",
                    name)
            changes[name] = coerce_knob(name, raw)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["preemption_mode"] = self.preemption_mode.value
        return out

    @staticmethod
    def restart_knobs() -> tuple[str, ...]:
        """The knobs a running engine cannot change (``live=False``): a new value needs a
        restart, so a deployment's pod template carries them and no live PUT does."""
        return tuple(f.name for f in dataclasses.fields(EngineConfig)
                     if not f.metadata["live"])

    @staticmethod
    def knob_docs() -> dict[str, str]:
        return {f.name: f.metadata["doc"] for f in dataclasses.fields(EngineConfig)}


# What a knob's text must be, in the words of the error ("expected a whole number").
_KINDS: dict[type, str] = {bool: "true or false", int: "a whole number", float: "a number"}
# A knob's text is an ASCII decimal: Python's int() and float() also take underscores
# ("5_12") and any script's digits ("١٠٢٤"), and float() "nan" and "inf".
_INTEGER_TEXT = re.compile(r"[-+]?[0-9]+\Z")
_NUMBER_TEXT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?\Z")


def coerce_knob(name: str, raw: Any) -> Any:
    """Turn a CLI or JSON value into the knob's type; the dataclass then checks bounds."""
    fields_by_name = {f.name: f for f in dataclasses.fields(EngineConfig)}
    f = fields_by_name[name]
    default = f.default
    if isinstance(default, PreemptionMode):
        try:
            return PreemptionMode(raw.value if isinstance(raw, PreemptionMode) else str(raw))
        except ValueError:
            raise ConfigError(
                f"{name}={raw!r} is not allowed; use one of: recompute, swap, auto",
                name) from None
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if isinstance(default, int):
            if not _INTEGER_TEXT.match(text):
                raise ValueError(text)
            return int(text)
        if isinstance(default, float):
            if not _NUMBER_TEXT.match(text):
                raise ValueError(text)
            return float(text)
    except ValueError:
        kind = _KINDS.get(type(default), type(default).__name__)
        raise ConfigError(f"{name}={raw!r}: expected {kind}", name) from None
    return text


def knobs_from_json(data: Mapping[str, Any]) -> dict[str, Any]:
    """Knobs as a JSON body gives them (the admin API), each checked to be a JSON value of
    its knob's type: a number for a numeric knob (an integral one, 512.0, for a whole
    number), ``true``/``false`` for a switch, a string for a mode. Text is for the command
    line (``coerce_knob``); here a string such as "5_12" is refused, not read as 512.
    Unknown names pass through, for ``with_overrides`` to refuse with the known ones."""
    fields_by_name = {f.name: f for f in dataclasses.fields(EngineConfig)}
    out: dict[str, Any] = {}
    for name, value in data.items():
        f = fields_by_name.get(name)
        out[name] = value if f is None else _json_knob(name, f.default, value)
    return out


def _json_knob(name: str, default: Any, value: Any) -> Any:
    if isinstance(default, PreemptionMode):
        if isinstance(value, str):
            return value
        want, example = "one of recompute, swap, auto as a JSON string", '"swap"'
    elif isinstance(default, bool):
        if isinstance(value, bool):
            return value
        want, example = "true or false as a JSON boolean", "false"
    else:
        whole = isinstance(default, int)
        if not isinstance(value, bool) and isinstance(value, (int, float)):
            if not whole or isinstance(value, int):
                return value  # the config's own checks bound it
            if math.isfinite(value) and value.is_integer():
                return int(value)
        want = ("a whole number" if whole else "a number") + " as a JSON number"
        example = str(default)
    if isinstance(value, str) and not isinstance(default, PreemptionMode):
        want += ", not a string"
        with contextlib.suppress(ConfigError):  # text the command line takes: its value
            meant = coerce_knob(name, value)
            if not isinstance(meant, float) or math.isfinite(meant):
                example = json.dumps(meant)
    raise ConfigError(f"{name}={value!r}: expected {want}; e.g. {{\"{name}\": {example}}}",
                      name)


def parse_set_args(items: list[str]) -> dict[str, str]:
    """Parse repeated ``knob=value`` strings from the command line."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {item!r}: expected knob=value, e.g. token_budget=512",
                              name.strip() or None)
        out[name.strip()] = value
    return out


PRESETS: dict[str, dict[str, Any]] = {
    # Tier presets from the latency SLOs: a smaller budget bounds each iteration's time.
    "strict": {"token_budget": 512, "chunk_size": 256},
    "standard": {"token_budget": 1024, "chunk_size": 512},
    "relaxed": {"token_budget": 2048, "chunk_size": 1024},
}


def preset(name: str, **overrides: Any) -> EngineConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; use one of: {', '.join(PRESETS)}")
    return EngineConfig().with_overrides({**PRESETS[name], **overrides})
