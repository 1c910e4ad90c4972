"""What a deployment's loop last ran on (``RanOn``), handed from the controller's build
(``loop_status.rebase_episode``) to the study's open (``daemon.open_deployment_study``).

Two things the open needs it for: a study made before targets were recorded in it is
the one its trials ran on, which the loop's state (or the committed config's stamp)
says, not whatever the spec runs when tuning first opens it after the upgrade; and a
trial a switch ended is told failed in that study, the switch its reason, rather than
left to go stale there once nothing beats for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from slopilot.tuner.study.study_family import LeftTrial
from slopilot.tuner.study.study_target import StudyTarget


@dataclass(frozen=True)
class RanOn:
    """The backend and model the loop last ran on, and the trial a switch away ended."""

    target: StudyTarget
    """``status.controller.target``, else ``status.tunedConfig``'s stamp."""
    trial: LeftTrial | None = None
    """The trial the switch ended (``engine_switched``), asked in ``target``'s study (the
    one it names, where the state kept it); None: no switch, or none was running."""
    reason: str = ""
    """Why it ended, recorded as its ``fail_reason``."""
