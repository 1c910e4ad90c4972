"""What the docs call things is what the code calls them: every metric, recorded series
and label the docs name, every ``--flag``, every ``SLOPILOT_*`` variable, every CR field
and every status condition.

test_doc_references.py holds a command's flags against its parser where the doc writes
``slopilot SUB ... --flag``; a flag named in prose (``--keep-alive-timeout`` seconds, 5
by default), a metric a user greps ``/metrics`` for or a field a user writes in a CR is
read from the docs as well, and a rename left none of them failing. These checks read
each such name out of the docs and look for it where it must be defined.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from slopilot.cli import build_parser
from slopilot.operator.conditions import ConditionType
from slopilot.tuner.prometheus.alert_table import AlertName
from tests.docs.test_doc_references import DOCS, ROOT, _options, doc_lines

# A Prometheus name of slopilot's or vLLM's: a series (``slopilot_slo_requests_total``,
# ``vllm:num_requests_running``), a recorded series (``slopilot:tbt_seconds:p99``), a
# label (``slopilot_namespace``), or a family written as a prefix (``slopilot_slo_*``).
METRIC = re.compile(r"(?<![\w:/.$-])((?:slopilot|vllm)[_:][a-z0-9_:]*[a-z0-9_])(\*)?(?![\w(])")
# What prometheus_client appends to a family's name in the exposition.
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_info")
# Names the docs give for what slopilot does not export, each with why it is named.
FOREIGN_METRICS = {
    # vLLM before 0.11 named its token gaps so; the docs say why such an image has no goodput.
    "vllm:time_per_output_token_seconds",
}

FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")
# Flags of other programs the docs quote, by program: vLLM's (the operator renders them
# into a vLLM pod's arguments; a rendered one is found in slopilot/), kubectl's and pip's.
FOREIGN_FLAGS = {
    "vllm": {"--api-key", "--swap-space"},
    "kubectl": {"--from-literal", "--from-file", "--type", "--clusterrole", "--user",
                "--subresource", "--serviceaccount"},
    "pip": {"--no-deps"},
    "pytest": {"--hypothesis-profile"},
}

ENV = re.compile(r"(?<![\w$])\$?\{?(SLOPILOT_[A-Z0-9_]*[A-Z0-9])")

# A CR field as the docs write it: ``spec.engine.blockSize``, ``status.tunedConfig``, or a
# lone camelCase name in a code span (``swapSpaceGb``, ``maxClass``).
CR_PATH = re.compile(r"`((?:spec|status)(?:\.[A-Za-z_]\w*)+)`")
CAMEL = re.compile(r"`([a-z][a-z0-9]*[A-Z][A-Za-z0-9]*)[`:.\[=]")
# Kubernetes', the Prometheus Operator's and Alertmanager's own fields the docs tell an
# administrator to set or read: no CRD of slopilot's, and nothing in its code, has them.
FOREIGN_FIELDS = {"excludedFromEnforcement", "enforcedSampleLimit", "enforcedLabelLimit",
                  "enforcedBodySizeLimit", "ignoreNamespaceSelectors", "resourceNames",
                  "hostNetwork", "serviceAccountName", "enforcedTargetLimit",
                  "enforcedLabelNameLengthLimit", "enforcedLabelValueLengthLimit",
                  "inhibitedBy"}
# Fields the docs name as gone, to say where they went.
FORMER_FIELDS = {"status.twinProfile"}

CONDITION_DOCS = [ROOT / "docs" / "operations.md", ROOT / "docs" / "twin.md"]

ALERT = re.compile(r"\b(Slopilot[A-Z][A-Za-z0-9]*)")
ALERT_TABLE_DOC = ROOT / "docs" / "operations.md"


@cache
def _sources(*roots: str, suffixes: tuple[str, ...] = (".py",)) -> str:
    """The text of every file under ``roots`` (of the repository) with those suffixes."""
    return "\n".join(p.read_text() for root in roots for p in sorted((ROOT / root).rglob("*"))
                     if p.is_file() and p.suffix in suffixes)


@cache
def _string_constants() -> frozenset[str]:
    """Every string literal of slopilot's code, f-strings' literal parts included."""
    found: set[str] = set()
    for path in (ROOT / "slopilot").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return frozenset(found)


def _exported(name: str, prefix: bool) -> bool:
    """Whether slopilot's code, its dashboards or rules, or a benchmark writes ``name``."""
    text = _sources("slopilot", "benchmarks", "manifests", "dashboards",
                    suffixes=(".py", ".json", ".yaml"))
    if prefix:
        return re.search(rf"(?<![\w:]){re.escape(name)}", text) is not None
    bases = [name] + [name[:-len(s)] for s in SUFFIXES if name.endswith(s)]
    return any(re.search(rf"(?<![\w:]){re.escape(b)}(?![\w:])", text) for b in bases)


