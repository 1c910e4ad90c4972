"""Fixtures for the benchmark scripts' own tests (their figures are never asserted)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.torch_driver import torch_threads


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Torch on one thread: on a shared 2-core box OpenMP barriers make it noisier."""
    with torch_threads(1):
        yield
