"""The last-level cache size that places the decode_spill knee."""

from __future__ import annotations

from pathlib import Path

from slopilot.engine.device_cache import cpu_cache_bytes, kv_bytes_per_layer_token


def _index(root: Path, i: int, level: int, kind: str, size: str) -> None:
    d = root / f"index{i}"
    d.mkdir(parents=True)
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")


def test_the_highest_level_data_or_unified_cache(tmp_path: Path) -> None:
    _index(tmp_path, 0, 1, "Data", "32K")
    _index(tmp_path, 1, 1, "Instruction", "32K")
    _index(tmp_path, 2, 2, "Unified", "512K")
    _index(tmp_path, 3, 3, "Unified", "32768K")
    assert cpu_cache_bytes(tmp_path) == 32 * 1024 ** 2


def test_an_unreadable_tree_gives_no_cache(tmp_path: Path) -> None:
    assert cpu_cache_bytes(tmp_path / "missing") is None
    _index(tmp_path, 0, 3, "Unified", "lots")
    _index(tmp_path, 1, 2, "Instruction", "1M")
    assert cpu_cache_bytes(tmp_path) is None


def test_kv_bytes_per_layer_token_from_a_paged_block() -> None:
    # SmolLM2-135M, float32, 16-token blocks: 30 layers x 16 x 1536 bytes per block.
    assert kv_bytes_per_layer_token(30 * 16 * 1536, 16, 30) == 1536
