"""Fixtures shared by the torch executor's test modules.

Torch and the model registry are imported inside the fixtures: the pure scheduler and
block-manager tests share this directory and must collect on a box without torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def loaded_tiny(tiny: Path) -> Any:
    """The tiny model loaded once per module (a ``LoadedModel``)."""
    from slopilot.engine.executors.loader import load_checkpoint

    return load_checkpoint(tiny)


# torch's ops read the padding through the mask's -inf (a NaN there would spread); the
# native CPU kernels read each row's length instead.
@pytest.fixture(params=["torch", "auto"])
def make(request: pytest.FixtureRequest, loaded_tiny: Any) -> Callable[..., Any]:
    """``make(decode_graphs_mode, **settings)``: a TorchExecutor on the tiny model with 40
    blocks of 4 tokens, once with torch's ops and once with the native CPU kernels."""
    from slopilot.engine.executors.torch_runner import TorchExecutor

    def executor(mode: str, **kw: object) -> Any:
        settings: dict[str, object] = dict(num_gpu_blocks=40, num_cpu_blocks=8,
                                           block_size=4, cpu_kernels=request.param)
        settings.update(kw)
        return TorchExecutor(loaded_tiny, decode_graphs=mode, **settings)  # type: ignore[arg-type]
    return executor