def metric_problems(docs: Iterable[Path] = DOCS) -> list[str]:
    problems = []
    for doc, number, line in doc_lines(list(docs)):
        if "RESULT " in line:
            continue  # a benchmark's output line: its keys are figures, not series
        for match in METRIC.finditer(line):
            name, star = match.group(1), match.group(2)
            if name in FOREIGN_METRICS:
                continue
            if not _exported(name, prefix=bool(star) or name.endswith(("_", ":"))):
                problems.append(f"{doc}:{number}: no code exports {name}{star or ''}")
    return problems


def _parser_flags() -> set[str]:
    return {o for o in _options(build_parser()) if o.startswith("--")}


def flag_problems(docs: Iterable[Path] = DOCS) -> list[str]:
    """Every ``--flag`` a doc names is one of slopilot's commands', a benchmark's, or
    another program's it names on the line (``FOREIGN_FLAGS``)."""
    ours = _parser_flags()
    benchmarks = _sources("benchmarks")
    rendered = _sources("slopilot")
    foreign = set().union(*FOREIGN_FLAGS.values())
    problems = []
    for doc, number, line in doc_lines(list(docs)):
        for flag in FLAG.findall(line):
            if flag in ours or flag in foreign:
                continue
            if f'"{flag}"' in benchmarks or f"'{flag}'" in benchmarks:
                continue
            if f'"{flag}' in rendered:  # an argument the operator renders for vLLM
                continue
            problems.append(f"{doc}:{number}: no command takes {flag}")
    return problems


def env_problems(docs: Iterable[Path] = DOCS) -> list[str]:
    """Every ``SLOPILOT_*`` variable a doc names is read by the code, the test support,
    a benchmark, the Makefile or the Dockerfile."""
    text = "\n".join([_sources("slopilot", "benchmarks", "tests/support"),
                      (ROOT / "Makefile").read_text(), (ROOT / "Dockerfile").read_text()])
    problems = []
    for doc, number, line in doc_lines(list(docs)):
        for name in ENV.findall(line):
            if re.search(rf"\b{name}\b", text) is None:
                problems.append(f"{doc}:{number}: nothing reads {name}")
    return problems


