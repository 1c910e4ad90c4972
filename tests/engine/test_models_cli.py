"""`slopilot models`: fetch builds once into the cache; unknown names are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.cli import main


def test_fetch_tiny_random_then_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch", "tiny-random", "--cache-dir", str(tmp_path)]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    assert list(path.glob("*.safetensors"))
    assert main(["models", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny-random" in out and "cached at" in out
    assert "smollm2-135m" in out


def test_unknown_model_is_a_clear_error(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch", "gpt-5", "--cache-dir", str(tmp_path)]) == 2
    assert "not registered; known: smollm2-135m, tiny-random" in capsys.readouterr().err
