"""``slopilot serve``: an OpenAI-compatible server on the torch or the simulated executor.

Registration imports nothing heavy; torch, fastapi and uvicorn load in the handler.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slopilot.engine.alert_factors import alert_factors_from_env
from slopilot.engine.deadline_flags import (
    add_deadline_flags,
    add_max_connections_flag,
    deadlines_from_flags,
    max_connections_from_flag,
    mib,
)
from slopilot.engine.executors.cpu_threads import BIND_CHOICES, Binding, apply_openmp_binding
from slopilot.engine.executors.kernel_modes import (
    DECODE_GRAPH_CHOICES,
    DTYPE_CHOICES,
    KERNEL_CHOICES,
)
from slopilot.engine.port_flag import port

# No torch: this module reads the environment only (and must run before torch loads).
from slopilot.engine.server.admin_credential import AdminCredential
from slopilot.engine.slo import SLO_FILE_ENV, SLOError, SLOSpec, read_slo_file

if TYPE_CHECKING:
    from slopilot.engine.clients import ClientClasses
    from slopilot.engine.watched_file import WatchedFile

_LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over the OpenAI API",
        description="Serve one engine replica over the OpenAI API (/v1/completions, "
        "/v1/chat/completions), with /metrics, /health and live knobs at /admin/config "
        "(every method behind the admin token; on --admin-port when given). "
        "SIGTERM or Ctrl-C drains: new requests get 503, running ones finish (up to "
        "--drain-timeout), then the server exits; a second signal stops at once.")
    # None, not "tiny-random": a --model given to the simulated executor is refused,
    # not served as the scenario's cost model without a word.
    p.add_argument("--model", default=None,
                   help="tiny-random (default), smollm2-135m or a checkpoint directory "
                   "(torch executor)")
    p.add_argument("--executor", choices=("torch", "simulated"), default="torch")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 for every interface)")
    p.add_argument("--port", type=port("--port"), default=8000, help="0 picks a free port")
    p.add_argument("--admin-port", type=port("--admin-port"), metavar="PORT",
                   help="serve the admin API (/admin/config) on this port alone, so a "
                   "NetworkPolicy can keep clients off it; the inference port then has no "
                   "/admin (0 picks a free port; default: /admin on --port)")
    p.add_argument("--device", default=None,
                   help="cpu (default), cuda or cuda:N (torch executor)")
    p.add_argument("--cpu-bind", choices=BIND_CHOICES, default="off",
                   help="torch executor on CPU: pin one OpenMP thread to each CPU this "
                   "process may run on, when there is one thread per CPU and the "
                   "environment sets no placement (auto), or leave them unpinned (off)")
    p.add_argument("--cpu-kernels", choices=KERNEL_CHOICES, default="auto",
                   help="torch executor: the fused float32 CPU kernels for the decode "
                   "step's norms, RoPE, SwiGLU, KV writes and decode attention when they "
                   "load or build (auto), required (native), or torch's own ops (torch)")
    p.add_argument("--decode-graphs", choices=DECODE_GRAPH_CHOICES, default="auto",
                   help="torch executor: replay decode-only iterations from CUDA graphs, "
                   "one launch instead of hundreds (auto: on CUDA; cuda: required; "
                   "padded: their padded pass without capture; off: never)")
    p.add_argument("--piecewise-graphs", choices=DECODE_GRAPH_CHOICES, default="off",
                   help="torch executor: replay the layers' work around attention of "
                   "passes with prefill chunks from CUDA graphs too (cuda; auto is off "
                   "until measured on a GPU; padded: their padded pass without capture)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="torch executor: the weights' and activations' type; auto is "
                   "float32 on CPU (the fused kernels, float32 parity) and bfloat16 on "
                   "CUDA. bfloat16 on a CPU with AMX or AVX512-BF16 decodes about 1.5x "
                   "faster, with torch's ops (docs/operations.md)")
    p.add_argument("--config", type=Path, metavar="FILE.json",
                   help="a JSON object of engine knobs")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="override one knob (repeatable; applied after --config)")
    p.add_argument("--slo", type=Path, metavar="FILE.json",
                   help="judge each request against its class's objectives in this file "
                   "(an LLMDeployment's spec.slo, e.g. {\"profile\": \"strict\"}) and "
                   "export the verdicts (slopilot_slo_*); PUT /admin/slo replaces them "
                   f"(default: ${SLO_FILE_ENV} if set)")
    p.add_argument("--admin-token-file", type=Path, metavar="FILE",
                   help="bearer token of the admin API, every method (else "
                   "$SLOPILOT_ADMIN_TOKEN, or only its SHA-256 in $SLOPILOT_ADMIN_TOKEN_SHA256; "
                   "with none, the admin API answers 403)")
    # A flag, never an environment variable: an image too old to know it stops at it,
    # where it would ignore a variable and serve every class to every client.
    p.add_argument("--clients", type=Path, metavar="FILE.json",
                   help="the priority classes each API key may name (an LLMDeployment's "
                   "spec.clients: {\"keys\": [{\"name\", \"sha256\", \"maxClass\", "
                   "\"defaultClass\"}], \"anonymous\": {\"maxClass\"}}); every /v1 "
                   "request then needs a granted key (401) and a class within its grant "
                   "(403). Read again whenever it changes (default: any class, any client)")
    # None, not "tiny-cpu": one given to the torch executor is refused, not dropped.
    p.add_argument("--scenario", default=None,
                   help="simulated executor: take gpu, model and tp from this scenario "
                   "(default tiny-cpu)")
    p.add_argument("--gpu", help="simulated executor: GPU profile (overrides the scenario)")
    p.add_argument("--sim-model", help="simulated executor: model profile")
    p.add_argument("--tp", type=int, help="simulated executor: tensor-parallel degree "
                   "(1, 2, 4 or 8)")
    p.add_argument("--served-model-name", help="the model name clients send and see")
    p.add_argument("--num-gpu-blocks", type=_blocks, metavar="N",
                   help="KV cache size in blocks (default: sized from the device's memory; "
                   "torch executor: at most what the device has free)")
    p.add_argument("--drain-timeout", type=_drain_seconds, default=30.0, metavar="SECONDS",
                   help="on shutdown, how long running requests may take to finish "
                   "(default 30; 0: end them at once)")
    p.add_argument("--max-body-mb", type=mib("--max-body-mb", 16), default=None, metavar="MIB",
                   help="largest request body accepted, in MiB (default 16); a larger "
                        "one is answered 413 while it is read")
    add_deadline_flags(p)
    add_max_connections_flag(p, "half of ulimit -n, at most 1024")
    p.add_argument("--log-level", choices=_LOG_LEVELS, default="info")
    p.add_argument("--check-integrity", action="store_true",
                   help="debugging: check the KV bookkeeping each time the engine goes "
                   "idle (O(KV blocks): seconds on a large cache; never for serving)")
    p.set_defaults(func=_serve)


def _blocks(text: str) -> int:
    """argparse type: a KV cache of at least one block. 0 was taken for "not given" (the
    cache sized from memory, without a word)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"--num-gpu-blocks {text}: expected at least 1 KV block, e.g. 1024; leave it "
            "out to size the cache from the device's memory")
    return value


