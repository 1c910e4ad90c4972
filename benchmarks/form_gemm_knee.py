"""Where should the form's per-token knee sit? A refit of recorded samples at each knee.

The form prices every token of an iteration alike (``tokens``). On a CPU the GEMMs of a
batch of a few rows are bound by reading the weights, which the first row pays and the
next few ride along with: SmolLM2 on this project's EPYC took 17.1 ms for 1 decode at
16 tokens of context, 17.5 for 4 and 20.5 for 8, then ~1 ms per row up to 32. One slope
cannot follow that, and the light load, whose iterations hold 1-4 decodes, is where the
twin's per-iteration error is largest (docs/benchmarks.md, "The KV pool made resident").

Form 4 (sim/shape.py) has ``tokens_past_knee``, the tokens past ``GEMM_KNEE_TOKENS``
(8). This script refits a samples file (``slopilot calibrate --samples-out``) with that
column recomputed for each knee ``K`` of a scan (``max(tokens - K, 0)``), and without it
(form 3's single slope), with the calibration's own solver (``fit.solve_columns``), and
prints the fit error per shape class. It changes nothing: a knee fitted per device
would need the engine to stamp it on every iteration, as it stamps ``decode_spill``'s.

    .venv/bin/python benchmarks/form_gemm_knee.py docs/data/smollm2-cpu-samples-2026-12-04.json

Ends with ``RESULT no_knee_mape=... form_mape=... best_knee=... best_mape=...
no_knee_decode_mape=... form_decode_mape=...`` (mean relative errors over the samples;
``form``: at ``GEMM_KNEE_TOKENS``; ``best``: the knee of the scan that fits best).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from slopilot.engine.calibrate.fit import solve_columns
from slopilot.engine.calibrate.samples import read_samples
from slopilot.engine.sim.shape import FEATURES, GEMM_KNEE_TOKENS, IterationShape

KNEES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128)
_KNEE = FEATURES.index("tokens_past_knee")


def errors(shapes: list[IterationShape], seconds: np.ndarray, knee: int | None) -> np.ndarray:
    """Signed relative errors of the refit with the knee at ``knee`` (None: no knee)."""
    x = np.array([s.vector() for s in shapes], dtype=float)
    tokens = np.array([s.tokens for s in shapes], dtype=float)
    x[:, _KNEE] = 0.0 if knee is None else np.maximum(tokens - knee, 0.0)
    coef = solve_columns(x, seconds, 1.0 / seconds)
    return (x @ coef - seconds) / seconds


def by_class(err: np.ndarray, groups: list[str]) -> dict[str, float]:
    out: dict[str, list[float]] = defaultdict(list)
    for e, g in zip(np.abs(err), groups, strict=True):
        out[g].append(float(e))
    return {g: float(np.mean(v)) for g, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("samples", help="a samples file from slopilot calibrate --samples-out")
    args = ap.parse_args()
    rec = read_samples(args.samples)
    shapes = [s.spec.shape_at(rec.decode_knee, rec.graph_batch) for s in rec.samples]
    seconds = np.array([s.seconds for s in rec.samples])
    groups = [s.spec.group for s in rec.samples]
    rows = [(None, errors(shapes, seconds, None))] + [(k, errors(shapes, seconds, k))
                                                      for k in KNEES]
    classes = list(dict.fromkeys(groups))
    print(f"{'knee':>7} {'all':>6} " + " ".join(f"{c:>11}" for c in classes))
    for knee, err in rows:
        per = by_class(err, groups)
        print(f"{knee or 'none':>7} {np.mean(np.abs(err)):6.1%} "
              + " ".join(f"{per[c]:11.1%}" for c in classes))
    mape = {k: float(np.mean(np.abs(e))) for k, e in rows}
    decode = {k: by_class(e, groups).get("decode", float("nan")) for k, e in rows}
    best = min(KNEES, key=lambda k: mape[k])
    print(f"RESULT no_knee_mape={mape[None]:.4f} form_mape={mape[GEMM_KNEE_TOKENS]:.4f} "
          f"best_knee={best} best_mape={mape[best]:.4f} "
          f"no_knee_decode_mape={decode[None]:.4f} "
          f"form_decode_mape={decode[GEMM_KNEE_TOKENS]:.4f}")


if __name__ == "__main__":
    main()
