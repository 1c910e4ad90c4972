"""Named scenarios: hardware, model, engine knobs, workload and SLO in one YAML file.

The shipped scenarios live in ``slopilot/data/scenarios`` (the one copy: an installed
package has them, and ``scenarios/`` at the repository root only points there). Any other
YAML file can be loaded by path. GPU and model names are kept as strings; the simulator
looks them up in its profiles, so this module stays free of cost-model imports. The
hardware may instead be a calibrated profile (``profile: FILE``, relative to the
scenario's file): it is read here, as plain data, and must be for the scenario's model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from slopilot.engine.bounded_read import FileTooLarge, read_bounded
from slopilot.engine.config import ConfigError, EngineConfig
from slopilot.engine.read_errors import unreadable
from slopilot.engine.sim.dispatch import DEFAULT_DISPATCH, Dispatch, parse_dispatch
from slopilot.engine.sim.profile_file import (
    CostProfile,
    ProfileFileError,
    check_profile_for,
    load_profile,
)
from slopilot.engine.sim.profiles import ProfileError, get_gpu, get_model
from slopilot.engine.sim.spec_reader import MAX_TEXT, Reader, ScenarioError, did_you_mean
from slopilot.engine.sim.workload import Workload
from slopilot.engine.sim.workload_spec import WorkloadSpec, parse_workload
from slopilot.engine.sim.yaml_load import (
    YAMLDuplicateKeyError,
    YAMLValueError,
    safe_load_bounded,
)
from slopilot.engine.slo import SLOError, SLOSpec

__all__ = ["SLOSpec", "Scenario", "ScenarioError", "list_scenarios",
           "load_scenario", "parse_scenario", "scenario_file"]

_PACKAGED = ("data", "scenarios")
MAX_SCENARIO_BYTES = 1 << 20
"""A scenario is a few KiB of YAML; past a MiB it is the wrong file, read whole."""
_TRACE_SUFFIXES = (".csv", ".jsonl")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpu: str  # GPU profile name, e.g. "H800"
    num_gpus: int
    tp: int  # tensor-parallel degree; num_gpus / tp replicas
    model: str  # model profile name, e.g. "deepseek-67b"
    duration_s: float
    seed: int
    workload: WorkloadSpec
    engine: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    slo: SLOSpec = field(default_factory=lambda: SLOSpec.from_profile("standard"))
    gpu_memory_utilization: float | None = None
    source: str = "<dict>"
    profile: CostProfile | None = None
    """A calibrated cost profile; None runs the datasheet roofline of ``gpu``."""
    dispatch: Dispatch = DEFAULT_DISPATCH
    """How arrivals are spread over the replicas (``dispatch.py``): random by default, as
    the operator's Service does."""
    reads: tuple[Path, ...] = ()
    """The files the scenario file names that its parse read: traces (a trace workload's,
    an empirical length's, in any phase) and the profile; what no output may overwrite."""

    @property
    def replicas(self) -> int:
        return self.num_gpus // self.tp

    def engine_config(self, base: EngineConfig | None = None) -> EngineConfig:
        """``base`` (the defaults if None) with this scenario's knob overrides."""
        return (base or EngineConfig()).with_overrides(self.engine)

    def build_workload(self, *, seed: int | None = None, duration_s: float | None = None,
                       vocab_size: int | None = None) -> Workload:
        """A fresh workload (its own state) for one run; arguments override the scenario's."""
        return self.workload.build(
            seed=self.seed if seed is None else seed,
            duration_s=self.duration_s if duration_s is None else duration_s,
            vocab_size=vocab_size)


def list_scenarios() -> list[str]:
    """Names of the shipped scenarios, sorted."""
    folder = resources.files("slopilot").joinpath(*_PACKAGED)
    return sorted(f.name.removesuffix(".yaml") for f in folder.iterdir()
                  if f.name.endswith(".yaml"))


def _a_folder(text: str) -> ScenarioError:
    return ScenarioError(f"scenario file {text!r} is a folder, not a scenario file; name a "
                         ".yaml file in it")