def _schema_fields(node: Any, found: set[str]) -> set[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                found.update(value)
            _schema_fields(value, found)
    elif isinstance(node, list):
        for item in node:
            _schema_fields(item, found)
    return found


def _resolves_in(schema: dict[str, Any], parts: list[str]) -> bool:
    node: Any = schema
    for part in parts:
        while node.get("type") == "array" and isinstance(node.get("items"), dict):
            node = node["items"]
        if part not in node.get("properties", {}):
            # A map or free-form object: its keys are the object's own.
            return bool(node.get("x-kubernetes-preserve-unknown-fields")) or \
                isinstance(node.get("additionalProperties"), dict)
        node = node["properties"][part]
    return True


def cr_field_problems(docs: Iterable[Path] = DOCS) -> list[str]:
    """Every CR path a doc names in a code span resolves in the CRD's schema, and every
    camelCase name in one is a field of the CRD, a name the code uses, or Kubernetes'."""
    crd = yaml.safe_load((ROOT / "manifests" / "crd.yaml").read_text())
    schema = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    root = schema["schema"]["openAPIV3Schema"]
    fields = _schema_fields(crd, set())
    code = _sources("slopilot")
    problems = []
    for doc, number, line in doc_lines(list(docs)):
        for path in CR_PATH.findall(line):
            if path not in FORMER_FIELDS and not _resolves_in(root, path.split(".")) and \
                    not re.search(rf"\b{re.escape(path.split('.')[-1])}\b", code):
                problems.append(f"{doc}:{number}: the CRD has no {path}")
        for name in CAMEL.findall(line):
            if name not in fields and name not in FOREIGN_FIELDS \
                    and re.search(rf"\b{name}\b", code) is None:
                problems.append(f"{doc}:{number}: no CRD field or code is named {name}")
    return problems


def condition_problems(docs: Iterable[Path] = CONDITION_DOCS) -> list[str]:
    """Every status condition the operator has a type for is named in the docs, so a
    user who finds it in ``kubectl describe`` can look it up."""
    text = "\n".join(d.read_text() for d in docs)
    return [f"the docs name no condition {c.value}" for c in ConditionType
            if re.search(rf"`{c.value}\b", text) is None]


def alert_problems(docs: Iterable[Path] = DOCS, table: Path = ALERT_TABLE_DOC) -> list[str]:
    """Every alert a doc names is one the alert table defines, and every alert the table
    defines has its row in operations.md's table (a ``| `Name` ...`` line)."""
    known = {a.value for a in AlertName}
    problems = [f"{doc}:{number}: no alert is named {name}"
                for doc, number, line in doc_lines(list(docs))
                for name in ALERT.findall(line) if name not in known]
    rows = set(re.findall(r"^\| `(Slopilot\w+)`", table.read_text(), re.M))
    problems += [f"{table.name}: the alerts' table has no row for {a}"
                 for a in sorted(known - rows)]
    return problems


def test_every_alert_the_docs_name_is_defined_and_every_alert_documented() -> None:
    assert alert_problems() == []


def test_every_metric_the_docs_name_is_exported() -> None:
    assert metric_problems() == []


def test_every_flag_the_docs_name_is_taken() -> None:
    assert flag_problems() == []


def test_every_variable_the_docs_name_is_read() -> None:
    assert env_problems() == []


def test_every_cr_field_the_docs_name_is_the_crds() -> None:
    assert cr_field_problems() == []


def test_every_condition_type_is_documented() -> None:
    assert condition_problems() == []


def test_the_name_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`slopilot_slo_requests_total` and `vllm:num_requests_running`, `slopilot_slo_*`\n"
        "`slopilot_no_such_series_total`, `vllm:no_such_gauge`, `slopilot_nothing_*`\n"
        "kept `--keep-alive-timeout` seconds; `--no-such-timeout` too\n"
        "`SLOPILOT_ALLOWED_STORAGE` and `$SLOPILOT_NO_SUCH_VARIABLE`\n"
        "restart knobs (`blockSize`, `swapSpaceGB`), `spec.engine.noSuchKnob`\n"
        "`spec.engine.swapSpaceGb`, `status.controller.pending_restore`\n")
    assert metric_problems([doc]) == [
        "doc.md:2: no code exports slopilot_no_such_series_total",
        "doc.md:2: no code exports vllm:no_such_gauge",
        "doc.md:2: no code exports slopilot_nothing_*"]
    assert flag_problems([doc]) == ["doc.md:3: no command takes --no-such-timeout"]
    assert env_problems([doc]) == ["doc.md:4: nothing reads SLOPILOT_NO_SUCH_VARIABLE"]
    assert cr_field_problems([doc]) == [
        "doc.md:5: the CRD has no spec.engine.noSuchKnob",
        "doc.md:5: no CRD field or code is named swapSpaceGB"]
    (tmp_path / "alerts.md").write_text("| `SlopilotTBTP99High` (critical) | ... |\n"
                                        "`SlopilotTBTP99Highh` fired\n")
    problems = alert_problems([tmp_path / "alerts.md"], tmp_path / "alerts.md")
    assert problems[0] == "alerts.md:2: no alert is named SlopilotTBTP99Highh"
    assert "alerts.md: the alerts' table has no row for SlopilotPreemptionStorm" in problems
    assert not any(p.endswith("no row for SlopilotTBTP99High") for p in problems)
    (tmp_path / "conditions.md").write_text("`Valid`, `Reconciled`\n")
    assert "the docs name no condition Tuning" in condition_problems([tmp_path / "conditions.md"])
    assert "the docs name no condition Valid" not in condition_problems(
        [tmp_path / "conditions.md"])
