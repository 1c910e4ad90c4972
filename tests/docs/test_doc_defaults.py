"""The defaults the help texts and the docs state are the ones the code runs with.

A flag left unset often keeps a constant of another module (``--keep-alive-timeout``:
``http_deadlines.KEEP_ALIVE_S``), and its help writes the number out, as the docs do
("5 by default"): three places for one figure, of which only the constant is run. The
README's knob table repeats ``EngineConfig``'s defaults and ranges the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from slopilot.cli import build_parser
from slopilot.engine.config import EngineConfig
from slopilot.engine.http_deadlines import Deadlines
from slopilot.engine.meter.body_budget import BODY_BUDGET_MIB, MAX_BODY_MIB
from slopilot.engine.server.request_limits import DEFAULT_MAX_BODY_BYTES
from slopilot.tuner.local.demo import DemoOptions
from slopilot.tuner.sim.robust import TRACE_WINDOW_S
from slopilot.tuner.tune.settings import DEFAULT_MAX_TOO_LONG, DEFAULT_SEEDS, DEFAULT_WARMUP_S
from tests.docs.test_doc_references import DOCS, ROOT, _subcommands

# A default a help text states: "(default 30)", "(default: auto, as serve)", "Default: ...".
HELP_DEFAULT = re.compile(r"\b[Dd]efault:?\s+([^\s,;)]+)")

# The flags left unset by default (None) whose value then comes from a constant: the
# constant, by command and flag. A help that states a number for such a flag must be here.
_DEADLINES = Deadlines()
_DEMO = DemoOptions()
_DEADLINE_FLAGS = {"--head-timeout": _DEADLINES.head_s,
                   "--body-idle-timeout": _DEADLINES.body_idle_s,
                   "--send-timeout": _DEADLINES.send_s,
                   "--keep-alive-timeout": _DEADLINES.keep_alive_s}
UNSET_DEFAULTS: dict[tuple[str, str], float] = {
    **{("serve", flag): value for flag, value in _DEADLINE_FLAGS.items()},
    **{("meter", flag): value for flag, value in _DEADLINE_FLAGS.items()},
    ("serve", "--max-body-mb"): DEFAULT_MAX_BODY_BYTES / 2**20,
    ("meter", "--max-body-mb"): MAX_BODY_MIB,
    ("meter", "--body-budget-mb"): BODY_BUDGET_MIB,
    ("tune", "--seeds"): DEFAULT_SEEDS,
    ("tune", "--max-too-long"): DEFAULT_MAX_TOO_LONG,
    ("tune", "--warmup"): DEFAULT_WARMUP_S,
    ("tune", "--duration"): TRACE_WINDOW_S,  # a trace's window; a scenario's: its own
    ("demo", "--replicas"): _DEMO.replicas,
    ("demo", "--max-replicas"): _DEMO.max_replicas,
    ("demo", "--duration"): _DEMO.duration_s,
    ("demo", "--ready-timeout"): _DEMO.replica_ready_timeout_s,
}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _commands(parser: argparse.ArgumentParser, prefix: str = ""
              ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for name, sub in _subcommands(parser).items():
        yield f"{prefix}{name}", sub
        yield from _commands(sub, f"{prefix}{name} ")


def _actions() -> Iterator[tuple[str, str, argparse.Action]]:
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.option_strings[-1].startswith("--"):
                yield command, action.option_strings[-1], action


def effective_defaults() -> dict[tuple[str, str], float]:
    """Each numeric default a flag runs with when it is not given, by command and flag."""
    found = dict(UNSET_DEFAULTS)
    for command, flag, action in _actions():
        if isinstance(action.default, int | float) and not isinstance(action.default, bool):
            found.setdefault((command, flag), float(action.default))
    return found


def help_default_problems(
        actions: Callable[[], Iterable[tuple[str, str, argparse.Action]]] = _actions,
        unset: dict[tuple[str, str], float] = UNSET_DEFAULTS) -> list[str]:
    """A help's stated default against what the flag runs with: its parser default, or
    the constant it falls back to; a number stated for an unset flag must name one."""
    problems = []
    for command, flag, action in actions():
        match = HELP_DEFAULT.search(action.help or "")
        if match is None or action.help is None:
            continue
        stated = match.group(1).rstrip(".:")
        number = _number(stated)
        where = f"slopilot {command} {flag}"
        if action.default is None:
            if number is None:
                continue  # a default in words ("the scenario's"), resolved elsewhere
            if (command, flag) not in unset:
                problems.append(f"{where}: its help states default {stated}; name the "
                                "constant it falls back to in UNSET_DEFAULTS")
            elif unset[(command, flag)] != number:
                problems.append(f"{where}: its help says default {stated}, it runs "
                                f"with {unset[(command, flag)]:g}")
        elif isinstance(action.default, str):
            if stated != action.default:
                problems.append(f"{where}: its help says default {stated}, it runs with "
                                f"{action.default}")
        elif number is not None and float(action.default) != number:
            problems.append(f"{where}: its help says default {stated}, it runs with "
                            f"{action.default}")
    return problems


# "`--keep-alive-timeout` seconds (5 by default, ...)", "`--seeds` (default 3)".
DOC_DEFAULT = re.compile(
    r"`(--[a-z][a-z0-9-]*)`[^`(.]{0,40}\((?:(\d+(?:\.\d+)?) by default|default:? "
    r"(\d+(?:\.\d+)?))")


def _paragraphs(docs: Iterable[Path]) -> Iterator[tuple[str, str]]:
    for doc in docs:
        name = doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else doc.name
        for paragraph in re.split(r"\n\s*\n", doc.read_text()):
            yield name, " ".join(paragraph.split())


def doc_default_problems(docs: Iterable[Path] = DOCS) -> list[str]:
    """A default a doc states for a flag is the one some command taking it runs with."""
    defaults = effective_defaults()
    problems = []
    for doc, text in _paragraphs(docs):
        for match in DOC_DEFAULT.finditer(text):
            flag, stated = match.group(1), float(match.group(2) or match.group(3))
            runs = {v for (_, f), v in defaults.items() if f == flag}
            if runs and stated not in runs:
                problems.append(f"{doc}: {flag} {stated:g} by default; it runs with "
                                f"{', '.join(f'{v:g}' for v in sorted(runs))}")
    return problems


# | `token_budget` | meaning | 1024 | 128..16384 |
KNOB_ROW = re.compile(r"^\| `(\w+)` \|[^|]*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|$", re.M)


def knob_table_problems(readme: Path = ROOT / "README.md") -> list[str]:
    """README's knob table: each knob's default and range are EngineConfig's."""
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    problems = []
    rows = KNOB_ROW.findall(readme.read_text())
    for name, default, bounds in rows:
        if name not in fields:
            problems.append(f"README.md: the knob table names {name}, no EngineConfig knob")
            continue
        field = fields[name]
        meta = field.metadata
        actual = field.default
        value = getattr(actual, "value", actual)
        if str(default) != str(value) and _number(default) != _number(str(value)):
            problems.append(f"README.md: {name} defaults to {value}, not {default}")
        lo, hi = meta.get("lo"), meta.get("hi")
        if lo is not None and hi is not None:
            span = re.fullmatch(r"(\d+(?:\.\d+)?)\.\.(\d+(?:\.\d+)?|budget)", bounds)
            if span is None or _number(span.group(1)) != lo or (
                    span.group(2) != "budget" and _number(span.group(2)) != hi):
                problems.append(f"README.md: {name}'s range is {lo:g}..{hi:g}, not {bounds}")
        elif meta.get("choices") and bounds:
            stated = {c.strip() for c in bounds.split(",")}
            if stated != {str(getattr(c, "value", c)) for c in meta["choices"]}:
                problems.append(f"README.md: {name} takes {list(meta['choices'])}, not "
                                f"{bounds}")
    if not rows:
        problems.append("README.md: no knob table found")
    return problems


