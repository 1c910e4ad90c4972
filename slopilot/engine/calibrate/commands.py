"""``slopilot calibrate``: time the real executor and write a cost profile for the twin."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from slopilot.engine.executors.kernel_modes import DECODE_GRAPH_CHOICES, KERNEL_CHOICES

QUICK = {"token_budget": 256, "max_num_seqs": 16, "max_context": 512, "repeats": 5}
FULL = {"token_budget": 512, "max_num_seqs": 32, "max_context": 1024, "repeats": 5}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="time the real executor and fit the twin's cost model to it",
        description="Run the torch executor (the server's forward pass and paged KV "
                    "cache) over a designed grid of iteration shapes and the engine loop "
                    "around it, fit the cost model by least squares and write a profile "
                    "that simulate, tune and demo take with --profile.")
    p.add_argument("--model", default=None, help="tiny-random, smollm2-135m or a "
                   "checkpoint directory (required unless --refit)")
    p.add_argument("--executor", choices=("torch",), default="torch")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="default: float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's; recorded in the profile)")
    p.add_argument("--cpu-kernels", choices=KERNEL_CHOICES, default=None,
                   help="a CPU step's non-GEMM ops, as `slopilot serve --cpu-kernels`: "
                        "calibrate with what will serve (default: auto, as serve); the "
                        "profile records which ran")
    p.add_argument("--decode-graphs", choices=DECODE_GRAPH_CHOICES, default=None,
                   help="as `slopilot serve --decode-graphs` (default: auto, as serve); "
                        "the profile records whether decodes were graph replays")
    p.add_argument("--piecewise-graphs", choices=DECODE_GRAPH_CHOICES, default=None,
                   help="as `slopilot serve --piecewise-graphs` (default: off, as serve)")
    p.add_argument("--out", required=True, type=Path, metavar="PROFILE.yaml")
    p.add_argument("--quick", action="store_true", help="a smaller grid and context "
                   "(under a minute on tiny-random)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds per shape")
    p.add_argument("--statistic", choices=("median", "min"), default=None,
                   help="each shape's figure: the median of its rounds (what serving "
                   "sees; the default), or the fastest (undisturbed time on a busy shared "
                   "machine); with --refit, retaken from the kept rounds")
    p.add_argument("--token-budget", type=int, default=None, help="largest chunk")
    p.add_argument("--max-num-seqs", type=int, default=None, help="largest decode batch")
    p.add_argument("--max-context", type=int, default=None, help="longest context")
    p.add_argument("--kv-cache-gb", type=float, default=None,
                   help="KV cache size to record (default: what the executor would take)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="largest accepted mean error per iteration, of the executor's "
                   "fit and of the engine loop's (default: 0.10)")
    p.add_argument("--no-host", action="store_true",
                   help="skip timing the engine loop around the executor")
    p.add_argument("--samples-out", type=Path, default=None, metavar="FILE",
                   help="also keep the raw timings (every round of every shape, and the "
                   "engine-loop steps) here, even when the fit fails, for --refit")
    p.add_argument("--refit", type=Path, default=None, metavar="SAMPLES",
                   help="time nothing: fit today's cost-model form to the timings a "
                   "--samples-out file kept, and write --out")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout once the profile is written; a "
                   "refusal (bad input, or a fit above --tolerance) is one line on stderr, "
                   "exit 2, as simulate's and tune's")
    p.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from slopilot.engine.calibrate.design import DesignError, GridOptions
    from slopilot.engine.calibrate.fit import FitError
    from slopilot.engine.calibrate.harness import HarnessError
    from slopilot.engine.calibrate.runner import CalibrationOptions
    from slopilot.engine.calibrate.samples import SamplesFileError
    from slopilot.engine.calibrate.torch_target import CalibrationError, torch_target
    from slopilot.engine.models import ModelNotFoundError

    defaults = QUICK if args.quick else FULL
    if args.refit is not None:
        return _refit(args)
    try:
        if args.model is None:
            raise CalibrationError("--model is required (tiny-random, smollm2-135m or a "
                                   "checkpoint directory), unless --refit SAMPLES")
        _check_outputs(args)
        if args.threads is not None and args.threads < 1:
            raise CalibrationError(f"--threads {args.threads}: expected at least 1")
        # Before the model loads: NaN or inf would fail deep in the executor's int().
        if args.kv_cache_gb is not None and not (math.isfinite(args.kv_cache_gb)
                                                 and args.kv_cache_gb > 0):
            raise CalibrationError(f"--kv-cache-gb {args.kv_cache_gb}: expected gigabytes "
                                   "> 0, e.g. 2")
        def given(name: str) -> int:
            value = getattr(args, name)
            return int(defaults[name] if value is None else value)

        grid = GridOptions(token_budget=given("token_budget"),
                           max_num_seqs=given("max_num_seqs"),
                           max_context=given("max_context"), quick=args.quick)
        opts = CalibrationOptions(grid=grid, repeats=given("repeats"),
                                  tolerance=args.tolerance, host=not args.no_host,
                                  statistic=args.statistic or "median")
        # Their defaults are filled here, not by argparse: None says "not given", which
        # --refit refuses only where given (``_TIMING_FLAGS``).
        target = torch_target(args.model, grid, device=args.device or "cpu",
                              dtype=args.dtype, threads=args.threads,
                              kv_cache_gb=args.kv_cache_gb,
                              cpu_kernels=args.cpu_kernels or "auto",
                              decode_graphs=args.decode_graphs or "auto",
                              piecewise_graphs=args.piecewise_graphs or "off")
        result = _run(target, opts, quiet=args.json, samples_out=args.samples_out)
    except (CalibrationError, DesignError, HarnessError, FitError, ModelNotFoundError,
            SamplesFileError, ValueError) as exc:
        print(f"slopilot calibrate: {exc}", file=sys.stderr)
        return 2
    return _written(result, args)


_TIMING_FLAGS = (("--device", "device"), ("--dtype", "dtype"), ("--threads", "threads"),
                 ("--cpu-kernels", "cpu_kernels"), ("--decode-graphs", "decode_graphs"),
                 ("--piecewise-graphs", "piecewise_graphs"), ("--quick", "quick"),
                 ("--repeats", "repeats"), ("--token-budget", "token_budget"),
                 ("--max-num-seqs", "max_num_seqs"), ("--max-context", "max_context"),
                 ("--kv-cache-gb", "kv_cache_gb"))
"""The flags that set how the executor is timed, which a refit, timing nothing, refuses
where given (argparse's default for each is None, or False for --quick)."""


def _refit(args: argparse.Namespace) -> int:
    from slopilot.engine.calibrate.fit import FitError
    from slopilot.engine.calibrate.runner import fit_recording, with_statistic
    from slopilot.engine.calibrate.samples import SamplesFileError, read_samples
    from slopilot.engine.calibrate.torch_target import CalibrationError

    try:
        if args.model is not None or args.samples_out is not None:
            raise CalibrationError("--refit fits timings already taken: it takes no "
                                   "--model or --samples-out (the file names its model)")
        # "is", not "in (None, False)": 0 == False, and --threads 0 was let through.
        timing = [flag for flag, name in _TIMING_FLAGS
                  if getattr(args, name) is not None and getattr(args, name) is not False]
        if timing:
            raise CalibrationError(
                f"--refit fits timings already taken: it takes no {', '.join(timing)} "
                "(they set how the executor is timed; the samples file records how it was)")
        _check_outputs(args)
        rec = read_samples(args.refit)
        if args.statistic is not None:
            rec = with_statistic(rec, args.statistic)
        result = fit_recording(rec, args.tolerance, host=not args.no_host)
        _check_reads_back(result.profile, args.refit)
    except (CalibrationError, SamplesFileError, FitError) as exc:
        print(f"slopilot calibrate: {exc}", file=sys.stderr)
        return 2
    return _written(result, args)


def _check_reads_back(profile: Any, samples: Path) -> None:
    """The samples file's device, model and provenance go into the profile as it gives
    them; one the profile refuses is the file's fault, said before ``--out`` is written
    (``write_profile`` would refuse it too, as a traceback naming no file)."""
    from slopilot.engine.calibrate.samples import SamplesFileError
    from slopilot.engine.sim.profile_file import (
        ProfileFileError,
        dump_profile,
        parse_profile_text,
    )

    try:
        parse_profile_text(dump_profile(profile), "<profile text>")
    except ProfileFileError as exc:
        raise SamplesFileError(f"{samples}: the profile fitted to it would not read back "
                               f"({exc})") from None


def _written(result: Any, args: argparse.Namespace) -> int:
    from slopilot.engine.sim.profile_file import write_profile

    try:
        path = write_profile(result.profile, args.out)
    except OSError as exc:  # checked before the timing; a path that changed since, a full disk
        print(f"slopilot calibrate: --out {args.out}: cannot write: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(_brief(result, path)))
    else:
        _print_report(result, path)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Before minutes of timing: each output can be written, and none is an input (the
    samples a refit reads, the checkpoint's files) or the other output."""
    from slopilot.engine.calibrate.torch_target import CalibrationError
    from slopilot.engine.models import checkpoint_files
    from slopilot.engine.sim.output_paths import NamedFile, check_distinct

    outputs = [NamedFile("--out", str(args.out))]
    if args.samples_out is not None:
        outputs.append(NamedFile("--samples-out", str(args.samples_out)))
    for out in outputs:
        _check_out(Path(out.value), out.flag)
    inputs = [] if args.refit is None else [NamedFile("--refit", str(args.refit))]
    if args.model is not None:
        inputs += [NamedFile("--model", str(args.model), f)
                   for f in checkpoint_files(args.model)]
    try:
        check_distinct(outputs, inputs)
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None


def _check_out(out: Path, flag: str = "--out") -> None:
    """Fail before minutes of timing if the file could not be written."""
    from slopilot.engine.calibrate.torch_target import CalibrationError
    from slopilot.engine.sim.output_paths import NamedFile, check_output_target

    if out.is_dir():
        raise CalibrationError(f"{flag} {out}: is a directory; name a file, e.g. "
                               f"{out / ('profile.yaml' if flag == '--out' else 'samples.json')}")
    try:
        check_output_target(NamedFile(flag, str(out)))  # a device or FIFO would be replaced
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    # Probed where the write lands: through a symlink, the folder of the file it names.
    parent = Path(os.path.realpath(out)).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".slopilot-check-"):
            pass
    except OSError as exc:
        raise CalibrationError(f"{flag} {out}: cannot write there ({exc})") from None


def _run(target: Any, opts: Any, *, quiet: bool, samples_out: Path | None = None) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from slopilot.engine.calibrate.runner import fit_recording, measure, total_steps
    from slopilot.engine.calibrate.samples import write_samples

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]calibrating[/]"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[status]}"), console=console,
                  transient=quiet) as progress:
        task = progress.add_task("calibrate", total=total_steps(opts, target.executor),
                                 status="")

        def step(status: str) -> None:
            progress.update(task, advance=1, status=status)

        rec = measure(target, opts, progress=step)
    if samples_out is not None:
        # Before the fit, which may refuse: the timings are the expensive part.
        write_samples(rec, samples_out)
        print(f"raw timings: {samples_out} (refit with --refit {samples_out})",
              file=sys.stderr)
    return fit_recording(rec, opts.tolerance, host=opts.host)


