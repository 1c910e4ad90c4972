"""docs/architecture.md is the module map: every module of slopilot/ is in it, and every
module it names is one.

A new module that no map row names is found only by reading the tree; a row left behind
by a rename or a split sends the reader to a file that is not there. The map names a
module as ``name.py``, ``dir/name`` or ``name.Attribute``; either way it must be a file.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.test_doc_references import ROOT

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "slopilot"
SKIP = {"__init__.py", "__main__.py"}

# A module file a doc names in a code span, with or without its directories:
# `config.py`, `sim/worker.py`, `executors/csrc/cpu_kernels.cpp`.
NAMED_FILE = re.compile(r"(?<![\w/.-])((?:[\w]+/)*[\w]+\.(?:py|cpp))\b")


def modules(package: Path = PACKAGE) -> list[Path]:
    return sorted(p for p in package.rglob("*") if p.suffix in (".py", ".cpp")
                  and p.name not in SKIP and "__pycache__" not in p.parts)


def _named(module: Path, text: str) -> bool:
    stem, parent = re.escape(module.stem), re.escape(module.parent.name)
    suffix = re.escape(module.suffix)
    return any(re.search(pattern, text) for pattern in (
        rf"(?<![\w/]){stem}{suffix}\b",            # `worker.py`
        rf"(?<![\w]){parent}/{stem}\b",             # `sim/worker`, `local/scrape.DirectScrape`
        rf"(?<![\w./]){stem}\.[A-Za-z_]\w*",        # `profile_file.load_profile`
    ))


def unmapped_modules(doc: Path = ARCHITECTURE, package: Path = PACKAGE) -> list[str]:
    text = doc.read_text()
    return [m.relative_to(package.parent).as_posix() for m in modules(package)
            if not _named(m, text)]


def missing_modules(doc: Path = ARCHITECTURE, package: Path = PACKAGE) -> list[str]:
    """The module files the doc names that no file of ``package`` is (by its tail)."""
    tails = {m.relative_to(package).as_posix() for m in modules(package)}
    problems = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        for name in NAMED_FILE.findall(line):
            if name.split("/")[0] in ("benchmarks", "tests", "manifests", "docs"):
                continue  # the repository's other trees: test_doc_references checks those
            name = name.removeprefix("slopilot/")
            if not any(t == name or t.endswith("/" + name) for t in tails):
                problems.append(f"{doc.name}:{number}: no module {name}")
    return problems


def test_every_module_is_on_the_map() -> None:
    assert unmapped_modules() == []


def test_every_module_on_the_map_exists() -> None:
    assert missing_modules() == []


def test_the_map_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    package = tmp_path / "slopilot"
    for path in ("engine/config.py", "engine/sim/worker.py", "engine/sim/profile_file.py",
                 "tuner/local/scrape.py", "tuner/loop/backoff.py", "engine/__init__.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text("")
    doc = tmp_path / "architecture.md"
    doc.write_text("`config.py`, `sim/worker.py`, `profile_file.load_profile`,\n"
                   "`local/scrape.DirectScrape`; `engine/gone.py` and `sim/missing.py`\n")
    assert unmapped_modules(doc, package) == ["slopilot/tuner/loop/backoff.py"]
    assert missing_modules(doc, package) == ["architecture.md:2: no module engine/gone.py",
                                             "architecture.md:2: no module sim/missing.py"]
