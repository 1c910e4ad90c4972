"""Studies in a real PostgreSQL server: the shared storage the docs give tenants.

The docs, the operator's default storage and its policy examples write
``postgresql://...``; SQLAlchemy 2.1 reads that as psycopg 3, which no extra installed
(only psycopg2), so every such study failed to open ("Failed to import DB access module
for the specified storage URL") in the image and in ``make install`` alike; no test
opened a study in PostgreSQL.
"""

from __future__ import annotations

import optuna
import pytest

from slopilot.tuner.study.storage import delete_named_study, open_study, study_names
from tests.support.postgres import PostgresServer, create_database, postgres  # noqa: F401

# The study's own ask and tell, as the controller's: Optuna warns that heartbeats are
# for its optimize loop (``heartbeat.TrialHeartbeat`` records them for ask and tell).
pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")


@pytest.mark.parametrize("driver", ["postgresql", "postgresql+psycopg2",
                                    "postgresql+psycopg"])
def test_a_study_lives_in_postgresql_by_every_url_form(postgres: PostgresServer,  # noqa: F811
                                                       driver: str) -> None:
    database = f"studies_{driver.replace('+', '_')}"
    create_database(postgres, database)
    url = postgres.url(database, driver)
    study = open_study(url, "team-a/chat/u1")
    trial = study.ask({"token_budget": optuna.distributions.IntDistribution(128, 8192,
                                                                            step=128)})
    study.tell(trial, 1234.5)
    # Another process (the operator restarted, another replica) reads it back.
    again = open_study(url, "team-a/chat/u1")
    [done] = again.get_trials()
    assert done.value == 1234.5 and done.params == trial.params
    assert study_names(url) == ["team-a/chat/u1"]
    assert delete_named_study(url, "team-a/chat/u1") is True
    assert study_names(url) == []


def test_a_namespaces_own_database_keeps_its_studies_apart(
        postgres: PostgresServer) -> None:  # noqa: F811
    # The policy's {namespace} entry: one database per namespace, a study name alike.
    for ns in ("team-a", "team-b"):
        create_database(postgres, f"studies_{ns}")
        study = open_study(postgres.url(f"studies_{ns}"), "chat")
        study.tell(study.ask(), 1.0 if ns == "team-a" else 2.0)
    a = open_study(postgres.url("studies_team-a"), "chat").get_trials()
    b = open_study(postgres.url("studies_team-b"), "chat").get_trials()
    assert [t.value for t in a] == [1.0] and [t.value for t in b] == [2.0]
