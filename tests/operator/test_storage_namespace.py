"""``{namespace}`` in a storage allow-list entry: each namespace its own storage.

An allow-list entry was the same for every namespace: with ``sqlite:////dir/teams/*`` a
tenant of team-a could name ``teams/team-b.db``, and the operator opened team-b's file
with its own rights and created team-a's study there (writes, locks, growth in another
team's file); one shared PostgreSQL entry let every tenant into the same database. An
entry may now carry ``{namespace}``, resolved to the CR's namespace wherever a storage is
resolved: the CR's validation, the daemon's study, the cleanup at deletion, and the
reclaim at start (for each recorded namespace). Entries are checked at the start, and
entries without the placeholder behave as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.crd import API_VERSION, PLURAL, crd_manifest
from slopilot.operator.daemon import study_name
from slopilot.operator.policy import OperatorPolicy, PolicyError, policy_problems
from slopilot.operator.reconcile import reconcile
from slopilot.operator.render import DEFAULT_OPERATOR_NAMESPACE
from slopilot.operator.settings import operator_policy, started_policy
from slopilot.operator.spec import parse_spec
from slopilot.operator.study_cleanup import delete_studies
from slopilot.operator.study_ledger import record, shard_name
from slopilot.operator.study_reclaim import reclaim_orphaned_studies, serving
from slopilot.tuner.study.storage import open_study
from tests.operator.operator_support import Cluster, llmd, operator_mint, with_namespaces
from tests.operator.test_study_reclaim import gone_while_down, names, study_of, tuned
from tests.support.kube_server import RunningEmulator

A, B = "team-a", "team-b"
UID = "0b3c6d3e-1f2a-4b5c-8d9e-0f1a2b3c4d5e"


@pytest.fixture
def ready(kube: RunningEmulator, cluster: Cluster) -> Cluster:
    return with_namespaces(kube, cluster, A, B)


def problems_in(namespace: str, storage: str, policy: OperatorPolicy) -> list[str]:
    spec = parse_spec({"spec": {"model": {"name": "m"}, "tuning": {"storage": storage}}})
    return policy_problems(spec, policy, namespace=namespace)


def test_a_tenant_naming_another_namespaces_file_is_refused_and_opens_nothing(
        ready: Cluster, teams: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's case, through the reconcile and the daemon: team-a's CR naming
    team-b's file is NotAllowed and no file is made; its own file is where its study
    goes. The refusal says why, and names the storage team-a may use."""
    policy = OperatorPolicy(allowed_storage=(f"sqlite:///{teams}/{{namespace}}.db",))
    theirs = f"sqlite:///{teams}/team-b.db"
    body = llmd("chat", prometheus={"url": "http://127.0.0.1:9"},
                tuning={"storage": theirs})
    body["metadata"]["namespace"] = A
    body = ready.kube.create(API_VERSION, PLURAL, A, body)
    outcome = reconcile(ready.kube, body, policy=policy, mint=operator_mint(ready))
    assert not outcome.valid
    (problem,) = outcome.problems
    assert problem.startswith(f"spec.tuning.storage={theirs!r}"), problem
    assert "another namespace" in problem and "{namespace}" in problem
    assert f"sqlite:///{teams}/team-a.db" in problem  # the fix: its own
    assert not (teams / "team-b.db").exists()

    mine = tuned(ready, policy, f"sqlite:///{teams}/team-a.db", monkeypatch,
                 namespace=A, name="own")
    assert names(f"sqlite:///{teams}/team-a.db") == [study_of(mine)]
    assert not (teams / "team-b.db").exists()


