"""What a study's trials were run on (``StudyTarget``: the backend and the model), kept in
the study's user attributes; ``study_family.py`` goes on in a successor study where it
changes. No Optuna import: the operator's spec parse reads targets too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import optuna

TARGET_ATTR = "slopilot.target"
"""The study's user attribute recording its ``StudyTarget``."""


@dataclass(frozen=True)
class StudyTarget:
    """What a study's trials were run on: ``backend`` (builtin or vllm) and ``model``
    (the model the engine loads)."""

    backend: str
    model: str

    def describe(self) -> str:
        return f"backend {self.backend}, model {self.model!r}"

    @classmethod
    def recorded(cls, attrs: Mapping[str, Any]) -> StudyTarget | None:
        """The target a study's user attributes record; None where they record none."""
        found = attrs.get(TARGET_ATTR)
        if not isinstance(found, Mapping) or not isinstance(found.get("backend"), str) \
                or not isinstance(found.get("model"), str):
            return None
        return cls(found["backend"], found["model"])

    def fields(self) -> dict[str, str]:
        """As a study's attribute and ``status.tunedConfig`` record it."""
        return {"backend": self.backend, "model": self.model}

    @property
    def key(self) -> str:
        """``builtin/<model>``: as the loop's state keeps it (``LoopState.target``)."""
        return f"{self.backend}/{self.model}"

    @classmethod
    def from_key(cls, key: str) -> StudyTarget:
        """The target ``key`` names (a backend holds no ``/``; a model may)."""
        backend, _, model = key.partition("/")
        return cls(backend, model)

    def record(self, study: optuna.Study) -> None:
        study.set_user_attr(TARGET_ATTR, self.fields())
