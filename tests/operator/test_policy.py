"""What a CR author may point the operator at: Prometheus URLs and images (policy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from slopilot.operator.policy import OperatorPolicy, PolicyError, policy_problems
from slopilot.operator.settings import operator_policy
from slopilot.operator.spec import SpecError, parse_spec
from slopilot.operator.study_storage import StorageRefused, resolve_storage
from slopilot.operator.validation import parse_image, prometheus_url_problem

NS = "team-a"
"""The namespace of the CRs judged here."""


def spec_of(**fields: Any) -> Any:
    return parse_spec({"spec": {"model": {"name": "m"}, **fields}})


@pytest.mark.parametrize(("url", "needle"), [
    ("ftp://prom:9090", "the scheme must be http or https"),
    ("http://", "no host"),
    ("http://:9090", "no host"),
    ("http://admin:pw@prom:9090", "user info is not allowed"),
    ("http://prom@10.0.0.1:9090", "user info is not allowed"),
    ("http://10.0.0.1:8080/?x=", "a query string is not allowed"),
    ("http://10.0.0.1:8080/internal?", "a query string is not allowed"),
    ("http://prom:9090/#frag", "a fragment is not allowed"),
    ("http://prom:99999", "Port out of range"),
    ("http://prom:0", "port 0 is not a port"),
    ("http://prom :9090", "white space"),
    # A host no resolver reads as written: the allow-list's ``*.monitoring`` matched
    # ``evil.com\.monitoring`` by its end, and a resolver reading ``\.`` as an escape
    # sees other labels than the list's.
    ("http://evil.com\\.monitoring:9090", "not a host name"),
    ("http://evil.com%2f.monitoring:9090", "not a host name"),
    ("http://evil.com%00.monitoring", "not a host name"),
    ("http://prom_1.monitoring:9090", "not a host name"),
    ("http://-prom.monitoring:9090", "not a host name"),
    ("http://prom..monitoring:9090", "not a host name"),
    ("http://[fd00::zz]:9090", "IPv6 address"),  # urlsplit says so from 3.11.4
])
def test_a_url_the_operator_must_not_fetch_is_refused_by_field(url: str, needle: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_of(prometheus={"url": url})
    assert any("spec.prometheus.url" in p and needle in p for p in err.value.problems), \
        err.value.problems


@pytest.mark.parametrize("url", ["http://prometheus-operated.monitoring:9090",
                                 "https://prom.example.com/prefix/", "http://10.0.0.7:9090",
                                 "http://[fd00::1]:9090", "http://Prom.Monitoring.:9090",
                                 "http://prom-1.monitoring.svc.cluster.local"])
def test_ordinary_prometheus_urls_pass(url: str) -> None:
    assert prometheus_url_problem(url) is None
    assert spec_of(prometheus={"url": url}).prometheus_url == url


def test_the_prometheus_allow_list_keeps_the_operator_to_known_hosts() -> None:
    policy = OperatorPolicy(allowed_prometheus=("prometheus-operated.monitoring:9090",
                                                "*.monitoring.svc.cluster.local"))
    assert policy.prometheus_allowed("http://prometheus-operated.monitoring:9090/")
    assert policy.prometheus_allowed("https://a.monitoring.svc.cluster.local")
    assert not policy.prometheus_allowed("http://prometheus-operated.monitoring:9091")
    assert not policy.prometheus_allowed("http://10.0.0.1:9090")
    assert not policy.prometheus_allowed("http://evilmonitoring.svc.cluster.local")
    assert OperatorPolicy().prometheus_allowed("http://10.0.0.1:9090")  # no list: any host
    problems = policy_problems(spec_of(prometheus={"url": "http://10.0.0.1:9090"}), policy,
                               namespace=NS)
    assert len(problems) == 1 and "SLOPILOT_ALLOWED_PROMETHEUS" in problems[0]


@pytest.mark.parametrize("value", ["", " ", ","])
def test_an_empty_prometheus_allow_list_allows_no_host_not_every_host(value: str) -> None:
    """Unset means any host; set, the variable lists the hosts, and an empty list (a blank
    value from a template, a ConfigMap key left empty) lists none. It read as unset, so
    the list an administrator emptied to shut tenants' URLs off opened them all."""
    policy = operator_policy({"SLOPILOT_ALLOWED_PROMETHEUS": value})
    assert not policy.prometheus_allowed("http://10.0.0.1:9090")
    assert not policy.prometheus_allowed("http://prometheus-operated.monitoring:9090")
    (problem,) = policy_problems(spec_of(), policy, namespace=NS)
    assert "Prometheus allow-list (empty)" in problem
    assert operator_policy({}).prometheus_allowed("http://10.0.0.1:9090")


