"""``$SLOPILOT_DEFAULT_STORAGE``: the study storage of a CR that names none, per namespace.

The CRD wrote ``sqlite:////var/lib/slopilot/study.db`` into every CR that left
``spec.tuning.storage`` out: every tenant shared one SQLite file (one writer at a time),
and under an allow-list of ``teams/{namespace}.db`` each such CR was refused until its
tenant wrote its own namespace's URL by hand. Now the CRD writes nothing, and a CR
without the field gets the administrator's default for its namespace (``{namespace}`` in
it, as in an allow-list entry) everywhere its storage is resolved: its validation, its
study, the cleanup at its deletion, the record and the reclaim at start. A CR holding the
old default's text keeps it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.crd import API_VERSION, PLURAL, crd_manifest
from slopilot.operator.knobs import DEFAULT_STUDY_STORAGE
from slopilot.operator.policy import OperatorPolicy, PolicyError, policy_problems
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.settings import operator_policy, started_policy
from slopilot.operator.spec import parse_spec
from slopilot.operator.study_cleanup import delete_studies
from slopilot.operator.study_ledger import read_ledger
from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving
from slopilot.operator.study_storage import StorageRefused
from tests.operator.operator_support import (
    Cluster,
    daemon_loop,
    llmd,
    operator_mint,
    with_namespaces,
)
from tests.operator.standins import build_study_controller
from tests.operator.test_study_reclaim import gone_while_down, names, study_of, tuned
from tests.support.kube_server import RunningEmulator

A, B = "team-a", "team-b"
ALLOWED, DEFAULT = "SLOPILOT_ALLOWED_STORAGE", "SLOPILOT_DEFAULT_STORAGE"


@pytest.fixture
def per_namespace(teams: Path) -> OperatorPolicy:
    """operations.md's multi-tenant policy: one file per namespace, and that file the
    default of a CR that names none."""
    entry = f"sqlite:///{teams}/{{namespace}}.db"
    return operator_policy({ALLOWED: entry, DEFAULT: entry})


@pytest.fixture
def ready(kube: RunningEmulator, cluster: Cluster) -> Cluster:
    return with_namespaces(kube, cluster, A, B)


def own(teams: Path, namespace: str) -> str:
    return f"sqlite:///{teams}/{namespace}.db"


def spec_of(**tuning: Any) -> Any:
    return parse_spec({"spec": {"model": {"name": "m"}, "tuning": tuning}})


def test_the_crd_writes_no_storage_into_a_cr_that_names_none(ready: Cluster) -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["tuning"]["properties"]["storage"]
    assert "default" not in field
    assert "SLOPILOT_DEFAULT_STORAGE" in field["description"]
    body = llmd(prometheus={"url": "http://127.0.0.1:9"})
    body["metadata"]["namespace"] = A
    made = ready.kube.create(API_VERSION, PLURAL, A, body)
    assert "storage" not in made["spec"]["tuning"]  # the API server defaulted the rest
    assert made["spec"]["tuning"]["maxTrials"] == 30


def test_the_parse_keeps_a_storage_not_written_apart_from_one_written() -> None:
    assert spec_of().tuning.storage is None
    assert spec_of(storage=DEFAULT_STUDY_STORAGE).tuning.storage == DEFAULT_STUDY_STORAGE


def test_a_cr_naming_no_storage_gets_its_namespaces_default(
        ready: Cluster, teams: Path, per_namespace: OperatorPolicy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's case: the administrator names the default once; a CR that leaves the
    field out is accepted, its study lands in its namespace's file, and the status and
    the operator's record name that file (the reclaim reads the record)."""
    body = tuned(ready, per_namespace, None, monkeypatch, namespace=A)
    assert names(own(teams, A)) == [study_of(body)]
    assert sorted(p.name for p in teams.iterdir()) == ["team-a.db"]
    status = (ready.kube.get(API_VERSION, PLURAL, A, "chat") or {})["status"]
    assert status["studyStorages"] == [own(teams, A)]
    assert [(e.namespace, e.storage) for e in
            read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries] == [(A, own(teams, A))]