def _drain_seconds(text: str) -> float:
    """argparse type: seconds, 0 or more. nan, inf and 1e400 failed uvicorn's int() of
    the shutdown timeout as a traceback; -1 drained as 0 without a word."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"--drain-timeout {text}: expected seconds, 0 or more, e.g. 30 (0 ends the "
            "running requests at once)")
    return value


def _fail(message: str) -> int:
    print(f"slopilot serve: {message}", file=sys.stderr)
    return 2


CONFIG_FILE_BYTES = 64 * 1024
"""The most of a ``--config`` file read: a JSON object of a dozen knobs (the admin API
takes a PUT of as much)."""
TOKEN_FILE_BYTES = 4096
"""The most of an ``--admin-token-file`` read: a token, not a document."""


def _knobs(args: argparse.Namespace) -> dict[str, Any]:
    from slopilot.engine.bounded_read import read_bounded
    from slopilot.engine.config import ConfigError, parse_set_args
    from slopilot.engine.json_keys import DuplicateKey, loads_unique
    from slopilot.engine.read_errors import unreadable

    knobs: dict[str, Any] = {}
    if args.config is not None:
        try:
            data = loads_unique(read_bounded(args.config, CONFIG_FILE_BYTES).decode("utf-8"))
        except DuplicateKey as exc:
            raise ConfigError(f"--config {args.config}: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"--config {args.config}: {unreadable(exc)}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"--config {args.config}: not UTF-8 text; it holds a JSON "
                              "object of knobs") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config {args.config}: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--config {args.config}: must hold a JSON object of knobs, "
                              "e.g. {\"token_budget\": 512}")
        knobs.update(data)
    knobs.update(parse_set_args(args.set))
    return knobs


def load_slo_file(path: Path) -> SLOSpec:
    """``--slo FILE.json``: the objectives the server judges requests by."""
    try:
        return read_slo_file(path)
    except SLOError as exc:
        raise ValueError(f"--slo {exc}") from None


def load_clients_file(path: Path) -> WatchedFile[ClientClasses]:
    """``--clients FILE.json``: the grants, read again whenever the file changes (the
    operator's ConfigMap is swapped in place); ValueError naming the flag, the file and
    the field where the file cannot be used at the start."""
    from slopilot.engine.clients import ClientsError, read_clients_file
    from slopilot.engine.watched_file import WatchedFile

    try:
        return WatchedFile(path, read_clients_file, "client grants", (ClientsError,))
    except ClientsError as exc:
        raise ValueError(f"--clients {exc}") from None


def admin_token(token_file: Path | None) -> str | AdminCredential | None:
    """The admin token from the file if given, else from $SLOPILOT_ADMIN_TOKEN, or only its
    digest from $SLOPILOT_ADMIN_TOKEN_SHA256 (what the operator's pods get: no Secret)."""
    from slopilot.engine.bounded_read import read_bounded
    from slopilot.engine.read_errors import unreadable
    from slopilot.engine.server.admin_credential import ADMIN_TOKEN_ENV, ADMIN_TOKEN_SHA256_ENV

    if token_file is not None:
        try:
            token = read_bounded(token_file, TOKEN_FILE_BYTES).decode("utf-8").strip()
        except OSError as exc:  # named with its flag: a bare errno line named neither
            raise ValueError(f"--admin-token-file {token_file}: {unreadable(exc)}") from None
        except UnicodeDecodeError:
            raise ValueError(f"--admin-token-file {token_file}: not UTF-8 text; it holds "
                             "the token alone") from None
        if not token:
            raise ValueError(f"--admin-token-file {token_file} is empty")
        return token
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    digest = os.environ.get(ADMIN_TOKEN_SHA256_ENV, "").strip()
    if token and digest:
        raise ValueError(f"${ADMIN_TOKEN_ENV} and ${ADMIN_TOKEN_SHA256_ENV} are both set: "
                         "set one (the digest where the token itself must not be stored)")
    if digest:
        return AdminCredential.of_digest(digest)
    return token or None


def _torch_only(args: argparse.Namespace) -> str | None:
    """Why a flag of the torch executor's cannot go with the simulated one, or None: each
    given was dropped without a word (and --model served the scenario's model instead)."""
    if args.model is not None:
        return (f"--model {args.model}: the simulated executor serves the scenario's cost "
                "model (--scenario, --sim-model); add --executor torch to serve a model")
    given = {"--device": args.device is not None, "--cpu-bind": args.cpu_bind != "off",
             "--cpu-kernels": args.cpu_kernels != "auto", "--dtype": args.dtype != "auto",
             "--decode-graphs": args.decode_graphs != "auto",
             "--piecewise-graphs": args.piecewise_graphs != "off"}
    for flag, is_given in given.items():
        if is_given:
            return f"{flag} applies to --executor torch only"
    return None


def _simulated_only(args: argparse.Namespace) -> str | None:
    """Why a flag of the simulated executor's cannot go with the torch one, or None
    (--scenario was served past without a word, the others refused)."""
    given = {"--scenario": args.scenario is not None, "--gpu": args.gpu is not None,
             "--sim-model": args.sim_model is not None, "--tp": args.tp is not None}
    for flag, is_given in given.items():
        if is_given:
            return (f"{flag} applies to --executor simulated only (the torch executor "
                    "serves --model)")
    return None


def _serve(args: argparse.Namespace) -> int:
    from slopilot.engine.config import ConfigError, EngineConfig

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = EngineConfig().with_overrides(_knobs(args))
        token = admin_token(args.admin_token_file)
        slo_file = args.slo or (Path(os.environ[SLO_FILE_ENV]) if os.environ.get(SLO_FILE_ENV)
                                else None)
        slo = None if slo_file is None else load_slo_file(slo_file)
        factors = alert_factors_from_env()
        clients = None if args.clients is None else load_clients_file(args.clients)
        deadlines = deadlines_from_flags(args)
        max_connections = max_connections_from_flag(args.max_connections, 1)
    except (ConfigError, ValueError, OSError) as exc:
        return _fail(str(exc))
    problem = _simulated_only(args) if args.executor == "torch" else _torch_only(args)
    if problem is not None:
        return _fail(problem)
    if args.admin_port is not None and args.admin_port == args.port != 0:
        return _fail(f"--admin-port {args.admin_port} is --port too; give the admin API a "
                     "port of its own")
    binding = Binding()
    device = args.device or "cpu"
    if args.executor == "torch":
        from slopilot.engine.device_flag import DeviceError, check_device

        try:  # torch's refusal of "tpu" or "cuda:x" was a RuntimeError traceback
            check_device(device)
        except DeviceError as exc:
            return _fail(str(exc))
    if args.executor == "torch" and device == "cpu":
        # Before the backends' imports: OpenMP reads its placement when torch loads it.
        binding = apply_openmp_binding(args.cpu_bind)
        logging.getLogger("slopilot.serve").info("CPU threads: %s", binding.reason)
    from slopilot.engine.server.backends import BackendError, build_simulated, build_torch

    try:
        if args.executor == "simulated":
            backend = build_simulated(
                config, scenario=args.scenario or "tiny-cpu", gpu=args.gpu,
                sim_model=args.sim_model,
                tp=args.tp, num_gpu_blocks=args.num_gpu_blocks,
                served_model_name=args.served_model_name)
        else:
            backend = build_torch(config, args.model or "tiny-random", device=device,
                                  num_gpu_blocks=args.num_gpu_blocks,
                                  served_model_name=args.served_model_name,
                                  cpu_kernels=args.cpu_kernels,
                                  decode_graphs=args.decode_graphs,
                                  piecewise_graphs=args.piecewise_graphs,
                                  dtype=None if args.dtype == "auto" else args.dtype)
    except (BackendError, ValueError, OSError) as exc:
        return _fail(str(exc))
    backend.metrics.set_slo(slo)
    # Before the first request: the SLO's thresholds, at the deployment's alert factors,
    # become edges of the TTFT and gap histograms for this process' life (one edited
    # later is read judged on it).
    backend.metrics.export_slo_edges(slo, factors)
    binding.release_calling_thread()
    from slopilot.engine.listen_socket import ListenError
    from slopilot.engine.server.uvicorn_runner import serve_forever

    try:
        return serve_forever(backend, host=args.host, port=args.port,
                             admin_port=args.admin_port, admin_token=token,
                             drain_timeout_s=args.drain_timeout, log_level=args.log_level,
                             check_integrity=args.check_integrity, clients=clients,
                             deadlines=deadlines, max_connections=max_connections,
                             **({} if args.max_body_mb is None
                                else {"max_body_bytes": args.max_body_mb}))
    except ListenError as exc:  # the message names the flag to change: --host or a port
        backend.close()
        return _fail(str(exc))
    except OSError as exc:
        backend.close()
        return _fail(f"cannot listen on {args.host}: {exc.strerror or exc}")