@pytest.mark.parametrize(("image", "allowed"), [
    ("ghcr.io/slopilot/slopilot:0.1.0", True),
    ("ghcr.io/slopilot/slopilot@sha256:" + "a" * 64, True),
    ("vllm/vllm-openai:v0.11.0", True),
    ("docker.io/vllm/vllm-openai:latest", True),
    ("ghcr.io/slopilot/slopilot-evil:0.1.0", False),
    ("ghcr.io/slopilot/slopilot/sub:1", False),
    ("evil.io/vllm/vllm-openai:v0.11.0", False),
    ("vllm/vllm-openai-debug:1", False),
    ("ubuntu:22.04", False),
    ("Not An Image", False),
])
def test_only_allow_listed_images_run(image: str, allowed: bool) -> None:
    spec = spec_of(image=image)
    problems = policy_problems(spec, OperatorPolicy(), namespace=NS)
    assert (problems == []) is allowed, problems
    if not allowed:
        assert problems[0].startswith("spec.image=")


def test_an_admin_widens_or_narrows_the_image_list() -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_IMAGES": "registry.acme.internal/llm/*, "
                                                         "docker.io/acme/engine"})
    assert policy.image_allowed("registry.acme.internal/llm/team-a/engine:3")
    assert policy.image_allowed("acme/engine:1")
    assert not policy.image_allowed("registry.acme.internal/llmx/engine:3")
    assert not policy.image_allowed("ghcr.io/slopilot/slopilot:0.1.0")
    # The default image is judged too: a backend whose default is not allowed is refused.
    problems = policy_problems(spec_of(), policy, namespace=NS)
    assert problems and "the builtin default image" in problems[0]
    assert operator_policy({"SLOPILOT_ALLOWED_IMAGES": "*"}).image_allowed("ubuntu")


@pytest.mark.parametrize(("entry", "image", "allowed"), [
    ("ghcr.io/*", "ghcr.io/acme/engine:1", True),
    # Read as a Docker Hub path, the entry allowed docker.io/ghcr.io/... (another
    # registry than the one named) and nothing of ghcr.io.
    ("ghcr.io/*", "docker.io/ghcr.io/engine:1", False),
    ("ghcr.io/*", "ghcr.io.evil.com/acme/engine:1", False),
    ("GHCR.io/*", "ghcr.io/acme/engine@sha256:" + "a" * 64, True),
    ("registry.acme.internal/*", "registry.acme.internal/llm/engine:3", True),
    ("registry.acme.internal/*", "registry.acme.internal.evil.com/llm/engine:3", False),
    ("localhost:5000/*", "localhost:5000/engine:1", True),
    ("localhost:5000/*", "localhost:5001/engine:1", False),
    ("docker.io/*", "ubuntu:22.04", True),
    ("index.docker.io/*", "vllm/vllm-openai:v0.11.0", True),
    ("docker.io/*", "ghcr.io/acme/engine:1", False),
])
def test_a_whole_registry_entry_allows_that_registry_and_no_other(
        entry: str, image: str, allowed: bool) -> None:
    """``registry/*``: every repository of that registry, by docker's rule that a first
    component with a dot, a port or ``localhost`` names a registry."""
    policy = operator_policy({"SLOPILOT_ALLOWED_IMAGES": entry})
    assert policy.image_allowed(image) is allowed


@pytest.mark.parametrize("entry", ["ghcr.io/acme/engine:1.0", "not an image", "a@b"])
def test_a_bad_allow_list_entry_names_the_variable(entry: str) -> None:
    with pytest.raises(PolicyError, match=r"SLOPILOT_ALLOWED_IMAGES"):
        operator_policy({"SLOPILOT_ALLOWED_IMAGES": entry})


def test_image_references_normalize_as_docker_does() -> None:
    assert parse_image("ubuntu").repository == "docker.io/library/ubuntu"  # type: ignore[union-attr]
    assert parse_image("localhost:5000/x:1").repository == "localhost:5000/x"  # type: ignore[union-attr]
    assert parse_image("index.docker.io/vllm/vllm-openai").repository \
        == "docker.io/vllm/vllm-openai"  # type: ignore[union-attr]
    assert parse_image("UPPER/case") is None


DEFAULT_DB = "sqlite:////var/lib/slopilot/study.db"
SHARED = "postgresql+psycopg2://optuna:Adm1n-s3cret@db.shared.svc:5432/studies"


def test_by_default_only_the_operators_own_study_file_is_opened() -> None:
    policy = OperatorPolicy()
    assert policy.study_storage(spec_of(), namespace=NS) == DEFAULT_DB  # the default storage
    for url in ("postgresql://optuna@10.0.0.5:5432/x", "sqlite:////etc/slopilot/evil.db",
                "sqlite:////var/lib/slopilot/other.db", "mysql://root@db/x"):
        problems = policy_problems(spec_of(tuning={"storage": url}), policy, namespace=NS)
        assert problems and "spec.tuning.storage" in problems[0], url
        assert "SLOPILOT_ALLOWED_STORAGE" in problems[0]


def test_the_default_study_file_is_the_mounted_one_whatever_the_working_directory(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Three slashes are a path relative to the process's working directory (the image's
    # is /tmp): the study would not be in the volume mounted at /var/lib/slopilot.
    from sqlalchemy.engine import make_url

    from slopilot.operator.knobs import DEFAULT_STUDY_STORAGE

    assert make_url(DEFAULT_STUDY_STORAGE).database == "/var/lib/slopilot/study.db"
    assert OperatorPolicy().named_storage(spec_of().tuning.storage, NS) == DEFAULT_STUDY_STORAGE
    crd = (Path(__file__).parents[2] / "manifests" / "crd.yaml").read_text()
    operator = (Path(__file__).parents[2] / "manifests" / "operator.yaml").read_text()
    assert "sqlite:///var" not in crd + operator


def test_the_old_relative_default_is_read_as_the_mounted_file_with_a_warning() -> None:
    # Every LLMDeployment created under the old CRD carries its default in the object.
    spec = spec_of(tuning={"storage": "sqlite:///var/lib/slopilot/study.db"})
    assert spec.tuning.storage == DEFAULT_DB
    [warning] = spec.warnings
    assert "spec.tuning.storage" in warning and "relative" in warning
    assert DEFAULT_DB in warning
    assert policy_problems(spec, OperatorPolicy(), namespace=NS) == []


def test_another_relative_sqlite_path_is_refused_naming_the_fix() -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": "*"})
    [problem] = policy_problems(spec_of(tuning={"storage": "sqlite:///team.db"}), policy,
                                namespace=NS)
    assert "spec.tuning.storage" in problem and "relative" in problem
    assert "sqlite:////" in problem  # four slashes: an absolute path
    with pytest.raises(PolicyError, match="relative"):
        operator_policy({"SLOPILOT_ALLOWED_STORAGE": "sqlite:///var/lib/x/study.db"})


def test_a_cr_names_a_shared_database_and_the_operator_brings_the_credentials() -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": f"{DEFAULT_DB},{SHARED}"})
    asked = "postgresql+psycopg2://optuna@db.shared.svc:5432/studies"
    assert policy.study_storage(spec_of(tuning={"storage": asked}), namespace=NS) == SHARED
    # Another database, user, port or query on the same server is another storage.
    for url in ("postgresql+psycopg2://optuna@db.shared.svc:5432/other",
                "postgresql+psycopg2://root@db.shared.svc:5432/studies",
                "postgresql+psycopg2://optuna@db.shared.svc:6543/studies",
                "postgresql+psycopg2://optuna@db.shared.svc:5432/studies?host=/tmp"):
        assert policy_problems(spec_of(tuning={"storage": url}), policy, namespace=NS), url


def test_a_password_in_the_cr_is_refused_and_never_echoed() -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": SHARED})
    spec = spec_of(tuning={"storage": SHARED})  # even the right one: the CR is readable
    problems = policy_problems(spec, policy, namespace=NS)
    assert problems and "holds a password" in problems[0]
    assert "Adm1n-s3cret" not in " ".join(problems)
    # Nor does the allow-list's own password show when a CR is refused.
    other = policy_problems(spec_of(tuning={"storage": "postgresql://x@h/db"}), policy,
                            namespace=NS)
    assert other and "Adm1n-s3cret" not in other[0] and "***" in other[0]


@pytest.mark.parametrize(("url", "allowed"), [
    ("sqlite:////var/lib/slopilot/team-a.db", True),
    ("sqlite:////var/lib/slopilot/../../etc/passwd", False),
    ("sqlite:////var/lib/slopilot/sub/team.db", False),
    ("sqlite:////var/lib/slopilot/.hidden", False),
    ("sqlite:////var/lib/slopilotx/team.db", False),
    ("sqlite:////var/lib/slopilot/team.db?mode=ro&uri=true", False),
    ("sqlite://somehost//var/lib/slopilot/team.db", False),
])
def test_a_directory_entry_allows_plain_files_inside_it_only(url: str, allowed: bool) -> None:
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": "sqlite:////var/lib/slopilot/*"})
    problems = policy_problems(spec_of(tuning={"storage": url}), policy, namespace=NS)
    assert (problems == []) is allowed, problems


@pytest.mark.parametrize("name", ["study.db-journal", "team-b.db-wal", "team-b.db-shm",
                                  "team-b.db-mj0A1B2C9F3"])
def test_a_databases_journal_is_never_opened_as_a_database_of_its_own(name: str) -> None:
    """``sqlite:////dir/*`` allows any plain file name in the directory, and SQLite keeps
    each database's rollback journal (WAL, shared memory, super-journal) beside it as
    ``<db>-journal`` and the like: a CR naming one had the operator create a database in
    the file another database's transactions use as their journal (the default
    ``study.db``, every tenant's, where the directory is the operator's own). To SQLite
    that is a hot journal: every connection to that database must roll it back under an
    exclusive lock before it reads, a read-only one fails ("attempt to write a readonly
    database"), and the rollback deletes the file under the study. Refused by the spec's
    parse, naming the field and the fix, and again where the URL comes back from
    ``status.studyStorages``."""
    url = f"sqlite:////var/lib/slopilot/{name}"
    with pytest.raises(SpecError) as err:
        spec_of(tuning={"storage": url})
    (problem,) = err.value.problems
    assert problem.startswith(f"spec.tuning.storage={url!r}"), problem
    assert "SQLite's own" in problem and "e.g. sqlite:////var/lib/slopilot/" in problem
    policy = operator_policy({"SLOPILOT_ALLOWED_STORAGE": "sqlite:////var/lib/slopilot/*"})
    with pytest.raises(StorageRefused, match=r"SQLite's own"):
        resolve_storage(url, policy.storage_rules, NS)
    # A name that merely holds the words is a database file like any other.
    ok = "sqlite:////var/lib/slopilot/wal-journal-shm.db"
    assert policy_problems(spec_of(tuning={"storage": ok}), policy, namespace=NS) == []


@pytest.mark.parametrize("entry", ["sqlite:///relative/*", "sqlite:////a/../b/*",
                                   "mysql://root@db/x", "not a url"])
def test_a_bad_storage_entry_names_the_variable(entry: str) -> None:
    with pytest.raises(PolicyError, match=r"SLOPILOT_ALLOWED_STORAGE"):
        operator_policy({"SLOPILOT_ALLOWED_STORAGE": entry})


def test_a_bad_storage_entry_does_not_print_its_password() -> None:
    with pytest.raises(PolicyError) as err:
        operator_policy({"SLOPILOT_ALLOWED_STORAGE": "mysql://root:hunter2@db/x"})
    assert "hunter2" not in str(err.value)


def test_study_storage_errors_never_carry_the_password(tmp_path: Any) -> None:
    from slopilot.tuner.study.storage import StudyStorageError, open_study

    url = f"sqlite:///{tmp_path}/missing/dir/study.db"
    with pytest.raises(StudyStorageError):
        open_study(url, "s")
    secret = "postgresql://optuna:pa55w0rd%21@127.0.0.1:1/studies"
    with pytest.raises(StudyStorageError) as err:
        open_study(secret, "s")
    assert "pa55w0rd" not in str(err.value) and "***" in str(err.value)
    with pytest.raises(StudyStorageError) as err:
        open_study("optuna:pa55w0rd@db/studies", "s")
    assert "pa55w0rd" not in str(err.value)


@pytest.mark.parametrize(("value", "message"), [
    ("name-space", "not a Prometheus label name"), ("__meta_ns", "not a Prometheus label"),
    ("slopilot_deployment", "already use"),
])
def test_a_bad_namespace_label_names_the_variable(value: str, message: str) -> None:
    with pytest.raises(PolicyError, match=f"{message}.*SLOPILOT_NAMESPACE_LABEL"):
        operator_policy({"SLOPILOT_NAMESPACE_LABEL": value})
    assert operator_policy({}).namespace_label is None
    assert operator_policy({"SLOPILOT_NAMESPACE_LABEL": " tenant "}).namespace_label == "tenant"