@pytest.mark.parametrize(("entry", "own", "others"), [
    ("sqlite:///{dir}/{{namespace}}.db", "{dir}/team-a.db",
     ["{dir}/team-b.db", "{dir}/team-a-x.db", "{dir}/team.db"]),
    ("sqlite:///{dir}/{{namespace}}/*", "{dir}/team-a/study.db",
     ["{dir}/team-b/study.db", "{dir}/team-a.db", "{dir}/team-a/sub/x.db"]),
    ("sqlite:///{dir}/{{namespace}}_*.db", "{dir}/team-a_chat.db",
     ["{dir}/team-b_chat.db", "{dir}/team-a-x_chat.db", "{dir}/team-a_chat.sqlite",
      "{dir}/team_a_chat.db"]),
    ("sqlite:///{dir}/s.{{namespace}}.db", "{dir}/s.team-a.db", ["{dir}/s.team-b.db"]),
])
def test_each_sqlite_shape_allows_the_crs_own_namespace_only(
        teams: Path, entry: str, own: str, others: list[str]) -> None:
    policy = OperatorPolicy(allowed_storage=(entry.format(dir=teams),))
    assert problems_in(A, "sqlite:///" + own.format(dir=teams), policy) == []
    for other in others:
        url = "sqlite:///" + other.format(dir=teams)
        assert problems_in(A, url, policy), url
    # team-b's own is team-b's, as team-a's was team-a's.
    assert problems_in(B, "sqlite:///" + own.format(dir=teams).replace(A, B), policy) == []


def test_a_database_per_namespace_is_opened_with_the_admins_credentials() -> None:
    entry = "postgresql+psycopg2://optuna:Adm1n-s3cret@db.shared.svc:5432/studies_{namespace}"
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": entry})
    spec = parse_spec({"spec": {"model": {"name": "m"}, "tuning": {
        "storage": "postgresql+psycopg2://optuna@db.shared.svc:5432/studies_team-a"}}})
    assert policy.study_storage(spec, namespace=A) == (
        "postgresql+psycopg2://optuna:Adm1n-s3cret@db.shared.svc:5432/studies_team-a")
    (problem,) = policy_problems(spec, policy, namespace=B)
    assert "another namespace" in problem and "Adm1n-s3cret" not in problem
    assert "studies_team-b" in problem  # what team-b may name instead


def test_a_database_name_postgresql_would_cut_is_refused_saying_why() -> None:
    """PostgreSQL cuts a database name to 63 bytes at the connection: two long
    namespaces would meet in one database."""
    policy = OperatorPolicy(allowed_storage=("postgresql://optuna@db/studies_{namespace}",))
    long_ns = "n" * 60
    (problem,) = problems_in(long_ns, f"postgresql://optuna@db/studies_{long_ns}", policy)
    assert "63" in problem and long_ns in problem


