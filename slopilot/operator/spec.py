"""Typed LLMDeployment spec and ``parse_spec``: the checks the CRD schema cannot make.

The apiserver refuses what the openAPIV3Schema forbids; what is left here are
cross-field rules (and a second look at types, for objects that reached the handler by
another road). All problems are collected, each naming the field and the fix, so that
the handler can put them in one status condition.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slopilot.engine.clients import ClientClasses
from slopilot.engine.config import EngineConfig
from slopilot.engine.slo import SLOError, SLOSpec
from slopilot.operator.alert_spec import (
    ALERT_FIELDS,
    DURATION_FIELDS,
    INTEGER_FIELDS,
    alert_options,
    unreachable_rows,
)
from slopilot.operator.clients_spec import parse_clients
from slopilot.operator.connections_spec import parse_connections
from slopilot.operator.knobs import (
    VLLM_APPLIES,
    VLLM_DEFAULT_BACKEND_BLOCK_MULTIPLE,
    TuningSpec,
    engine_config,
    spec_path,
    tuned_config,
    tuned_left_behind,
    tuning_section,
    vllm_block_size_problem,
)
from slopilot.operator.model_source import (
    ModelVolume,
    TokenSecret,
    parse_token_secret,
    parse_volume,
)
from slopilot.operator.scheduling import Scheduling, parse_scheduling
from slopilot.operator.spec_reader import SpecReader
from slopilot.operator.twin_spec import TwinSpec, parse_twin
from slopilot.operator.validation import model_ref_problem, prometheus_url_problem
from slopilot.tuner.prometheus.rules import BUILTIN_LATENCY, VLLM_LATENCY, RuleOptions


class Backend(enum.StrEnum):
    BUILTIN = "builtin"
    VLLM = "vllm"


class Profile(enum.StrEnum):
    STRICT = "strict"
    STANDARD = "standard"
    RELAXED = "relaxed"


class Phase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    TUNING = "Tuning"
    SCALING = "Scaling"
    DEGRADED = "Degraded"
    INVALID = "Invalid"


BACKENDS = tuple(b.value for b in Backend)
PROFILES = tuple(p.value for p in Profile)
PHASES = tuple(p.value for p in Phase)

# The most replicas one LLMDeployment may scale to. The capacity search simulates up to
# this many replicas in the operator's simulator worker; a bound keeps one tenant's search
# within seconds and a few hundred MB (512 replicas took 39 s and 1.1 GB).
MAX_REPLICAS = 64
MAX_GPUS = 64
STARTUP_TIMEOUT_S = 600.0
"""How long a pod may take to start (its startup probe's budget) where
``spec.model.startupTimeout`` says nothing: a small model's download and load."""
MIN_STARTUP_TIMEOUT_S = 60.0
MAX_STARTUP_TIMEOUT_S = 7200.0
"""Long enough for a 70B checkpoint's download and load on a slow link; past it a pod
that hangs at start is restarted only after hours."""


class SpecError(ValueError):
    """An LLMDeployment spec the handler refuses; ``problems`` lists each bad field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LLMDeploymentSpec:
    backend: Backend
    model_name: str
    model_path: str | None
    image: str | None
    min_replicas: int
    max_replicas: int
    gpu: int
    cpu: str | None
    memory: str | None
    engine: EngineConfig  # what it runs: the spec's knobs, or the tuned config over them
    explicit_knobs: frozenset[str]  # EngineConfig fields the user set (not from the preset)
    slo: SLOSpec
    tuning: TuningSpec
    prometheus_url: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    vllm_class: str = "p0"
    """The class all of a vLLM deployment's requests count as: vLLM's metrics do not say
    which request had which priority. P0 by default: the class the alerts and the
    trials' revert guardrail protect."""
    alerts: RuleOptions = field(default_factory=RuleOptions)
    """The alert table's thresholds and holds (``spec.alerts``; the seeds' by default)."""
    twin: TwinSpec = field(default_factory=TwinSpec)
    """``spec.twin``: the controller's twin, its profile (a ConfigMap of the CR's
    namespace; None: the datasheet roofline), error bound and correction (twin_spec.py)."""
    clients: ClientClasses | None = None
    """``spec.clients``: the classes each API key may name (clients_spec.py); None: any
    request names any class. The built-in engine's only."""
    model_volume: ModelVolume | None = None
    """``spec.model.volume``: the claim mounted read-only at /models (model_source.py)."""
    token_secret: TokenSecret | None = None
    """``spec.model.tokenSecret``: vLLM's hub token, from a Secret of the namespace."""
    connections: Mapping[str, float] = field(default_factory=dict)
    """``spec.connections``: the server's deadlines given, in seconds by ``Deadlines``
    field, and its connection cap (``max_connections``) if given (connections_spec.py);
    the server's defaults for the rest."""
    ephemeral_storage: str | None = None
    """``spec.resources.ephemeralStorage``: the engine container's ephemeral-storage request
    and limit, which bounds all the pod writes to its node (/cache, where vLLM downloads
    the model, /tmp, logs); None: as the namespace's LimitRange says, else unbounded."""
    scheduling: Scheduling = field(default_factory=Scheduling)
    """``spec.scheduling``: the pods' node selector, tolerations and priority class
    (scheduling.py; the operator's policy judges the last two)."""
    startup_timeout_s: float = STARTUP_TIMEOUT_S
    """``spec.model.startupTimeout``: how long a pod may take to start (download and load
    its model) before the kubelet restarts it: the engine's startup probe's budget."""
    warnings: tuple[str, ...] = ()
    """What the spec does that still works but should change (a deprecated field), each
    naming the field and the fix; the operator posts them as Warning events."""

    @property
    def model_ref(self) -> str:
        """What the engine loads: the mounted path when given, else the name."""
        return self.model_path or self.model_name


VLLM_CLASSES = ("p0", "p1", "p2")


def _slo(spec: Mapping[str, Any], profile: Profile, r: SpecReader) -> SLOSpec:
    """The shared SLOSpec (slopilot.engine.slo) from ``spec.slo``, plus the class-order rule."""
    given = spec.get("slo")
    data = dict(given) if isinstance(given, Mapping) else {}
    data["profile"] = profile.value  # already judged (and defaulted) by the caller
    data.pop("vllmClass", None)  # not an objective: parse_spec reads it
    hit = data.get("prefixHitMin")
    if hit is not None and (isinstance(hit, bool) or not isinstance(hit, (int, float))
                            or not 0 < hit <= 1):
        r.problems.append(f"spec.slo.prefixHitMin={hit!r}: expected a ratio in (0, 1] "
                          "(e.g. 0.95), or leave it out where prefix caching is not expected")
        data.pop("prefixHitMin")
    try:
        slo = SLOSpec.from_dict(data)
    except SLOError as exc:
        r.problems.append(f"spec.slo.{exc}: fix or remove that field")
        return SLOSpec.from_profile(profile.value)
    targeted = [(p.label, c) for p, c in slo.classes().items() if not c.best_effort]
    for (hi, tight), (lo, loose) in itertools.pairwise(targeted):
        for what, camel in (("ttft_p99_ms", "ttftP99Ms"), ("tbt_p99_ms", "tbtP99Ms")):
            a, b = getattr(tight, what), getattr(loose, what)
            if a is not None and b is not None and a > b:
                r.problems.append(
                    f"spec.slo.classes.{hi}.{camel}={a:g} is looser than "
                    f"{lo}.{camel}={b:g}: a higher class needs the tighter target")
    return slo


def _alerts(spec: Mapping[str, Any], r: SpecReader, warnings: list[str]) -> RuleOptions:
    """``spec.alerts`` as the alert table's RuleOptions (alert_spec.py judges them)."""
    values: dict[str, Any] = {}
    for camel in ALERT_FIELDS:
        where = f"spec.alerts.{camel}"
        if camel not in DURATION_FIELDS:
            value = r.get(spec, where, int if camel in INTEGER_FIELDS else (int, float))
            if value is not None:
                values[camel] = value
            continue
        if (got := r.duration(spec, where)) is None:
            continue
        text, seconds = got
        if not seconds.is_integer():
            r.problems.append(f"{where}={text!r}: use whole seconds (Prometheus evaluates "
                              "its rules at whole-second intervals)")
            continue
        values[camel] = int(seconds)
    options, problems = alert_options(values, warnings)
    r.problems += problems
    return options


def parse_spec(body: Mapping[str, Any]) -> LLMDeploymentSpec:
    """The typed spec of an LLMDeployment object (kopf's ``body``); SpecError lists problems.
    The checks judge the spec's knobs; ``engine`` runs ``status.tunedConfig`` over them."""
    r = SpecReader()
    spec = body.get("spec") if isinstance(body, Mapping) else None
    if not isinstance(spec, Mapping):
        raise SpecError(["spec: missing; an LLMDeployment needs at least spec.model.name"])
    backend = r.choice(spec, "spec.backend", Backend, Backend.BUILTIN)
    profile = r.choice(spec, "spec.slo.profile", Profile, Profile.STANDARD)
    name = r.get(spec, "spec.model.name", str)
    if not name:
        r.problems.append("spec.model.name: required: name the model, e.g. smollm2-135m")
    for where in ("spec.model.name", "spec.model.path"):
        if (problem := model_ref_problem(where, r.get(spec, where, str))) is not None:
            r.problems.append(problem)
    lo = r.get(spec, "spec.replicas.min", int, 1)
    hi = r.get(spec, "spec.replicas.max", int, max(lo, 1))
    if lo < 0 or hi < 1:
        r.problems.append(f"spec.replicas=[{lo}, {hi}]: need min >= 0 and max >= 1")
    elif hi > MAX_REPLICAS:
        r.problems.append(f"spec.replicas.max={hi} exceeds {MAX_REPLICAS}, the most one "
                          "LLMDeployment may have: split the traffic over several")
    elif lo > hi:
        r.problems.append(f"spec.replicas.min={lo} exceeds spec.replicas.max={hi}: "
                          "raise max or lower min")
    gpu = r.get(spec, "spec.resources.gpu", int, 0)
    if not 0 <= gpu <= MAX_GPUS:
        r.problems.append(f"spec.resources.gpu={gpu}: use 0..{MAX_GPUS} GPUs per pod")
    engine, explicit = engine_config(spec, profile.value, r.problems)
    slo = _slo(spec, profile, r)
    if slo.prefix_hit_min is not None and not engine.enable_prefix_caching:
        r.problems.append(
            f"spec.slo.prefixHitMin={slo.prefix_hit_min:g} expects prefix hits, but "
            f"{spec_path('enable_prefix_caching')} is false: the alert would always fire; "
            "enable prefix caching or remove prefixHitMin")
    warnings: list[str] = []
    alerts = _alerts(spec, r, warnings)
    running = tuned_config(body, engine)
    if (left := tuned_left_behind(body)) is not None:
        warnings.append(left)
    tuning = tuning_section(spec, engine, running,
                            VLLM_APPLIES if backend is Backend.VLLM else None, r, warnings,
                            scrape_s=alerts.max_scrape_interval_s)
    warnings += unreachable_rows(slo, alerts, VLLM_LATENCY if backend is Backend.VLLM
                                 else BUILTIN_LATENCY)
    if backend is Backend.VLLM and engine.max_num_seqs > engine.effective_budget:
        # vLLM refuses max_num_seqs above max_num_batched_tokens (v0.11.0,
        # vllm/config/scheduler.py); the pods get the budget (engine_deployment.vllm_max_num_seqs).
        warnings.append(
            f"{spec_path('max_num_seqs')}={engine.max_num_seqs} exceeds the token budget "
            f"{engine.effective_budget}, which vLLM refuses: its pods run --max-num-seqs "
            f"{engine.effective_budget}; lower maxNumSeqs or raise tokenBudget")
    if backend is Backend.VLLM:
        if (problem := vllm_block_size_problem(engine.block_size)) is not None:
            r.problems.append(problem)
        elif engine.block_size % VLLM_DEFAULT_BACKEND_BLOCK_MULTIPLE:
            warnings.append(
                f"{spec_path('block_size')}={engine.block_size}: vLLM's default attention "
                "backend on Ampere and Hopper GPUs (FlashAttention) needs a multiple of "
                f"{VLLM_DEFAULT_BACKEND_BLOCK_MULTIPLE} and fails to start with it; "
                "use 16 unless the GPUs are Blackwell")
    vllm_class = r.get(spec, "spec.slo.vllmClass", str, "p0")
    if vllm_class not in VLLM_CLASSES:
        r.problems.append(f"spec.slo.vllmClass={vllm_class!r} is not allowed; use one of: "
                          f"{', '.join(VLLM_CLASSES)}")
    url = r.get(spec, "spec.prometheus.url", str, "http://prometheus-operated.monitoring:9090")
    if (problem := prometheus_url_problem(url)) is not None:
        r.problems.append(problem)
    twin = parse_twin(spec, r.problems, warnings)
    clients = parse_clients(spec, backend is Backend.BUILTIN, r.problems)
    connections = parse_connections(spec, r)
    cpu, memory = _quantity(spec, "cpu", r), _quantity(spec, "memory", r)
    ephemeral_storage = _quantity(spec, "ephemeralStorage", r)
    model_path, image = r.get(spec, "spec.model.path", str), r.get(spec, "spec.image", str)
    raw_model = spec.get("model")
    model: Mapping[str, Any] = raw_model if isinstance(raw_model, Mapping) else {}
    volume = parse_volume(model, model_path, r.problems, warnings)
    token = parse_token_secret(model, backend is Backend.VLLM, r.problems)
    scheduling = parse_scheduling(spec, r.problems)
    startup_timeout_s = _startup_timeout(spec, r)
    if r.problems or tuning is None:  # no tuning without a problem that says why
        raise SpecError(r.problems)
    known = {"backend", "model", "image", "replicas", "resources", "engine", "slo", "tuning",
             "prometheus", "alerts", "twin", "clients", "connections", "scheduling"}
    return LLMDeploymentSpec(
        backend=backend, model_name=name, model_path=model_path,
        image=image, min_replicas=lo, max_replicas=hi, gpu=gpu,
        cpu=cpu, memory=memory, ephemeral_storage=ephemeral_storage, engine=running,
        explicit_knobs=explicit, slo=slo, tuning=tuning, prometheus_url=url,
        extra={k: v for k, v in spec.items() if k not in known}, vllm_class=vllm_class,
        alerts=alerts, twin=twin, clients=clients, connections=connections,
        model_volume=volume,
        token_secret=token, scheduling=scheduling, startup_timeout_s=startup_timeout_s,
        warnings=tuple(warnings))


def _quantity(spec: Mapping[str, Any], name: str, r: SpecReader) -> str | None:
    value = r.get(spec, f"spec.resources.{name}", (str, int, float))
    return None if value is None else str(value)



def _startup_timeout(spec: Mapping[str, Any], r: SpecReader) -> float:
    where = "spec.model.startupTimeout"
    if (got := r.duration(spec, where)) is None:
        return STARTUP_TIMEOUT_S
    text, seconds = got
    if not MIN_STARTUP_TIMEOUT_S <= seconds <= MAX_STARTUP_TIMEOUT_S:
        r.problems.append(f"{where}={text!r}: use {MIN_STARTUP_TIMEOUT_S / 60:g}m to "
                          f"{MAX_STARTUP_TIMEOUT_S / 3600:g}h, long enough to download and "
                          "load the model (e.g. 45m for a 70B checkpoint)")
        return STARTUP_TIMEOUT_S
    return seconds
