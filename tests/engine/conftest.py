"""Fixtures shared by the torch executor's test modules.

Torch and the model registry are imported inside the fixtures: the pure scheduler and
block-manager tests share this directory and must collect on a box without torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread for a module: on a shared 2-core box, OpenMP barriers on
    descheduled threads make multi-threaded decode slower and noisier."""
    from tests.engine.torch_driver import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded random tiny Llama, built once per module into a temp cache."""
    from slopilot.engine.models import fetch_model

    return fetch_model("tiny-random", tmp_path_factory.mktemp("cache"))
