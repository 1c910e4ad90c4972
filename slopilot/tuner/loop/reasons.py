"""The ``reason`` label of ``slopilot_tuner_actions_total``: a closed vocabulary.

A decision's reason is free text for people (logs, events, status), and its first word
says what kind of reason it is (``scale_up 1->2: alert ...``, ``restore_failed: ...``).
The label takes that word only where it is one the controller writes, with an action it
writes it with (``WRITTEN_WITH``); any other text is ``other``. So a word nobody listed
here (an alert's name, a config value, an exception's text, a user-written name put
first) makes no series of its own: one operator serves every tenant's series from one
page, sized per CR (docs/operations.md, "Scrape limits"), and a label without a bound
could push that page past its sample limit and blank every tenant's rows at once.

``tests/tuner/test_reason_words.py`` reads the controller's source and follows every
reason it counts back to the word written first: each must be here, with its action, and
nothing here may be unused. A reason kind added to the loop therefore fails that test
until it is listed, and the operator's scrape-limit figure grows with this table
(``tests/operator/test_operator_metrics_size.py``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping

from slopilot.tuner.loop.decision import Action

_WORD = re.compile(r"[a-z0-9_]+")

_HOLD, _INFORM, _RETUNE, _REVERT = Action.HOLD, Action.INFORM, Action.RETUNE, Action.REVERT


class Reason(enum.StrEnum):
    """The words the controller writes first in a counted decision's reason."""

    ALERT = "alert"  # the alerts that asked (retune), hold it, or are said (inform)
    CAPACITY_SUFFICES = "capacity_suffices"
    COMMIT = "commit"
    COMMIT_REVERTED = "commit_reverted"  # its rollout stuck
    CONFIG_REFUSED = "config_refused"
    CONFIRMING = "confirming"  # a trial near its limit, measured once more
    ERROR = "error"  # the tick failed: rolled back
    MAX_REPLICAS = "max_replicas"
    NOTHING_MEASURED = "nothing_measured"
    OUTSIDE_SPACE = "outside_space"  # a running trial the search space no longer holds
    PROMETHEUS_UNAVAILABLE = "prometheus_unavailable"
    REPLICA_PLATEAU = "replica_plateau"  # no count holds, and more do not move it
    REPLICA_RESTARTED = "replica_restarted"
    REPLICAS_NOT_READY = "replicas_not_ready"
    RESTORE_FAILED = "restore_failed"
    RESTORE_REFUSED = "restore_refused"
    RESTORED = "restored"
    RETUNE_SUFFICES = "retune_suffices"
    ROLLBACK_FAILED = "rollback_failed"
    ROLLOUT_STUCK = "rollout_stuck"
    SCALE_DOWN = "scale_down"
    SCALE_UP = "scale_up"
    SCALE_UP_HELD = "scale_up_held"  # the last scale-up's replicas never served
    SLO_BREACH = "slo_breach"
    TOO_LITTLE_TRAFFIC = "too_little_traffic"
    TRIAL = "trial"
    TRIAL_RATE_LIMIT = "trial_rate_limit"
    WINDOW_REJECTED = "window_rejected"
    OTHER = "other"
    """Any text not written by the controller with this action."""


WRITTEN_WITH: Mapping[Reason, frozenset[Action]] = {
    Reason.ALERT: frozenset({_HOLD, _INFORM, _RETUNE}),
    Reason.CAPACITY_SUFFICES: frozenset({_RETUNE}),
    Reason.COMMIT: frozenset({Action.COMMIT}),
    Reason.COMMIT_REVERTED: frozenset({_REVERT}),
    Reason.CONFIG_REFUSED: frozenset({_REVERT}),
    Reason.CONFIRMING: frozenset({Action.REPEAT}),
    Reason.ERROR: frozenset({_REVERT}),
    Reason.MAX_REPLICAS: frozenset({_INFORM, _RETUNE}),
    Reason.NOTHING_MEASURED: frozenset({_HOLD}),
    Reason.OUTSIDE_SPACE: frozenset({_REVERT}),
    Reason.PROMETHEUS_UNAVAILABLE: frozenset({_HOLD, _REVERT}),
    Reason.REPLICA_PLATEAU: frozenset({_INFORM}),
    Reason.REPLICA_RESTARTED: frozenset({_REVERT}),
    Reason.REPLICAS_NOT_READY: frozenset({_INFORM}),
    Reason.RESTORE_FAILED: frozenset({_REVERT}),
    Reason.RESTORE_REFUSED: frozenset({_REVERT}),
    Reason.RESTORED: frozenset({_REVERT}),
    Reason.RETUNE_SUFFICES: frozenset({_RETUNE}),
    Reason.ROLLBACK_FAILED: frozenset({_REVERT}),
    Reason.ROLLOUT_STUCK: frozenset({_REVERT}),
    Reason.SCALE_DOWN: frozenset({Action.SCALE}),
    Reason.SCALE_UP: frozenset({Action.SCALE}),
    Reason.SCALE_UP_HELD: frozenset({_INFORM}),
    Reason.SLO_BREACH: frozenset({_REVERT}),
    Reason.TOO_LITTLE_TRAFFIC: frozenset({_HOLD, _REVERT}),
    Reason.TRIAL: frozenset({Action.TRIAL}),
    Reason.TRIAL_RATE_LIMIT: frozenset({_HOLD}),
    Reason.WINDOW_REJECTED: frozenset({Action.REPEAT, _REVERT}),
}
"""The actions each word is counted with (``Action.NONE`` is never counted)."""

_WORDS = frozenset(WRITTEN_WITH)

COUNTED_ACTIONS = frozenset(Action) - {Action.NONE}
LABEL_PAIRS = frozenset({(a, r) for r, actions in WRITTEN_WITH.items() for a in actions}
                        | {(a, Reason.OTHER) for a in COUNTED_ACTIONS})
"""Every (action, reason) label pair one deployment's counter can carry: the table's,
and ``other`` for each action. What the operator's page is sized from."""


def first_word(text: str) -> str:
    """The lower-cased first ``[a-z0-9_]+`` word of ``text``; "" when it starts with
    none."""
    match = _WORD.match(text.lower())
    return match.group(0) if match else ""


def reason_token(reason: str, action: Action | None = None) -> Reason:
    """The label value of a decision's ``reason``: its first word where that is one the
    controller writes (with ``action``, when given), else ``other``."""
    word = first_word(reason)
    if word not in _WORDS:
        return Reason.OTHER
    token = Reason(word)
    if action is not None and action not in WRITTEN_WITH[token]:
        return Reason.OTHER
    return token
