"""The images the operator runs: each backend's engine where the CR names none, and the meter.

The shipped defaults, which the administrator may replace (``settings.operator_images``);
a CR may name its engine's image, never the meter's.
"""

from __future__ import annotations

import dataclasses

from slopilot.operator.spec import Backend

DEFAULT_IMAGES = {Backend.BUILTIN: "ghcr.io/slopilot/slopilot:0.1.0",
                  Backend.VLLM: "vllm/vllm-openai:v0.11.0"}
"""The shipped default engine image of each backend (``Images`` holds the ones used)."""
METER_IMAGE = DEFAULT_IMAGES[Backend.BUILTIN]
"""The shipped meter image. The meter is the operator's code in the operator's image,
chosen by the operator: the image allow-list (``policy.policy_problems``) judges only the
image a tenant asks for."""


@dataclasses.dataclass(frozen=True)
class Images:
    """The images the operator picks: the meter's, and each backend's engine where the CR
    names none. The administrator's (``settings.operator_images``: an air-gapped cluster
    runs mirrors), else the shipped ones; never a CR's, since the meter judges its own
    tenant's goodput."""

    meter: str = METER_IMAGE
    builtin: str = DEFAULT_IMAGES[Backend.BUILTIN]
    vllm: str = DEFAULT_IMAGES[Backend.VLLM]

    def engine(self, backend: Backend) -> str:
        """``backend``'s default engine image."""
        return {Backend.BUILTIN: self.builtin, Backend.VLLM: self.vllm}[backend]


SHIPPED_IMAGES = Images()
