"""A storage URL's password never reaches a message, and hiding it leaves the rest of the
driver's text readable: only where it stands as the password (the URL as given,
``user:PASS@``, ``password=PASS``), not every substring equal to it."""

from __future__ import annotations

import importlib.util
import shlex
from urllib.parse import quote

import pytest

from slopilot.tuner.study.storage import StudyStorageError, open_study
from slopilot.tuner.study.storage_url import redacted, shown

DRIVER = ('(psycopg2.OperationalError) connection to server at "127.0.0.1", port 1 failed: '
          "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
          "connections?\n(Background on this error at: https://sqlalche.me/e/20/e3q8)")


@pytest.mark.parametrize("password", ["p", "postgres", "e", "1"])
def test_a_short_password_leaves_the_drivers_text_as_it_was(password: str) -> None:
    # It read "(***syco***g.O***erationalError) ... ***ort 1 ... acce***ting ... htt***s"
    # for the password p: every occurrence was blotted out.
    url = f"postgresql://postgres:{password}@127.0.0.1:1/db"
    assert redacted(DRIVER, url) == DRIVER


@pytest.mark.parametrize("password", ["p", "s3cret", "p@ss word", "it's"])
def test_the_password_is_hidden_where_it_stands_as_one(password: str) -> None:
    url = f"postgresql://postgres:{quote(password, safe='')}@db.example:5432/studies"
    hidden = "postgresql://postgres:***@db.example:5432/studies"
    cases = {
        f"cannot connect to {url}: refused": f"cannot connect to {hidden}: refused",
        f"dsn: host=db.example user=postgres password={password} dbname=studies":
            "dsn: host=db.example user=postgres password=*** dbname=studies",
        f"dsn: host=db.example password='{password}' dbname=studies":
            "dsn: host=db.example password='***' dbname=studies",
        f"postgresql://postgres:{password}@db.example/studies is down":
            "postgresql://postgres:***@db.example/studies is down",
        shlex.join(["slopilot", "tune", "--storage", url, "--study-name", "s"]):
            f"slopilot tune --storage {hidden} --study-name s",
    }
    for text, want in cases.items():
        assert redacted(text, url) == want, text


def test_a_shell_quoted_url_is_hidden_in_a_command() -> None:
    # A password the URL carries unencoded that the shell must quote (a space).
    url = "postgresql://postgres:two words@db.example/studies"
    command = shlex.join(["slopilot", "tune", "--storage", url, "--study-name", "s"])
    assert redacted(command, url) == \
        "slopilot tune --storage 'postgresql://postgres:***@db.example/studies' --study-name s"


def test_an_unreachable_database_names_the_drivers_error_readably() -> None:
    if not any(importlib.util.find_spec(d) for d in ("psycopg", "psycopg2")):
        pytest.skip("no PostgreSQL driver (psycopg or psycopg2) installed")
    # Port 1 on the loopback refuses at once: no server, no wait.
    with pytest.raises(StudyStorageError) as caught:
        open_study("postgresql://postgres:p@127.0.0.1:1/db", "x")
    text = str(caught.value)
    assert "postgresql://postgres:***@127.0.0.1:1/db" in text, text
    assert "OperationalError) connection" in text and "port 1 failed" in text, text
    assert "accepting TCP/IP" in text and "https://sqlalche.me" in text, text


@pytest.mark.parametrize("query, hidden", [
    ("password=hunter2", "password=***"),
    ("sslmode=require&sslpassword=key%20pass", "sslmode=require&sslpassword=***"),
    ("PassWord=hunter2&application_name=tune", "PassWord=***&application_name=tune"),
])
def test_a_password_in_the_query_is_hidden_too(query: str, hidden: str) -> None:
    # libpq takes password= (and sslpassword=, a client key's) in the query: tune
    # --storage '...?password=hunter2' printed it in every "cannot open" message.
    url = f"postgresql://admin@127.0.0.1:1/study?{query}"
    assert shown(url) == f"postgresql://admin@127.0.0.1:1/study?{hidden}"
    assert "hunter2" not in shown(url.replace("postgresql:", "not a url:"))
    secret = "hunter2" if "hunter2" in query else "key pass"
    driver = f"dsn: host=127.0.0.1 user=admin password={secret} dbname=study"
    assert redacted(f"cannot open {url}: {driver}", url) == \
        f"cannot open {shown(url)}: dsn: host=127.0.0.1 user=admin password=*** dbname=study"
    # Only where it stands as the password: a short one leaves the driver's words whole.
    short = "postgresql://admin@127.0.0.1:1/study?password=p"
    assert redacted(DRIVER, short) == DRIVER


def test_an_unreachable_database_hides_a_query_password() -> None:
    if not any(importlib.util.find_spec(d) for d in ("psycopg", "psycopg2")):
        pytest.skip("no PostgreSQL driver (psycopg or psycopg2) installed")
    with pytest.raises(StudyStorageError) as caught:
        open_study("postgresql://admin@127.0.0.1:1/study?password=hunter2", "x")
    text = str(caught.value)
    assert "hunter2" not in text, text
    assert "'postgresql://admin@127.0.0.1:1/study?password=***'" in text, text


@pytest.mark.parametrize("text", [
    "connect() got {'host': 'db', 'password': 'hunter2!x'}",  # a kwargs dict's repr
    'options: {"password": "hunter2!x", "user": "admin"}',  # JSON
    'invalid password "hunter2!x" for user admin',
    "PGPASSWORD=hunter2!x psql -h db",
    "hunter2!x",
])
def test_a_long_password_is_hidden_in_any_form_it_stands_alone_in(text: str) -> None:
    # Only the URL, user:PASS@ and password=PASS forms were hidden: a driver that echoed
    # the password in a dict's repr or in quotes printed it in clear. A token of five or
    # more characters equal to the password is the password far more likely than a word
    # of the driver's, and showing it leaks it where hiding it costs one word.
    url = f"postgresql://admin:{quote('hunter2!x', safe='')}@db/studies"
    assert "hunter2" not in redacted(text, url), redacted(text, url)
    assert "***" in redacted(text, url)


def test_a_long_password_inside_a_longer_word_is_left_alone() -> None:
    # Part of a word of the driver's is not the password standing alone.
    url = "postgresql://admin:server@db/studies"
    assert redacted("is the server running? servers: 2", url) == \
        "is the *** running? servers: 2"
    assert redacted("serverless", url) == "serverless"


@pytest.mark.parametrize("password", ["ab'cd\"ef", "tab\there1", "back\\slash1", "quo\"te12"])
def test_a_password_escaped_in_a_repr_or_json_is_hidden_too(password: str) -> None:
    # A dict's repr and JSON escape a quote, a backslash or a tab: the escaped form
    # printed in clear, and undoing the escapes gave the password back.
    import json
    url = f"postgresql://app:{quote(password, safe='')}@db/optuna"
    for text in ("connect() got {}".format({"password": password, "host": "db"}),
                 "options: " + json.dumps({"password": password})):
        out = redacted(text, url)
        assert "***" in out, out
        for form in (password, repr(password)[1:-1], json.dumps(password)[1:-1]):
            assert form not in out, out
