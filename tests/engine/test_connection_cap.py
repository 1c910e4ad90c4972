"""``connection_cap``'s default and bound: what a pod's descriptors can hold."""

from __future__ import annotations

import pytest

from slopilot.engine.connection_cap import (
    DEFAULT_CEILING,
    ConnectionCap,
    ConnectionCapError,
    check_max_connections,
    default_max_connections,
)


@pytest.mark.parametrize(("fds_each", "open_files", "cap"), [
    (1, 1024, 512),  # serve under the usual soft ulimit -n: half for slots
    (2, 1024, 256),  # the meter: a client's descriptor and vLLM's
    (1, 1_048_576, DEFAULT_CEILING),  # containerd's nofile: the ceiling, for memory
    (2, 3, 1),  # never 0: a server that refused everyone would be no server
])
def test_the_default_is_half_the_descriptors_at_most_the_ceiling(
        fds_each: int, open_files: int, cap: int) -> None:
    assert default_max_connections(fds_each, open_files) == cap


def test_a_cap_past_the_descriptors_names_the_most_and_the_fix() -> None:
    assert check_max_connections(960, 1, 1024) == 960
    with pytest.raises(ConnectionCapError, match=r"--max-connections 961: .*1024 "
                       r"descriptors .*give at most 960, or raise ulimit -n"):
        check_max_connections(961, 1, 1024)


def test_slots_are_taken_up_to_the_cap_and_given_back() -> None:
    cap = ConnectionCap(2)
    assert [cap.take(), cap.take(), cap.take()] == [True, True, False]
    cap.give_back()
    assert cap.take() and cap.held == 2
    with pytest.raises(ConnectionCapError, match="--max-connections 0"):
        ConnectionCap(0)