def test_the_reclaim_resolves_each_recorded_entry_for_its_namespace(
        ready: Cluster, teams: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded under ``teams/*`` (any tenant, any file), then the administrator moves
    to ``teams/{namespace}.db``: a gone team-a CR's study in team-a's own file is
    reclaimed; team-b's file, which team-a's CR had named, is not opened for team-a any
    more (its study stays, for the administrator), nor is a file named by the entry's
    text, ``{namespace}.db``."""
    before = OperatorPolicy(allowed_storage=(f"sqlite:///{teams}/*",))
    own, theirs = (f"sqlite:///{teams}/{f}" for f in ("team-a.db", "team-b.db"))
    in_own = tuned(ready, before, own, monkeypatch, namespace=A, name="own")
    in_theirs = tuned(ready, before, theirs, monkeypatch, namespace=A, name="theirs")
    b_study = tuned(ready, before, theirs, monkeypatch, namespace=B, name="chat")
    gone_while_down(ready, in_own)
    gone_while_down(ready, in_theirs)

    after = OperatorPolicy(allowed_storage=(f"sqlite:///{teams}/{{namespace}}.db",))
    done = reclaim_orphaned_studies(ready.kube, after, serving(None))
    assert done.deleted == [study_of(in_own)]
    assert names(theirs) == sorted([study_of(in_theirs), study_of(b_study)])
    assert any(line.startswith(f"{shard_name(A)} entry of namespace {A}")
               and "another namespace" in line for line in done.skipped), done.skipped
    assert sorted(p.name for p in teams.iterdir()) == ["team-a.db", "team-b.db"]


def test_a_per_namespace_database_entry_is_visited_only_as_recorded(
        ready: Cluster, teams: Path) -> None:
    """An entry naming one database per namespace names none by itself: the reclaim
    visits the namespaces' databases on record, each for its own namespace."""
    entry = f"sqlite:///{teams}/{{namespace}}.db"
    own = f"sqlite:///{teams}/team-a.db"
    orphan = study_name(A, "chat", UID)
    open_study(own, orphan)
    record(ready.kube, DEFAULT_OPERATOR_NAMESPACE, A, own)
    done = reclaim_orphaned_studies(ready.kube, OperatorPolicy(allowed_storage=(entry,)),
                                    serving(None))
    assert done.deleted == [orphan] and not done.skipped
    assert sorted(p.name for p in teams.iterdir()) == ["team-a.db"]


def test_the_cleanup_at_deletion_opens_only_the_crs_own_namespaces_storage(
        ready: Cluster, teams: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``status.studyStorages`` is whoever may write it: an entry naming another
    namespace's file under a ``{namespace}`` entry is refused there too, by the
    daemon's end and by the deletion handler's route (``delete_studies``)."""
    policy = OperatorPolicy(allowed_storage=(f"sqlite:///{teams}/{{namespace}}.db",))
    own, theirs = (f"sqlite:///{teams}/{f}" for f in ("team-a.db", "team-b.db"))
    body = tuned(ready, policy, own, monkeypatch, namespace=A)
    name = study_of(body)
    open_study(theirs, name)  # as if team-a's study had been made there before
    ready.kube.patch(API_VERSION, PLURAL, A, "chat", {"status": {
        "studyStorages": [theirs, own]}}, subresource="status")
    delete_studies(ready.kube.get(API_VERSION, PLURAL, A, "chat") or {}, policy,
                   log=logging.getLogger("test"))
    assert names(own) == []
    assert names(theirs) == [name]


def test_the_daemons_end_deletes_the_study_from_the_namespaces_own_storage(
        ready: Cluster, teams: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.operator.operator_support import daemon_loop
    from tests.operator.standins import build_study_controller

    policy = OperatorPolicy(allowed_storage=(f"sqlite:///{teams}/{{namespace}}_*.db",))
    own = f"sqlite:///{teams}/team-a_chat.db"
    body = tuned(ready, policy, own, monkeypatch, namespace=A)
    loop = daemon_loop(ready, ready.kube.get(API_VERSION, PLURAL, A, "chat") or body,
                       monkeypatch, factory=build_study_controller, policy=policy,
                       namespace=A)
    assert loop.step() is True and loop.controller is not None
    loop.end_deleted()
    assert names(own) == []


@pytest.mark.parametrize(("entry", "needle"), [
    ("postgresql://optuna@{namespace}.db.svc/studies", "host"),
    ("postgresql://{namespace}@db.svc/studies", "user"),
    ("postgresql://optuna@db.svc:{namespace}/studies", "port"),
    ("postgresql://optuna@db.svc/studies?options={namespace}", "query"),
    ("sqlite:////var/lib/slopilot/{ns}.db", "unknown placeholder {ns}"),
    ("sqlite:////var/lib/slopilot/{Namespace}.db", "unknown placeholder {Namespace}"),
    ("sqlite:////var/lib/{namespace}/{namespace}.db", "{namespace} twice"),
    ("sqlite:////var/lib/slopilot/{namespace.db", "brace"),
    ("sqlite:////var/lib/slopilot/{namespace}-*.db", "team-a-x"),
    ("sqlite:////var/lib/slopilot/*-{namespace}.db", "team-a-x"),
    ("sqlite:////var/lib/slopilot/team-*.db", "a * stands"),
    ("sqlite:////var/lib/*/{namespace}.db", "a * stands"),
    ("sqlite:////var/lib/slopilot/{namespace}_*_*.db", "one *"),
    ("sqlite:////var/lib/../{namespace}.db", ".."),
    ("sqlite:///var/lib/{namespace}.db", "relative"),
    ("postgresql://optuna@db.svc/studies_{namespace}_*", "a * stands"),
])
def test_an_entry_with_a_misplaced_placeholder_stops_the_operator_naming_the_fix(
        entry: str, needle: str) -> None:
    with pytest.raises(PolicyError) as err:
        operator_policy({"SLOPILOT_ALLOWED_STORAGE": f"sqlite:////ok/study.db,{entry}"})
    message = str(err.value)
    assert f"storage allow-list entry {entry!r}" in message, message
    assert needle in message, message
    assert "SLOPILOT_ALLOWED_STORAGE" in message
    assert "e.g." in message or "write" in message  # the fix


