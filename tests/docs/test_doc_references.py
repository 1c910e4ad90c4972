"""What the docs name exists: every ``slopilot`` flag and choice, every benchmark flag,
every file of the repository and every ``slopilot.*`` name they cite; and every
LLMDeployment they show is one the API server and the operator accept.

A user copies a command from README.md or docs/*.md; a flag renamed in the parser, a
script moved or a module split leaves that command failing while every other test
passes. These checks read the docs as text and hold each reference against the code.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from slopilot.cli import build_parser
from slopilot.operator.spec import SpecError, parse_spec
from tests.support.crd_schema import (
    apply_defaults,
    cel_errors,
    list_map_errors,
    prune,
    schema_errors,
    served_schema,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "scenarios" / "README.md",
        ROOT / "slopilot" / "data" / "traces" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]

# `slopilot SUB` and what follows it on the (joined) line, up to the end of a code span,
# a comment or a shell operator.
COMMAND = re.compile(r"\bslopilot ([a-z]+)((?:[ \t]+[^\s`#;&()]+)*)")
FLAG = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")
SCRIPT = re.compile(r"(?<![\w./-])(benchmarks/[\w/]+\.py)((?:[ \t]+[^\s`#;&()]+)*)")
PATH = re.compile(r"(?<![\w./-])((?:slopilot|tests|manifests|docs|benchmarks|dashboards|"
                  r"scenarios)/[\w./*-]*[\w*])")
DOTTED = re.compile(r"(?<![\w/.-])(slopilot(?:\.\w+)+)")


def doc_lines(docs: list[Path]) -> Iterator[tuple[str, int, str]]:
    """(doc, line number, text) with shell continuations (``\\`` at the end) joined."""
    for doc in docs:
        name = doc.relative_to(ROOT).as_posix() if doc.is_relative_to(ROOT) else doc.name
        lines = doc.read_text().splitlines()
        for i, line in enumerate(lines):
            j = i
            while line.rstrip().endswith("\\") and j + 1 < len(lines) \
                    and not line.rstrip().endswith("\\\\"):
                j += 1
                line = line.rstrip()[:-1] + " " + lines[j].strip()
            yield name, i + 1, line


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option of ``parser`` and of its own subcommands (``models fetch``)."""
    found = {s: a for a in parser._actions for s in a.option_strings}
    for sub in _subcommands(parser).values():
        found.update(_options(sub))
    return found


def _choice_words(token: str) -> list[str] | None:
    """The literal values a doc gives an option (``torch\\|simulated``, ``[auto]``), or
    None for a placeholder (``FILE``, ``<name>``, ``N``, ``...``)."""
    token = token.strip("[]")
    words = [w for w in re.split(r"\\?\|", token) if w]
    if not words or any(not re.fullmatch(r"[a-z][a-z0-9-]*", w) for w in words):
        return None
    return words


def cli_problems(docs: list[Path] = DOCS) -> list[str]:
    commands = _subcommands(build_parser())
    problems = []
    for doc, number, line in doc_lines(docs):
        for match in COMMAND.finditer(line):
            sub, rest = match.group(1), match.group(2)
            if sub not in commands:
                continue
            options = _options(commands[sub])
            tokens = rest.split()
            for k, token in enumerate(tokens):
                flag = FLAG.fullmatch(token.strip("[]").split("=")[0].split("\\|")[0])
                if not flag:
                    continue
                name = flag.group(1)
                if name not in options:
                    problems.append(f"{doc}:{number}: `slopilot {sub}` has no {name}")
                    continue
                choices = options[name].choices
                if choices is None or k + 1 >= len(tokens) or "=" in token:
                    continue
                words = _choice_words(tokens[k + 1])
                for word in words or ():
                    if word not in {str(c) for c in choices}:
                        problems.append(f"{doc}:{number}: `slopilot {sub} {name}` takes "
                                        f"{sorted(map(str, choices))}, not {word!r}")
    return problems


def script_problems(docs: list[Path] = DOCS) -> list[str]:
    problems = []
    for doc, number, line in doc_lines(docs):
        for match in SCRIPT.finditer(line):
            script = ROOT / match.group(1)
            if not script.is_file():
                problems.append(f"{doc}:{number}: {match.group(1)} does not exist")
                continue
            source = _with_sibling_imports(script)
            for flag in FLAG.findall(match.group(2)):
                if not flag.startswith("--"):
                    continue
                if f'"{flag}"' not in source and f"'{flag}'" not in source:
                    problems.append(f"{doc}:{number}: {match.group(1)} takes no {flag}")
    return problems


def _with_sibling_imports(script: Path) -> str:
    """The script's source and that of the scripts beside it it imports (a benchmark
    that takes another's flags: ``from scrape_stall import arguments``)."""
    source = script.read_text()
    for name in re.findall(r"^from (\w+) import", source, re.M):
        sibling = script.parent / f"{name}.py"
        if sibling.is_file():
            source += sibling.read_text()
    return source


def _written_by_a_benchmark(path: str) -> bool:
    """A figure a benchmark writes (``docs/twin_fidelity_quick.png`` with ``--quick``)
    need not be checked in."""
    name = Path(path).name
    return any(name in s.read_text() for s in (ROOT / "benchmarks").rglob("*.py"))


def _names_a_definition(path: str) -> bool:
    """``tests/support/waits.wait_for``: a module's path and a name it defines."""
    module, _, name = path.rpartition(".")
    source = ROOT / f"{module}.py"
    return source.is_file() and re.search(rf"^\s*(?:def|class) {name}\b|^{name}\s*[:=]",
                                          source.read_text(), re.M) is not None


