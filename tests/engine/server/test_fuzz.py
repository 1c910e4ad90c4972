"""Fuzz the server through its own OpenAPI schema: whatever the input, never a 5xx.

The executor runs in virtual time (no pacing sleeps), so a fuzzed request that asks for
thousands of tokens still ends in well under a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.support.live_server import LiveServer, build_backend, start_server
from tests.support.waits import HANG_GUARD_S


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[LiveServer]:
    with start_server(build_backend(realtime=False), admin_token="fuzz-token",
                      admin_port=0) as srv:
        yield srv


def test_no_server_error(fuzz_server: LiveServer) -> None:
    # Hypothesis drives schemathesis's strategies directly: its pytest plugin does not
    # load under pytest 9. Both apps: the inference port and the admin port.
    operations = []
    for url in (fuzz_server.url + "/openapi.json",
                fuzz_server.admin_url + "/admin/openapi.json"):
        schema = schemathesis.openapi.from_url(
            url, headers={"Authorization": "Bearer fuzz-token"})
        operations += [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 8
    for op in operations:
        @given(case=op.as_strategy())
        @settings(max_examples=15, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            case.call_and_validate(checks=[not_a_server_error], timeout=HANG_GUARD_S,
                                   headers={"Authorization": "Bearer fuzz-token"})

        check()


def test_engine_is_clean_after_fuzzing(fuzz_server: LiveServer) -> None:
    def state(e: Any) -> tuple[int, int]:
        e.scheduler.check_integrity()
        return len(e.scheduler.requests), e.scheduler.kv.num_used_blocks
    assert fuzz_server.call(state) == (0, 0)
    assert fuzz_server.engine.error is None
