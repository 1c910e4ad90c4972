"""What the engine needs from an executor: run one scheduled batch, then let go.

Both the torch model runner and the cost-model simulator implement this; the engine
loop and the contract tests see nothing else.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from slopilot.engine.outputs import ModelRunnerOutput, SchedulerOutput


@runtime_checkable
class Executor(Protocol):
    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one iteration: apply swaps, run the forward pass, sample.

        Returns a sampled token for every row with ``sample=True`` and the time the
        iteration took (measured or modelled).
        """
        ...

    def close(self) -> None:
        """Release devices, threads and host buffers; a no-op where there are none."""
        ...
