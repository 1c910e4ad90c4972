"""LocalDeployment: real ``slopilot serve`` processes, the targets file, admin calls."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import httpx
import pytest

from slopilot.engine.config import ConfigError
from slopilot.tuner.local.deployment import DeploymentError, LocalDeployment
from tests.support.waits import HANG_GUARD_S


def _targets(dep: LocalDeployment) -> dict[str, list[str]]:
    groups = json.loads(dep.targets_file.read_text())
    assert all(g["labels"]["slopilot_deployment"] == "t" for g in groups)
    return {g["labels"]["instance_role"]: g["targets"] for g in groups}


@pytest.mark.slow
def test_replicas_targets_configs_scaling_and_a_clean_stop(tmp_path: Path) -> None:
    with LocalDeployment("t", tmp_path, replicas=2, max_replicas=3, ready_timeout_s=HANG_GUARD_S,
                         knobs={"token_budget": 2048, "chunk_size": 2048}) as dep:
        urls = dep.endpoints()
        assert dep.replicas() == 2 and len(set(urls)) == 2
        assert _targets(dep) == {"canary": [urls[0].removeprefix("http://")],
                                 "stable": [urls[1].removeprefix("http://")]}
        assert dep.current_config()["token_budget"] == 2048
        # The token is not on the command line and an unauthenticated PUT is refused.
        assert dep.token not in " ".join(dep._command(1))
        assert httpx.put(urls[0] + "/admin/config", json={"token_budget": 512}).status_code == 401
        assert httpx.get(urls[0] + "/admin/config").status_code == 401  # GET too
        auth = {"Authorization": f"Bearer {dep.token}"}
        dep.apply_config({"token_budget": 512, "chunk_size": 512}, canary=True)
        assert httpx.get(urls[0] + "/admin/config", headers=auth).json()["token_budget"] == 512
        assert dep.current_config()["token_budget"] == 2048  # the stable replica kept it
        assert dep.committed_config()["token_budget"] == 2048
        with pytest.raises(ConfigError, match="token_budget"):
            dep.apply_config({"token_budget": -1}, canary=False)
        dep.apply_config({"token_budget": 1024, "chunk_size": 512}, canary=False)
        dep.scale(3)  # a new replica starts with the stable config
        assert dep.replicas() == 3 and len(_targets(dep)["stable"]) == 2
        assert httpx.get(dep.endpoints()[2] + "/admin/config",
                         headers=auth).json()["token_budget"] == 1024
        assert dep.committed_config()["token_budget"] == 1024
        dep.apply_config({"token_budget": 768, "chunk_size": 256}, canary=False, trial=True)
        assert dep.current_config()["token_budget"] == 768  # a trial on every replica,
        assert dep.committed_config()["token_budget"] == 1024  # not committed
        dep.scale(1)  # stops the newest; the canary stays
        assert dep.endpoints() == urls[:1] and "stable" not in _targets(dep)
        with pytest.raises(ValueError, match="max_replicas=3"):
            dep.scale(4)
        processes = [r.process for r in dep._active + dep._stopping]
    assert all(p.poll() is not None for p in processes)
    assert json.loads(dep.targets_file.read_text()) == []


def test_a_replica_that_cannot_start_is_reported_and_nothing_is_left(tmp_path: Path) -> None:
    # However long it may take to answer, a replica that exited fails the start at once:
    # "exited with", not the ready timeout's "not healthy within".
    dep = LocalDeployment("t", tmp_path, replicas=2, scenario="no-such-scenario",
                          ready_timeout_s=HANG_GUARD_S)
    with pytest.raises(DeploymentError, match="exited with"):
        dep.start()
    assert dep.replicas() == 0 and all(r.process.poll() is not None for r in dep._stopping)


class _Silent(LocalDeployment):
    """Replicas that run and never answer /health."""

    def _command(self, port: int) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(3600)"]


def test_a_replica_that_never_answers_fails_at_the_ready_timeout_it_was_given(
        tmp_path: Path) -> None:
    dep = _Silent("t", tmp_path, replicas=1, ready_timeout_s=0.01)
    with pytest.raises(DeploymentError, match=r"not healthy within 0.01 s \(ready_timeout_s"):
        dep.start()
    assert dep.replicas() == 0 and all(r.process.poll() is not None for r in dep._stopping)


def test_torch_replicas_serve_with_the_kernels_asked_for(tmp_path: Path) -> None:
    dep = LocalDeployment("t", tmp_path, executor="torch", model="tiny-random",
                          cpu_kernels="torch")
    cmd = dep._command(1)
    assert cmd[cmd.index("--cpu-kernels") + 1] == "torch"
    # The simulated executor has no CPU kernels to choose.
    assert "--cpu-kernels" not in LocalDeployment("s", tmp_path)._command(1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"replicas": 0}, "1 <= replicas"),
    ({"executor": "gpu"}, "executor='gpu'"),
    ({"executor": "torch", "cpu_kernels": "fast"}, "cpu_kernels='fast'.*auto, native, torch"),
    ({"knobs": {"chunk_sizes": 1}}, "unknown knob 'chunk_sizes'"),
    ({"ready_timeout_s": 0}, r"ready_timeout_s=0: expected seconds > 0"),
    ({"ready_timeout_s": math.inf}, r"ready_timeout_s=inf: expected seconds > 0"),
    ({"ready_timeout_s": math.nan}, r"ready_timeout_s=nan: expected seconds > 0"),
    ({"drain_timeout_s": -1}, r"drain_timeout_s=-1: expected seconds >= 0"),
])
def test_bad_arguments_are_refused_before_any_process_starts(
        tmp_path: Path, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, ConfigError), match=message):
        LocalDeployment("t", tmp_path, **kwargs)  # type: ignore[arg-type]


def test_the_replicas_judge_each_request_by_the_deployments_slo(tmp_path: Path) -> None:
    """The demo's goodput is the replicas' own per-request verdicts (as the rules read
    them): a replica, the first and any one scaled up, starts with the deployment's SLO."""
    from slopilot.engine.slo import SLOSpec

    slo = SLOSpec.from_dict({"profile": "strict", "classes": {"p1": {"tbtP99Ms": 70}}})
    with LocalDeployment("t", tmp_path, replicas=1, max_replicas=2, slo=slo,
                         ready_timeout_s=HANG_GUARD_S) as dep:
        auth = {"Authorization": f"Bearer {dep.token}"}
        dep.scale(2)
        for url in dep.endpoints():
            assert httpx.get(url + "/admin/slo", headers=auth).json() == slo.to_dict()
