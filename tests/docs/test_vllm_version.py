"""The vLLM the docs were checked against is the vLLM the operator runs.

docs/architecture.md's table of the ``vllm:*`` series says where vLLM observes each, and
the rules, alerts and dashboards read them so; vLLM moved some between releases (0.11
counts a prefix-cache lookup each time its scheduler looks a waiting request up, later
releases once at admission). A table checked against one release beside an image pinned
to another read the pods' series wrong, and said nothing of it. So every "checked
against vLLM ..." in the docs names the tag ``images.DEFAULT_IMAGES`` pins.
"""

from __future__ import annotations

import re

from slopilot.operator.images import DEFAULT_IMAGES
from slopilot.operator.spec import Backend
from tests.docs.test_doc_references import DOCS, ROOT

CHECKED = re.compile(r"checked\s+against\s+vLLM\s+v?(\d+\.\d+(?:\.\d+)?)", re.IGNORECASE)


def _pinned() -> str:
    image = DEFAULT_IMAGES[Backend.VLLM]
    tag = image.rpartition(":")[2]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), f"{image}: no release tag to check against"
    return tag.removeprefix("v")


def test_the_docs_name_the_pinned_vllm_as_the_one_they_were_checked_against() -> None:
    pinned = _pinned()
    found = {(doc.relative_to(ROOT).as_posix(), m.group(1))
             for doc in DOCS for m in CHECKED.finditer(doc.read_text())}
    assert ("docs/architecture.md", pinned) in found, \
        f"docs/architecture.md names no 'checked against vLLM {pinned}'"
    # "0.11" agrees with 0.11.0; "0.1" and "0.11.1" do not.
    wrong = sorted((doc, version) for doc, version in found
                   if version.split(".") != pinned.split(".")[:version.count(".") + 1])
    assert wrong == [], f"the operator pins vLLM {pinned} (slopilot/operator/images.py)"


def test_the_operations_guide_names_the_pinned_image() -> None:
    """Where it tells an administrator which vLLM image runs by default."""
    assert DEFAULT_IMAGES[Backend.VLLM] in (ROOT / "docs" / "operations.md").read_text()
