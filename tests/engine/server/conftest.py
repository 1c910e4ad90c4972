"""Live servers shared by the server tests (each on 127.0.0.1 and a free port)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.live_server import LiveServer, start_server

ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="module")
def sim_server() -> Iterator[LiveServer]:
    """The simulated executor in real time (tiny-cpu: Llama-3-8B on an A100)."""
    with start_server(admin_token=ADMIN_TOKEN) as srv:
        yield srv


@pytest.fixture(scope="session")
def tiny_random_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = pytest.importorskip(
        "slopilot.engine.models", reason="the torch executor's model registry is missing")
    pytest.importorskip("torch")
    path: Path = models.fetch_model("tiny-random", cache_dir=tmp_path_factory.mktemp("models"))
    return path


@pytest.fixture(scope="module")
def torch_server(tiny_random_dir: Path) -> Iterator[LiveServer]:
    with start_server(executor="torch", model=str(tiny_random_dir),
                      served_model_name="tiny-random", num_gpu_blocks=256,
                      num_cpu_blocks=64, admin_token=ADMIN_TOKEN) as srv:
        yield srv


@pytest.fixture(params=["simulated", "torch"])
def any_server(request: pytest.FixtureRequest) -> LiveServer:
    """Each test that takes it runs against both executors."""
    name = "sim_server" if request.param == "simulated" else "torch_server"
    srv: LiveServer = request.getfixturevalue(name)
    return srv