def scenario_file(name_or_path: str | Path) -> Traversable | Path:
    """A shipped scenario by name, or a YAML file by path."""
    text = str(name_or_path)
    if text.lower().endswith(_TRACE_SUFFIXES):
        # A trace is requests, not a deployment: reading it as YAML would fail on its
        # first row and quote the file back.
        raise ScenarioError(f"{text!r} is a request trace, not a scenario; replay it with "
                            f"--trace {text} (the deployment and SLO come from --scenario)")
    if text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text:
        path = Path(name_or_path)
        if path.is_dir():
            raise _a_folder(text)
        if not path.exists():  # a device or a pipe is refused as one when read
            raise ScenarioError(f"scenario file {text!r} does not exist")
        return path
    names = list_scenarios()
    if text not in names and Path(text).is_dir():
        # Said as for ./NAME: "unknown scenario" would hide that it names a folder here.
        raise _a_folder(text)
    if text not in names:
        raise ScenarioError(f"unknown scenario {text!r}; {did_you_mean(text, names)}"
                            f"shipped: {', '.join(names)}; or pass a path to a YAML file")
    return resources.files("slopilot").joinpath(*_PACKAGED, f"{text}.yaml")


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load and validate a scenario; every error names the file, field, value and fix."""
    source = scenario_file(name_or_path)
    label = str(source) if isinstance(source, Path) else f"scenario {name_or_path}"
    try:
        data = (read_bounded(source, MAX_SCENARIO_BYTES) if isinstance(source, Path)
                else source.read_bytes())
        text = data.decode("utf-8")
    except FileTooLarge as e:
        raise ScenarioError(f"{label}: {unreadable(e)}: no scenario is that large (they "
                            "are a few KiB); check the path") from None
    except OSError as e:
        raise ScenarioError(f"{label}: cannot read the scenario: {unreadable(e)}; name a "
                            "scenario file this user can read") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{label}: cannot read the scenario: {e}; save it as UTF-8 "
                            "text") from None
    try:
        data = safe_load_bounded(text, exponents=True)
    except (YAMLValueError, YAMLDuplicateKeyError) as e:  # valid YAML the reader refuses
        raise ScenarioError(f"{label}: {e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{label}: not valid YAML: {e}") from None
    if data is None:
        raise ScenarioError(f"{label}: the file is empty (or only comments); a scenario "
                            "needs at least name, gpu, model, duration_s and workload "
                            "(scenarios/README.md shows one)")
    base_dir = source.parent if isinstance(source, Path) else Path.cwd()
    scenario = parse_scenario(data, source=label, base_dir=base_dir)
    if scenario.profile is None:
        # The datasheet roofline needs both profiles: check them here, with the file and
        # the field, not when the simulator starts (that error named neither). Here, not
        # in parse_scenario: a profiled twin's documents carry the profile's device name.
        for key, value, lookup in (("gpu", scenario.gpu, get_gpu),
                                   ("model", scenario.model, get_model)):
            try:
                lookup(value)
            except ProfileError as e:
                raise ScenarioError(f"{label}: {key}={value!r}: {e}") from None
    return scenario


def parse_scenario(data: object, *, source: str = "<dict>",
                   base_dir: Path | None = None) -> Scenario:
    """Validate an already-parsed YAML document (relative trace paths start at base_dir)."""
    r = Reader(data, source=source)
    name = r.text("name")
    description = (r.text("description", max_chars=8 * MAX_TEXT)
                   if r.raw("description", None) is not None else "")
    num_gpus = r.integer("num_gpus", 1, lo=1, hi=4096)
    tp = r.integer("tp", 1, lo=1, hi=64)
    if num_gpus % tp:
        raise r.error("tp", tp, f"num_gpus={num_gpus} is not a multiple of it; "
                      "use a tp that divides num_gpus")
    raw_engine = r.raw("engine", None) or {}
    if not isinstance(raw_engine, Mapping):
        raise r.error("engine", raw_engine, "expected a mapping of knob: value")
    engine = dict(raw_engine)
    try:
        EngineConfig().with_overrides(engine)
    except ConfigError as e:
        raise ScenarioError(f"{source}: engine: {e}") from None
    model = r.text("model")
    profile = _profile(r, base_dir or Path.cwd(), model, tp)
    gpu = r.text("gpu") if profile is None else r.text("gpu", profile.device.name)
    scenario = Scenario(
        name=name, description=description, gpu=gpu, num_gpus=num_gpus, tp=tp,
        model=model, profile=profile,
        duration_s=r.number("duration_s", lo=0.0, lo_open=True),
        seed=r.integer("seed", 0, lo=0, hi=2**63 - 1),
        workload=parse_workload(r.section("workload"), base_dir=base_dir or Path.cwd()),
        engine=MappingProxyType(engine), slo=_slo(r),
        gpu_memory_utilization=r.optional_float("gpu_memory_utilization", lo=0.0, hi=1.0,
                                                lo_open=True),
        dispatch=_dispatch(r),
        source=source)
    r.finish()
    return dataclasses.replace(scenario, reads=tuple(r.files))


def _profile(r: Reader, base_dir: Path, model: str, tp: int) -> CostProfile | None:
    raw = r.raw("profile", None)
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise r.error("profile", raw, "expected the path of a calibrated profile file")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    try:
        profile = load_profile(path)
        check_profile_for(profile, model=model, tp=tp)
    except ProfileFileError as e:
        raise ScenarioError(f"{r.source}: profile: {e}") from None
    r.files.append(path)
    return profile


def _dispatch(r: Reader) -> Dispatch:
    raw = r.raw("dispatch", DEFAULT_DISPATCH.value)
    try:
        return parse_dispatch(raw)
    except ValueError as e:
        raise r.error("dispatch", raw, str(e)) from None


def _slo(r: Reader) -> SLOSpec:
    data = r.raw("slo", None)
    if data is None:
        return SLOSpec.from_profile("standard")
    if not isinstance(data, Mapping):
        raise r.error("slo", data, "expected a mapping of profile, classes, "
                      "max_preemptions_per_min and prefix_hit_min")
    try:
        return SLOSpec.from_dict(data)
    except SLOError as e:
        # from_dict names the field inside the mapping (classes.p0.ttft_p99_ms=-3: ...),
        # or the mapping itself for a stray key: quoting the mapping too buried the field.
        inside = str(e).startswith(("profile", "classes", "max_preemptions_per_min",
                                    "prefix_hit_min"))
        raise ScenarioError(f"{r.source}: {r.qualify('slo')}{'.' if inside else ': '}{e}") \
            from None
