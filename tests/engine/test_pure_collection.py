"""The pure engine tests (scheduler, block manager, config) need no torch to run.

The scheduler and the block manager import no torch (an import-linter contract); their
tests must not either, or a box without torch (or a contributor without the engine
extra) could not run the fastest and most important tests at all.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ["tests/engine/test_scheduler.py", "tests/engine/test_block_manager.py",
        "tests/engine/test_config.py", "tests/engine/test_scheduler_priority.py",
        "tests/engine/test_prefix_cache.py"]
# Collected, not run here: the property test takes a while and runs on its own anyway.
COLLECT_ONLY = ["tests/engine/test_scheduler_properties.py"]
# A None entry in sys.modules makes ``import torch`` raise ImportError.
_BLOCK_TORCH = (
    "import sys; sys.modules['torch'] = None; import pytest; "
    "sys.exit(pytest.main(['-q', '-x', *sys.argv[1:]]))")


def _pytest_without_torch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _BLOCK_TORCH, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_pure_engine_tests_run_without_torch() -> None:
    res = _pytest_without_torch(*PURE)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert " passed" in res.stdout
    res = _pytest_without_torch("--collect-only", *COLLECT_ONLY)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
