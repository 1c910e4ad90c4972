"""The one ``slopilot`` command. Each component registers its own subcommands.

Registration modules import nothing heavy (torch, kopf, optuna): the work is imported
inside each handler, so ``slopilot simulate`` starts fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from slopilot import __version__

# Each module has ``register(subparsers)``, which adds parsers whose ``func`` handles
# the parsed arguments and returns an exit code.
_COMMAND_MODULES = (
    "slopilot.engine.sim.commands",
    "slopilot.engine.calibrate.commands",
    "slopilot.engine.server.commands",
    "slopilot.engine.meter.commands",
    "slopilot.engine.models_commands",
    "slopilot.tuner.commands",
    "slopilot.tuner.local.commands",
    "slopilot.operator.commands",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slopilot",
        description="Keep LLM serving inside its latency SLOs: simulate, serve, tune, operate.")
    parser.add_argument("--version", action="version", version=f"slopilot {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


_DASHED_VALUES = ("--trace-window",)
"""Flags whose value may start with a dash (``-5:10``): argparse reads such a word as an
option and said only "expected one argument"; joined as ``--trace-window=-5:10``, the
flag's own check says what is wrong with it."""


def _join_dashed_values(argv: list[str]) -> list[str]:
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word in _DASHED_VALUES:
            value = next(words, None)
            if value is not None and value.startswith("-") and ":" in value:
                out.append(f"{word}={value}")
                continue
            out.append(word)
            if value is not None:
                out.append(value)
            continue
        out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_dashed_values(sys.argv[1:] if argv is None else argv))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``| head``): not an error of ours.
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