def path_problems(docs: list[Path] = DOCS) -> list[str]:
    problems = []
    for doc, number, line in doc_lines(docs):
        for match in PATH.finditer(line):
            path = match.group(1).rstrip(".")
            if "*" in path:
                if not list(ROOT.glob(path)):
                    problems.append(f"{doc}:{number}: nothing matches {path}")
            elif not (ROOT / path).exists() and not _names_a_definition(path) \
                    and not _written_by_a_benchmark(path):
                problems.append(f"{doc}:{number}: {path} does not exist")
    return problems


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attribute in parts[k:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def dotted_problems(docs: list[Path] = DOCS) -> list[str]:
    problems = []
    for doc, number, line in doc_lines(docs):
        for match in DOTTED.finditer(line):
            dotted = match.group(1).rstrip(".")
            if dotted.endswith((".py", ".md", ".yaml", ".json", ".dev")):
                continue  # a file name or the CRD's group, not an import
            if not _resolves(dotted):
                problems.append(f"{doc}:{number}: {dotted} does not import")
    return problems


@pytest.mark.parametrize("check", [cli_problems, script_problems, path_problems,
                                   dotted_problems], ids=lambda f: f.__name__)
def test_what_the_docs_name_exists(check: Callable[[], list[str]]) -> None:
    assert check() == []


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`slopilot simulate --scenario tiny-cpu --no-such-flag`\n"
        "    slopilot serve --executor torch\\|gpu \\\n"
        "        --port 8000\n"
        "`benchmarks/sim_speed.py --no-such-flag`, `benchmarks/gone.py`\n"
        "see `slopilot/engine/gone.py` and `slopilot.engine.config.NoSuchThing`\n")
    assert cli_problems([doc]) == [
        "doc.md:1: `slopilot simulate` has no --no-such-flag",
        "doc.md:2: `slopilot serve --executor` takes ['simulated', 'torch'], not 'gpu'"]
    assert script_problems([doc]) == ["doc.md:4: benchmarks/sim_speed.py takes no --no-such-flag",
                                      "doc.md:4: benchmarks/gone.py does not exist"]
    assert path_problems([doc]) == ["doc.md:4: benchmarks/gone.py does not exist",
                                    "doc.md:5: slopilot/engine/gone.py does not exist"]
    assert dotted_problems([doc]) == [
        "doc.md:5: slopilot.engine.config.NoSuchThing does not import"]


# A fenced ```yaml block, at any indent (list items indent theirs).
YAML_BLOCK = re.compile(r"^( *)```yaml\n(.*?)^\1```", re.M | re.S)


def spec_examples(docs: list[Path] = DOCS) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each LLMDeployment a doc shows, whole (``kind: LLMDeployment``), as ``spec:`` or
    as spec fields (``model:``, ``alerts:``), made a whole object; placeholders for key
    digests (``<64 hex digits>``) become distinct digests."""
    crd = yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text())
    fields = set(served_schema(crd)["properties"]["spec"]["properties"])
    for doc in docs:
        text = doc.read_text()
        for match in YAML_BLOCK.finditer(text):
            where = f"{doc.name}:{text[:match.start()].count(chr(10)) + 1}"
            indent = len(match.group(1))
            block = "\n".join(line[indent:] for line in match.group(2).splitlines())
            parts = block.split("<64 hex digits>")
            block = "".join(part + hashlib.sha256(str(i).encode()).hexdigest()
                            for i, part in enumerate(parts[:-1])) + parts[-1]
            example = yaml.safe_load(block)
            if not isinstance(example, dict):
                continue
            if example.get("kind") == "LLMDeployment":
                body = example
            elif set(example) == {"spec"} or set(example) <= fields:
                spec = example.get("spec", example) if set(example) == {"spec"} else example
                body = {"apiVersion": "slopilot.dev/v1alpha1", "kind": "LLMDeployment",
                        "metadata": {"name": "example", "namespace": "team-a"},
                        "spec": {"model": {"name": "smollm2-135m"}, **spec}}
            else:
                continue  # a scenario, a profile, a Prometheus job: not an LLMDeployment
            yield where, body


def spec_problems(docs: list[Path] = DOCS) -> list[str]:
    """What the API server (the CRD's schema and CEL rules, pruning) or the operator's
    parse refuses of the docs' examples."""
    schema = served_schema(yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text()))
    problems = []
    for where, body in spec_examples(docs):
        pruned = prune(schema, body)
        if pruned != body:
            problems.append(f"{where}: the API server would drop fields of {body['spec']}")
        full = apply_defaults(schema, pruned)
        errors = schema_errors(schema, full) + cel_errors(schema, full) \
            + list_map_errors(schema, full)
        problems += [f"{where}: {error}" for error in errors]
        if not errors:
            try:
                parse_spec(full)
            except SpecError as exc:
                problems.append(f"{where}: the operator refuses it: {exc}")
    return problems


def test_the_docs_llmdeployment_examples_are_accepted() -> None:
    assert sum(1 for _ in spec_examples()) >= 4  # operations.md's examples are read
    assert spec_problems() == []


def test_a_refused_example_is_named(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```yaml\nspec:\n  alerts: {holdFor: 2m, tbtPeriod: 3}\n```\n\n"
                   "  ```yaml\n  alerts:\n    ttftWarningFactor: 3\n  ```\n")
    problems = spec_problems([doc])
    assert len(problems) == 2
    assert problems[0].startswith("doc.md:1: the API server would drop fields")
    assert problems[1].startswith("doc.md:6: ") and "ttftWarningFactor" in problems[1]
