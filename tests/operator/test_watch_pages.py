"""The operator's watches of its owned kinds select a label anyone may copy onto their own
ConfigMaps, Services and Deployments (``watch_only_managed``). A tenant's big objects
with that label must not make the shared operator hold them all at once: kopf's first
list (and each list again after a watch's 410) is read in pages of ``WATCH_PAGE``, and
a kopf worker done with an object's event lets its body go within ``WORKER_IDLE_S``
rather than kopf's 5 s (docs/benchmarks.md: 800 ConfigMaps of 0.9 MB, 2170 -> 211 MiB).
"""

from __future__ import annotations

import kopf

from slopilot.operator.handlers import OWNED_KINDS
from slopilot.operator.owned_meta import MANAGED
from slopilot.operator.settings import WATCH_PAGE, WORKER_IDLE_S, configure
from tests.operator.operator_support import NS, Cluster, operator, wait_for
from tests.support.kube_server import RunningEmulator

JUNK = 3 * 20 + 7  # more than a page of them, at any WATCH_PAGE up to 20
SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())


def test_a_tenants_labelled_objects_are_listed_a_page_at_a_time(
        kube_login: RunningEmulator, cluster: Cluster) -> None:
    blob = "x" * 20_000
    for i in range(JUNK):
        cluster.core.create_namespaced_config_map(NS, {"metadata": {
            "name": f"junk-{i}", "labels": dict(MANAGED)}, "data": {"k": blob}})
    emulator = kube_login.emulator
    with operator(kube_login):
        # Every junk ConfigMap read: the first list is over (the watch opened after it).
        wait_for(lambda: sum(n for plural, sel, _, n in emulator.lists
                             if plural == "configmaps" and sel == SELECTOR) >= JUNK
                 and ("configmaps", SELECTOR) in emulator.watches,
                 what="the operator's list of the labelled ConfigMaps, and its watch")
    owned = {kind[-1] for kind in OWNED_KINDS}
    lists = [entry for entry in emulator.lists if entry[0] in owned]
    assert lists, emulator.lists
    for plural, selector, limit, items in lists:
        assert limit == str(WATCH_PAGE), (plural, selector, limit)
        assert items <= WATCH_PAGE, (plural, items)


def test_the_settings_page_the_lists_and_let_idle_bodies_go() -> None:
    settings = kopf.OperatorSettings()
    configure(settings)
    assert settings.watching.chunk_size == WATCH_PAGE
    assert settings.queueing.idle_timeout == WORKER_IDLE_S
    # A page of the largest objects etcd takes (about 1.5 MiB) at most 30 MiB.
    assert 1 <= WATCH_PAGE <= 20
    assert WORKER_IDLE_S <= 0.5