def test_the_help_texts_state_the_defaults_the_flags_run_with() -> None:
    assert help_default_problems() == []


def test_the_docs_state_the_defaults_the_flags_run_with() -> None:
    assert doc_default_problems() == []


def test_the_readmes_knob_table_is_engineconfigs() -> None:
    assert knob_table_problems() == []


def test_the_default_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep-alive-timeout", default=None, help="kept (default 5)")
    parser.add_argument("--head-timeout", default=None, help="(default 30)")
    parser.add_argument("--trials", type=int, default=20, help="trials (default: 30)")
    parser.add_argument("--mode", default="auto", help="(default: off, as serve)")

    def actions() -> Iterator[tuple[str, str, argparse.Action]]:
        for action in parser._actions[1:]:
            yield "serve", action.option_strings[-1], action

    assert help_default_problems(actions, {("serve", "--keep-alive-timeout"): 75.0}) == [
        "slopilot serve --keep-alive-timeout: its help says default 5, it runs with 75",
        "slopilot serve --head-timeout: its help states default 30; name the constant it "
        "falls back to in UNSET_DEFAULTS",
        "slopilot serve --trials: its help says default 30, it runs with 20",
        "slopilot serve --mode: its help says default off, it runs with auto"]

    doc = tmp_path / "doc.md"
    doc.write_text("An idle connection is kept `--keep-alive-timeout`\nseconds (75 by "
                   "default, uvicorn's).\n\n`--seeds` (default 3) and `--trials` (default "
                   "30).\n")
    assert doc_default_problems([doc]) == [
        "doc.md: --keep-alive-timeout 75 by default; it runs with 5"]

    readme = tmp_path / "README.md"
    readme.write_text("| `token_budget` | max tokens | 2048 | 128..16384 |\n"
                      "| `budget_align` | tiles | 256 | 1, 64, 256 |\n"
                      "| `kv_watermark` | free KV | 0.05 | 0..0.4 |\n"
                      "| `no_such_knob` | ? | 1 | |\n")
    assert knob_table_problems(readme) == [
        "README.md: token_budget defaults to 1024, not 2048",
        "README.md: budget_align takes [1, 64, 128, 256], not 1, 64, 256",
        "README.md: kv_watermark's range is 0..0.5, not 0..0.4",
        "README.md: the knob table names no_such_knob, no EngineConfig knob"]
