"""The plain data of a calibrated cost profile (see ``profile_file`` for the file)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from slopilot.engine.executors.graph_shapes import GRAPH_MAX_BATCH
from slopilot.engine.sim.profiles import ModelProfile, ProfileError
from slopilot.engine.sim.shape import (
    FEATURES,
    FORM_NAME,
    FORM_VERSION,
    decode_knee_tokens,
    feature_sums,
    form_hash,
)

SCHEMA = "slopilot.dev/cost-profile/v1"
DEVICE_TYPES = ("cpu", "cuda")
PROFILE_DTYPES = ("float32", "bfloat16", "float16")
MAX_BLOCK_SIZE = 1024
MAX_KV_CACHE_BYTES = 1 << 42
"""4 TiB: more KV memory than any single device has; the simulator tracks every block."""
RECALIBRATE = "re-run `slopilot calibrate` for this model and device to write a new one"
MIN_STEP_S = 10e-6
"""The least one engine step can cost: its cheapest shape (``CostProfile.cheapest_step_s``)
priced below it is no measurement. A GPU kernel launch alone takes ~5 us of host time
and a forward pass launches several a layer (a replayed CUDA graph ~10 us to launch,
before its kernels run); the engine loop around it measured 89 us a step on this
project's 2-core EPYC and 112 us on an H200's host (``host.iteration``). The cheapest
steps calibrated here: 0.5 ms (tiny-random, 2 layers, on that CPU) and 2.5 ms (an H200
replaying graphs), 50 and 250 times the floor. A profile under it (zeros, 1e-12) was a
twin of unlimited capacity: TTFT 0 ms, every SLO held on one replica, and a closed loop
with no think time spinning on a clock that never moved."""


class ProfileFileError(ProfileError):
    """A profile file is missing, malformed, or for another model or device."""


class StaleProfileWarning(UserWarning):
    """A profile is readable but older than the code that uses it."""


@dataclass(frozen=True)
class DeviceInfo:
    type: str  # "cpu" or "cuda"
    name: str  # "AMD EPYC (2 cores)", "NVIDIA H100 80GB HBM3"
    threads: int | None = None  # torch intra-op threads (CPU)
    # The last-level cache (CPU L3, GPU L2) in bytes: the knee of ``decode_spill``.
    cache_bytes: int | None = None
    # What a step's ops ran on while timed (kernel_modes.PROFILE_KERNELS): on a CPU the
    # fused kernels or torch's ops (they differ by ~20 % a step); on CUDA torch's ops,
    # decodes eager or replayed from CUDA graphs. None: a profile from before the field.
    kernels: str | None = None

    @property
    def graph_batch(self) -> int | None:
        """The largest decode batch this device replayed from a CUDA graph while timed
        (the ``eager_passes`` feature's bound); None where it replayed none."""
        return (GRAPH_MAX_BATCH if self.kernels in ("cuda-graphs", "cuda-graphs-piecewise")
                else None)


@dataclass(frozen=True)
class ClassFit:
    """How well the fitted model reproduces one class of measured shapes."""

    shapes: int
    mape: float
    max_err: float
    worst: str = ""


@dataclass(frozen=True)
class FitReport:
    repeats: int
    shapes: int
    mape: float
    max_err: float
    classes: Mapping[str, ClassFit] = field(default_factory=lambda: MappingProxyType({}))
    host_steps: int = 0
    host_mape: float = 0.0
    cpu_share: float | None = None  # process CPU time / wall time while timing
    load_average: float | None = None  # 1-minute load average when it finished
    seconds: float = 0.0
    # The calibrated domain: outside it the twin extrapolates.
    token_budget: int = 0
    max_num_seqs: int = 0
    max_context: int = 0
    statistic: str = "median"  # each shape's figure over its repeats: median or min


@dataclass(frozen=True)
class CostProfile:
    name: str
    device: DeviceInfo
    model: ModelProfile
    dtype: str
    executor: Mapping[str, float]  # seconds per unit of each feature, executor only
    host: Mapping[str, float]  # the engine loop around the executor
    block_size: int = 16
    kv_cache_bytes: int = 0
    tp: int = 1
    form: str = FORM_NAME
    form_version: int = FORM_VERSION
    form_digest: str = field(default_factory=form_hash)
    created: str = ""
    versions: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    executor_code: str = ""
    fit: FitReport | None = None
    source: str = "<memory>"  # where it was read from; not written

    @property
    def decode_knee_tokens(self) -> int | None:
        """Padded decode KV tokens one layer of which fills the device's last-level cache
        (the knee of ``decode_spill``); None for a profile that does not record it."""
        per_layer = self.model.kv_bytes_per_token // self.model.num_layers // self.tp
        return decode_knee_tokens(self.device.cache_bytes, per_layer)

    def cheapest_step_s(self) -> float:
        """Seconds of the cheapest step these coefficients price: one decode of a
        one-token prompt, or a two-token prefill chunk that samples nothing, whichever is
        less (every other step adds rows, tokens or context to one of them; with no
        negative coefficient it costs at least as much). A step that only swaps is left
        out: one runs only beside the steps that made it swap."""
        total = [self.executor.get(f, 0.0) + self.host.get(f, 0.0) for f in FEATURES]
        knee, graphs = self.decode_knee_tokens, self.device.graph_batch
        return min(sum(c * v for c, v in zip(total, feature_sums(
            rows, knee=knee, graph_batch=graphs), strict=True))
            for rows in ([(1, 0, True)], [(2, 0, False)]))

    def coefficient(self, feature: str) -> float:
        """Executor plus host seconds per unit of ``feature`` (0 when not fitted)."""
        return self.executor.get(feature, 0.0) + self.host.get(feature, 0.0)

    def staleness(self, executor_code: str | None = None) -> list[str]:
        """Why this profile may not describe today's engine (empty when current)."""
        out = []
        if self.form_version < FORM_VERSION or self.form_digest != form_hash():
            out.append(
                f"{self.source}: fitted on cost-model form {self.form} v{self.form_version} "
                f"({self.form_digest}); this engine uses {FORM_NAME} v{FORM_VERSION} "
                f"({form_hash()}): features it lacks count as 0; {RECALIBRATE}")
        if executor_code and self.executor_code and executor_code != self.executor_code:
            out.append(
                f"{self.source}: calibrated on executor code {self.executor_code}, this "
                f"engine's is {executor_code}: its times may have changed; {RECALIBRATE}")
        return out