def test_two_crs_of_one_name_in_two_namespaces_land_in_two_files(
        ready: Cluster, teams: Path, per_namespace: OperatorPolicy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    in_a = tuned(ready, per_namespace, None, monkeypatch, namespace=A)
    in_b = tuned(ready, per_namespace, None, monkeypatch, namespace=B)
    assert names(own(teams, A)) == [study_of(in_a)]
    assert names(own(teams, B)) == [study_of(in_b)]


def test_the_daemons_end_deletes_the_study_from_the_namespace_default(
        ready: Cluster, teams: Path, per_namespace: OperatorPolicy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    body = tuned(ready, per_namespace, None, monkeypatch, namespace=A)
    loop = daemon_loop(ready, ready.kube.get(API_VERSION, PLURAL, A, "chat") or body,
                       monkeypatch, factory=build_study_controller, policy=per_namespace,
                       namespace=A)
    assert loop.step() is True and loop.controller is not None
    loop.end_deleted()
    assert names(own(teams, A)) == []


def test_the_deletion_handlers_cleanup_reaches_the_namespace_default(
        ready: Cluster, teams: Path, per_namespace: OperatorPolicy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tuning off, no daemon runs: the deletion handler's route reads the status."""
    tuned(ready, per_namespace, None, monkeypatch, namespace=A)
    delete_studies(ready.kube.get(API_VERSION, PLURAL, A, "chat") or {}, per_namespace,
                   log=logging.getLogger("test"))
    assert names(own(teams, A)) == []


def test_the_reclaim_at_start_removes_a_leaked_study_from_a_namespace_default(
        ready: Cluster, teams: Path, per_namespace: OperatorPolicy,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``{namespace}`` default names no database by itself: its files are reached
    through the record, each for its namespace, as a ``{namespace}`` entry's are. A
    live CR's study, and its entry on the record, stay."""
    gone = tuned(ready, per_namespace, None, monkeypatch, namespace=A)
    live = tuned(ready, per_namespace, None, monkeypatch, namespace=B)
    gone_while_down(ready, gone)
    done = reclaim_orphaned_studies(ready.kube, per_namespace, serving(None))
    assert done.deleted == [study_of(gone)] and not done.skipped
    assert names(own(teams, A)) == [] and names(own(teams, B)) == [study_of(live)]
    assert [(e.namespace, e.storage) for e in
            read_ledger(ready.kube, DEFAULT_OPERATOR_NAMESPACE).entries] == [(B, own(teams, B))]


def test_an_unset_allow_list_allows_the_default_storage_whatever_it_is(teams: Path) -> None:
    policy = operator_policy({DEFAULT: f"sqlite:///{teams}/{{namespace}}.db"})
    assert policy.study_storage(spec_of(), namespace=A) == own(teams, A)
    assert policy_problems(spec_of(storage=own(teams, A)), policy, namespace=A) == []
    (problem,) = policy_problems(spec_of(storage=own(teams, B)), policy, namespace=A)
    assert "another namespace" in problem
    # Unset both: today's single-tenant install.
    assert operator_policy({}).study_storage(spec_of(), namespace=A) == DEFAULT_STUDY_STORAGE


def test_a_database_per_namespace_default_is_opened_with_the_admins_credentials() -> None:
    policy = operator_policy({
        ALLOWED: "postgresql://optuna:Adm1n-s3cret@db.shared.svc/studies_{namespace}",
        DEFAULT: "postgresql://optuna@db.shared.svc/studies_{namespace}"})
    assert policy.study_storage(spec_of(), namespace=A) == (
        "postgresql://optuna:Adm1n-s3cret@db.shared.svc/studies_team-a")


@pytest.mark.parametrize(("allowed", "value", "needles"), [
    (None, "not a url", ["not a database URL", "sqlite:////", "{namespace}"]),
    (None, "sqlite:///var/lib/slopilot/teams/{namespace}.db", ["relative", "four slashes"]),
    ("postgresql://optuna:PW@db/studies_{namespace}",
     "postgresql://optuna:hunter2@db/studies_{namespace}",
     ["password", "postgresql://optuna@db/studies_{namespace}", ALLOWED]),
    ("sqlite:////data/teams/{namespace}.db", "sqlite:////elsewhere/{namespace}.db",
     ["refuses", ALLOWED]),
    ("sqlite:////data/teams/{namespace}.db", "sqlite:////data/teams/team-a.db",
     ["refuses", "namespace default", "sqlite:////data/teams/default.db"]),
    (None, "postgresql://optuna@{namespace}.db/studies", ["host", "e.g."]),
    (None, "sqlite:////data/teams/{ns}.db", ["unknown placeholder {ns}"]),
    ("sqlite:////data/teams/*", "sqlite:////data/teams/*", ["one database", "e.g."]),
    # 2,020 characters, 2,072 for a namespace of 63: past what the record of study
    # storages keeps (MAX_STORAGE_URL), so such a namespace's studies were never reclaimed.
    (None, "sqlite:////data/" + "a" * 1990 + "{namespace}.db",
     ["2072 characters", "63", "2048", "shorter"]),
    (None, "sqlite:////data/teams/study.db-journal", ["journal file", "name a database file"]),
])
def test_a_default_that_is_no_storage_or_is_refused_stops_the_start(
        allowed: str | None, value: str, needles: list[str]) -> None:
    env = {DEFAULT: value} if allowed is None else {ALLOWED: allowed, DEFAULT: value}
    with pytest.raises(PolicyError) as err:
        started_policy(env)
    message = str(err.value)
    assert message.startswith(f"{DEFAULT}="), message
    assert "hunter2" not in message
    assert value.replace("hunter2", "***") in message, message
    for needle in needles:
        assert needle in message, message


def test_the_operator_command_stops_before_kopf_on_such_a_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slopilot.cli import main
    from slopilot.operator import commands

    def never(*_: Any) -> int:
        raise AssertionError("kopf started with a default the allow-list refuses")

    monkeypatch.setenv(ALLOWED, "sqlite:////data/teams/{namespace}.db")
    monkeypatch.setenv(DEFAULT, "sqlite:////var/lib/slopilot/study.db")
    monkeypatch.setattr(commands, "_run_until_signalled", never)
    monkeypatch.setattr(commands, "_reclaim", never)
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--standalone", "--all-namespaces"])
    assert f"{DEFAULT}='sqlite:////var/lib/slopilot/study.db'" in str(exited.value.code)


def test_a_list_without_the_shipped_default_still_starts_and_says_how_to_set_one(
        caplog: pytest.LogCaptureFixture) -> None:
    """operations.md's multi-tenant list before this variable: an install that set only
    the allow-list keeps starting; a CR naming no storage is refused, as it was, with
    the two fixes."""
    with caplog.at_level(logging.WARNING, logger="slopilot.operator.settings"):
        policy = started_policy({ALLOWED: "sqlite:////data/teams/{namespace}.db"})
    assert any(DEFAULT in r.getMessage() for r in caplog.records), caplog.text
    (problem,) = policy_problems(spec_of(), policy, namespace=A)
    assert problem.startswith("spec.tuning.storage is not written"), problem
    assert "sqlite:////data/teams/team-a.db" in problem and DEFAULT in problem
    assert DEFAULT_STUDY_STORAGE in problem


def test_a_cr_holding_the_old_crds_default_keeps_the_shared_file(teams: Path) -> None:
    """Materialised by the old CRD: the shared file, as before, where it is allowed;
    refused as before where it is not, the message now naming the field's removal."""
    old = spec_of(storage=DEFAULT_STUDY_STORAGE)
    assert OperatorPolicy().study_storage(old, namespace=A) == DEFAULT_STUDY_STORAGE
    both = operator_policy({ALLOWED: f"{DEFAULT_STUDY_STORAGE},sqlite:///{teams}/{{namespace}}.db",
                            DEFAULT: f"sqlite:///{teams}/{{namespace}}.db"})
    assert both.study_storage(old, namespace=A) == DEFAULT_STUDY_STORAGE
    assert both.study_storage(spec_of(), namespace=A) == own(teams, A)
    entry = f"sqlite:///{teams}/{{namespace}}.db"
    (problem,) = policy_problems(old, operator_policy({ALLOWED: entry, DEFAULT: entry}),
                                 namespace=A)
    assert problem.startswith(f"spec.tuning.storage={DEFAULT_STUDY_STORAGE!r} is not on "
                              "the operator's storage allow-list"), problem
    assert "remove spec.tuning.storage" in problem and own(teams, A) in problem


def test_the_old_relative_default_still_reads_as_the_shared_file(teams: Path) -> None:
    spec = spec_of(storage="sqlite:///var/lib/slopilot/study.db")
    assert spec.tuning.storage == DEFAULT_STUDY_STORAGE and spec.warnings
    policy = operator_policy({DEFAULT: f"sqlite:///{teams}/{{namespace}}.db",
                              ALLOWED: f"{DEFAULT_STUDY_STORAGE},sqlite:///{teams}/*"})
    assert policy.study_storage(spec, namespace=A) == DEFAULT_STUDY_STORAGE


def test_a_refused_study_in_a_namespace_default_is_not_made(
        ready: Cluster, teams: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a default the list allows, a CR naming no storage is NotAllowed and no
    file is made: the start warned, the message says what to do."""
    policy = operator_policy({ALLOWED: f"sqlite:///{teams}/{{namespace}}.db"})
    body = llmd(prometheus={"url": "http://127.0.0.1:9"})
    body["metadata"]["namespace"] = A
    body = ready.kube.create(API_VERSION, PLURAL, A, body)
    outcome = reconcile(ready.kube, body, policy=policy, mint=operator_mint(ready))
    assert not outcome.valid
    (problem,) = outcome.problems
    assert "SLOPILOT_DEFAULT_STORAGE" in problem
    assert list(teams.iterdir()) == []


def test_a_default_refused_for_its_own_reason_says_that_reason() -> None:
    """An entry with no extension names, for namespace ``team-a-journal``, the file SQLite
    keeps team-a's journal in. The refusal said the list does not allow the URL and then
    printed the list's entry: the very same URL. It names the side file now."""
    entry = "sqlite:////var/lib/slopilot/teams/{namespace}"
    policy = OperatorPolicy(allowed_storage=(entry,), default_storage=entry)
    body = {"metadata": {"name": "chat", "namespace": "team-a-journal"},
            "spec": {"model": {"name": "smollm2-135m"}}}
    with pytest.raises(StorageRefused) as refused:
        policy.study_storage(parse_spec(body), namespace="team-a-journal")
    message = str(refused.value)
    assert "SQLite's own journal file of the database 'team-a'" in message, message
    assert "{namespace}.db" in message and "allow-list allows" not in message, message