def test_the_operator_command_stops_before_kopf_on_such_an_entry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """At the start, not at the first CR: kopf's startup handler retries a failure
    for good, with the message buried in its log."""
    from slopilot.cli import main
    from slopilot.operator import commands

    def never(*_: Any) -> int:
        raise AssertionError("kopf started with a bad storage entry")

    monkeypatch.setenv("SLOPILOT_ALLOWED_STORAGE", "postgresql://optuna@{namespace}.db/s")
    monkeypatch.setattr(commands, "_run_until_signalled", never)
    monkeypatch.setattr(commands, "_reclaim", never)
    with pytest.raises(SystemExit) as exited:
        main(["operator", "--standalone", "--all-namespaces"])
    assert "postgresql://optuna@{namespace}.db/s" in str(exited.value.code)
    assert "SLOPILOT_ALLOWED_STORAGE" in str(exited.value.code)


@pytest.mark.parametrize(("entries", "shared"), [
    ("sqlite:////teams/{namespace}.db,*", "'*'"),
    ("sqlite:////teams/{namespace}.db,sqlite:////teams/*", "'sqlite:////teams/*'"),
])
def test_an_entry_that_undoes_the_placeholder_is_warned_of_at_the_start(
        entries: str, shared: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="slopilot.operator.settings"):
        started_policy({"SLOPILOT_ALLOWED_STORAGE": entries})
    assert any(shared in r.getMessage() and "every namespace" in r.getMessage()
               for r in caplog.records), caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slopilot.operator.settings"):
        started_policy({"SLOPILOT_ALLOWED_STORAGE": "sqlite:////teams/{namespace}.db,"
                                                     "sqlite:////var/lib/slopilot/study.db"})
    assert not caplog.records




@pytest.mark.parametrize(("entry", "namespace", "url", "allowed"), [
    ("sqlite:////var/lib/slopilot/teams/*", A, "sqlite:////var/lib/slopilot/teams/team-b.db",
     True),
    ("sqlite:////var/lib/slopilot/teams/*", B, "sqlite:////var/lib/slopilot/teams/x.db", True),
    ("sqlite:////var/lib/slopilot/study.db", A, "sqlite:////var/lib/slopilot/study.db", True),
    ("sqlite:////var/lib/slopilot/study.db", B, "sqlite:////var/lib/slopilot/x.db", False),
    ("postgresql://optuna@db/studies", B, "postgresql://optuna@db/studies", True),
    ("*", A, "postgresql://anyone@anywhere/x", True),
])
def test_entries_without_a_placeholder_behave_as_before(
        entry: str, namespace: str, url: str, allowed: bool) -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": entry})
    assert (problems_in(namespace, url, policy) == []) is allowed


def test_the_crds_description_of_the_field_tells_the_tenant_of_the_placeholder() -> None:
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    field = schema["properties"]["spec"]["properties"]["tuning"]["properties"]["storage"]
    assert "{namespace}" in field["description"]
    assert "allows for this namespace" in field["description"]
