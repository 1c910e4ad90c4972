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


def _cap_under(soft: int, hard: int, fds_each: int, given: str = "None") -> str:
    """``max_connections_from_flag`` in a process started with ``ulimit -n`` soft/hard,
    and that process's soft limit after it: ``"<cap> <soft>"`` or the error's text."""
    import subprocess
    import sys
    code = ("import resource\n"
            "from slopilot.engine.deadline_flags import max_connections_from_flag\n"
            "from slopilot.engine.connection_cap import ConnectionCapError\n"
            "try:\n"
            f"    cap = max_connections_from_flag({given}, {fds_each})\n"
            "except ConnectionCapError as exc:\n"
            "    print(exc)\n"
            "else:\n"
            "    print(cap, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n")
    import os
    from pathlib import Path
    # The soft limit first: a hard limit below the soft one in force is refused.
    shell = f"ulimit -Sn {soft} && ulimit -Hn {hard} && exec {sys.executable} -c \"$0\""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run(["bash", "-c", shell, code], capture_output=True, text=True,
                          timeout=60, check=True, env=env)
    return done.stdout.strip()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one_before_the_default() -> None:
    """A container's soft ``ulimit -n`` is 1024 under containerd 2 while its hard one is
    far higher: the meter's default cap read 256 from the soft limit, fewer streams than
    a vLLM replica runs (up to 1024 sequences), where raising the soft limit to the hard
    one, as Go's runtime does at every start, is the process's own to do."""
    assert _cap_under(256, 4096, 2) == "1024 4096"
    assert _cap_under(256, 4096, 1) == "1024 4096"
    # A hard limit as low as the soft one stays what the process can hold.
    assert _cap_under(256, 256, 2) == "64 256"
    assert "give at most 96" in _cap_under(256, 256, 2, given="500")
