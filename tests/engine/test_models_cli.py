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


def _a_file(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0\n")
    return path


@pytest.mark.parametrize(("where", "message"), [
    (lambda d: _a_file(d), "is a file, not a folder"),
    (lambda d: _a_file(d) / "models", "is a file, so no folder can be made under it"),
    # /proc takes no folder, even from root: mkdir raised FileNotFoundError.
    (lambda d: Path("/proc/slopilot-models-test"), "cannot create"),
])
def test_a_cache_dir_that_cannot_hold_models_is_a_clear_error(
        tmp_path: Path, where: object, message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    cache = where(tmp_path)  # type: ignore[operator]
    if str(cache).startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    assert main(["models", "fetch", "tiny-random", "--cache-dir", str(cache)]) == 2
    err = capsys.readouterr().err
    assert f"--cache-dir {cache}" in err and message in err, err
    assert "give" in err and "Traceback" not in err


def test_the_default_cache_under_a_file_names_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLOPILOT_CACHE_DIR", str(_a_file(tmp_path)))
    assert main(["models", "fetch", "tiny-random"]) == 2
    err = capsys.readouterr().err
    assert f"SLOPILOT_CACHE_DIR={tmp_path / 'passwd'}" in err and "is a file" in err, err


def test_list_says_a_cache_dir_that_is_a_file_is_no_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It answered "not built" for every model, as if the folder were empty.
    cache = _a_file(tmp_path)
    assert main(["models", "list", "--cache-dir", str(cache)]) == 2
    captured = capsys.readouterr()
    assert f"--cache-dir {cache}: is a file, not a folder" in captured.err, captured.err
    assert "not built" not in captured.out
