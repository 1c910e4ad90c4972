"""A tenant's cost profile ConfigMap, fuzzed: whatever it holds, the twin either runs on
it with finite, positive step times or refuses it with a message, never a traceback.

The profile is the one input the operator parses from a tenant's own object with numbers
the controller then plans with (scale-ups, warm starts): a NaN or a negative time per
token that got through would size the fleet from nonsense. Each example takes a valid
profile and replaces some of its leaves (any YAML value, NaN and infinities included)
or drops them.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slopilot.engine.sim.profile_file import profile_to_dict
from slopilot.engine.sim.scenario import load_scenario
from slopilot.engine.sim.simulator import simulate
from slopilot.operator.spec import parse_spec
from slopilot.operator.twin_profile import TwinChoice, _parse
from slopilot.operator.twin_spec import ProfileRef
from tests.support.profiles import make_profile

_VALID = profile_to_dict(make_profile(executor_code=""))
_SPEC = parse_spec({"metadata": {"name": "chat", "namespace": "team"},
                    "spec": {"model": {"name": "llama-3-8b"}, "resources": {"gpu": 1}}})
_REF = ProfileRef("profile", "profile.yaml")
_SOURCE = _REF.where("team")


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in [(*path, k), *_paths(v, (*path, k))]]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in [(*path, i), *_paths(v, (*path, i))]]
    return []


_PATHS = _paths(_VALID)

_SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
            | st.text(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                       max_leaves=6)


@st.composite
def profiles(draw: st.DrawFn) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(_VALID))
    for i in draw(st.lists(st.integers(0, len(_PATHS) - 1), min_size=1, max_size=4)):
        *parents, key = _PATHS[i]
        node = doc
        try:
            for p in parents:
                node = node[p]
            if draw(st.booleans()):
                value = draw(_VALUES)
            else:  # a number near the one there: the likeliest slip, and the subtlest
                value = draw(st.floats(-1e3, 1e3) | st.sampled_from(
                    [0, 0.0, -0.0, 1e-300, 1e300, math.nan, math.inf, -math.inf]))
            if draw(st.integers(0, 9)) == 0 and isinstance(node, dict):
                del node[key]
            else:
                node[key] = value
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit replaced a parent
    return doc


@given(profiles())
@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_a_tenants_profile_runs_finite_or_is_refused(doc: dict[str, Any]) -> None:
    text = yaml.safe_dump(doc)
    choice = _parse({"data": {_REF.key: text}}, _REF, _SOURCE, "1", _SPEC, labelled=True,
                    namespace="team")
    assert isinstance(choice, TwinChoice)
    if choice.profile is None:
        assert choice.problem and _SOURCE in choice.problem
        return
    scenario = choice.apply(load_scenario("tiny-cpu"))
    run = simulate(scenario, duration_s=2.0, seed=0)
    summary = run.summary
    for cls in summary.classes.values():
        for figure in (cls.throughput_tok_s, cls.goodput_tok_s, cls.ttft_p99_ms,
                       cls.tbt_p99_ms):
            assert figure is None or (math.isfinite(figure) and figure >= 0), (figure, text)
    assert summary.busy_ratio is None or 0 <= summary.busy_ratio <= 1
