"""Write a code-assistant-shaped trace in BurstGPT's CSV form, for the twin's fidelity on a
trace unlike the shipped conversation hour (``twin_fidelity.py --trace FILE``).

The shipped hour is chat: prompts of a few hundred to a few thousand tokens, outputs of a
few hundred, arrivals near Poisson. A code assistant's traffic is the other corner: long
prompts (the file and its neighbours, median ~2,000 tokens), short outputs (a completion,
median ~30), and bursts (an editor's keystrokes: 20-80 requests within a second or two)
on a slow ramp. Seeded, so the figures it feeds can be measured again:

    python benchmarks/code_trace.py --out code-trace.csv --seed 0
    python benchmarks/twin_fidelity.py --profile smollm2-cpu.yaml --trace code-trace.csv

Ends with ``RESULT requests=... span_s=... prompt_p50=... output_p50=...``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

HEADER = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
          "Log Type")


def code_trace(seed: int, minutes: float) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens), sorted by arrival."""
    rng = np.random.default_rng(seed)
    span = minutes * 60.0
    rows: list[tuple[float, int, int]] = []
    t = 0.0
    while True:
        # A slow ramp: bursts come twice as often at the end as at the start.
        rate = (1.0 + t / span) / 20.0  # bursts per second
        t += rng.exponential(1.0 / rate)
        if t >= span:
            break
        size = int(rng.integers(20, 81))
        starts = t + np.sort(rng.uniform(0.0, rng.uniform(0.5, 2.0), size))
        prompts = np.clip(rng.lognormal(np.log(2000), 0.8, size), 64, 16_000).astype(int)
        outputs = np.clip(rng.lognormal(np.log(30), 1.0, size), 1, 1_000).astype(int)
        rows += [(float(a), int(p), int(o)) for a, p, o in zip(starts, prompts, outputs,
                                                              strict=True)]
    rows.sort()
    return [r for r in rows if r[0] < span]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=40.0)
    args = p.parse_args()
    if not args.minutes > 0:
        p.error(f"--minutes {args.minutes}: give a positive number of minutes, e.g. 40")
    rows = code_trace(args.seed, args.minutes)
    with args.out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for at, prompt, output in rows:
            w.writerow((f"{at:.3f}", "code-model", prompt, output, prompt + output,
                        "API log"))
    prompts = np.array([r[1] for r in rows])
    outputs = np.array([r[2] for r in rows])
    print(f"RESULT requests={len(rows)} span_s={rows[-1][0] - rows[0][0]:.0f} "
          f"prompt_p50={np.median(prompts):.0f} output_p50={np.median(outputs):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