def _brief(result: Any, path: Path) -> dict[str, Any]:
    from slopilot.engine.calibrate.fit import exactly_determined

    p = result.profile
    exact = exactly_determined(result.executor_fit)
    return {"profile": str(path), "model": p.model.name, "device": p.device.name,
            "kernels": p.device.kernels, "mape": p.fit.mape, "max_err": p.fit.max_err,
            "in_sample": True,  # errors on the shapes fitted, not on shapes held out
            "classes": {k: {"shapes": v.shapes, "mape": v.mape, "max_err": v.max_err,
                            "exactly_determined": k in exact}
                        for k, v in p.fit.classes.items()},
            "host_mape": p.fit.host_mape, "executor": dict(p.executor), "host": dict(p.host)}


def _print_report(result: Any, path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from slopilot.engine.calibrate.fit import exactly_determined

    p = result.profile
    fit = p.fit
    console = Console(width=None if sys.stdout.isatty() else 120)
    kernels = "" if p.device.kernels is None else f", kernels {p.device.kernels}"
    # In-sample: each error is of a shape the fit was made on. A class with as many
    # shapes as the coefficients only it exercises is met exactly, so its 0 % says
    # nothing of how well the form fits it.
    table = Table(title=f"Fit error per iteration (in-sample: on the shapes fitted): "
                        f"{p.name}, {p.device.name}, {p.device.threads or '-'} "
                        f"thread(s){kernels}")
    for col in ("shapes", "n", "mean error", "max error", "worst shape"):
        table.add_column(col, justify="left" if col in ("shapes", "worst shape") else "right")
    exact = exactly_determined(result.executor_fit)
    for name, c in fit.classes.items():
        worst = (f"exactly determined: {c.shapes} shapes for its own {', '.join(exact[name])}"
                 " (0 % by construction)" if name in exact else c.worst)
        table.add_row(name, str(c.shapes), f"{c.mape:.1%}", f"{c.max_err:.1%}", worst)
    table.add_row("all", str(fit.shapes), f"{fit.mape:.1%}", f"{fit.max_err:.1%}", "",
                  style="bold")
    if result.host_fit is not None:
        h = result.host_fit
        table.add_row("engine loop", str(fit.host_steps), f"{h.mape:.1%}", f"{h.max_err:.1%}",
                      "(whole step: executor measured + loop fitted)")
    console.print(table)
    coef = Table(title="Coefficients (seconds per unit)")
    for col in ("feature", "executor", "engine loop"):
        coef.add_column(col, justify="right")
    for name, value in p.executor.items():
        coef.add_row(name, f"{value:.3g}", f"{p.host.get(name, 0.0):.3g}")
    console.print(coef)
    share = "-" if fit.cpu_share is None else f"{fit.cpu_share:.0%}"
    console.print(f"{fit.seconds:.0f} s, {fit.repeats} repeats, CPU share {share}, load "
                  f"average {fit.load_average}; wrote {path}")
