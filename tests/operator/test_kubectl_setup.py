"""``make test``'s kubectl check: which kubectl counts, and what it prints for the Makefile."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import kubectl_setup


def _fake(tmp_path: Path, minor: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "kubectl"
    exe.write_text(f"#!/bin/sh\necho '{{\"clientVersion\": {{\"minor\": \"{minor}\"}}}}'\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize(("minor", "ok"), [("20", False), ("26", False), ("27", True),
                                           ("32+", True), ("x", False)])
def test_only_a_kubectl_of_1_27_or_newer_counts(tmp_path: Path, minor: str, ok: bool) -> None:
    assert kubectl_setup.usable(str(_fake(tmp_path, minor))) is ok


def test_a_missing_or_broken_kubectl_does_not_count(tmp_path: Path) -> None:
    assert not kubectl_setup.usable(None)
    assert not kubectl_setup.usable(str(tmp_path / "nowhere"))
    broken = tmp_path / "kubectl"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    assert not kubectl_setup.usable(str(broken))


def test_a_usable_kubectl_in_bin_dir_means_require_and_no_download(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(tmp_path, "31")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(kubectl_setup, "install", lambda _: pytest.fail("downloaded"))
    assert kubectl_setup.main([str(fake.parent)]) == 0
    assert capsys.readouterr().out.strip() == "1"


def test_no_arguments_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl_setup.main([]) == 2
    assert "BIN_DIR" in capsys.readouterr().err
