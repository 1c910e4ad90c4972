"""The static-batching reference ends where the engines end, and ignores EOS as they do.

The tiny random model's end-of-sequence id is set to the third token it greedily
generates, so a chat "ends early": with EOS respected every engine returns three tokens;
with ignore_eos every engine continues with the tokens greedy decoding picks anyway (the
EOS among them), which masking the EOS logit (min_new_tokens) would change.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from slopilot.engine.models import fetch_model

transformers = pytest.importorskip("transformers")

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PROMPTS = [[5, 6, 7, 8, 9], [40, 41, 42]]
MAX_TOKENS = 8


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=n,
                                           eos_token_id=[], pad_token_id=0)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return [int(t) for t in out[0, len(prompt):]]


@pytest.fixture(scope="module")
def early_eos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    src = fetch_model("tiny-random", tmp_path_factory.mktemp("cache"))
    dest = tmp_path_factory.mktemp("early-eos") / "model"
    shutil.copytree(src, dest)
    eos = _greedy(dest, PROMPTS[0], 3)[2]
    config = json.loads((dest / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    return dest, eos


@pytest.mark.usefixtures("one_torch_thread")
def test_ignore_eos_keeps_the_greedy_text(early_eos: tuple[Path, int]) -> None:
    model_dir, eos = early_eos
    static = _load("static_baseline").run_static(model_dir, PROMPTS, MAX_TOKENS, batch=2,
                                                 ignore_eos=True)
    first = _greedy(model_dir, PROMPTS[0], MAX_TOKENS)
    assert first[2] == eos  # the model wants to end here; the reference must not stop it
    assert static.token_ids["r0"] == first
    assert static.token_ids["r1"] == _greedy(model_dir, PROMPTS[1], MAX_TOKENS)
    assert static.tokens_per_s > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_eos_ends_the_request_as_in_the_engine(early_eos: tuple[Path, int]) -> None:
    model_dir, eos = early_eos
    static = _load("static_baseline").run_static(model_dir, PROMPTS, MAX_TOKENS, batch=2,
                                                 ignore_eos=False)
    assert static.token_ids["r0"] == _greedy(model_dir, PROMPTS[0], 3)
    assert static.token_ids["r0"][-1] == eos
    # The same requests through slopilot's engine, EOS respected: the same tokens.
    from slopilot.engine.executors.torch_runner import TorchExecutor

    worker = _load("serving_worker")
    executor = TorchExecutor(model_dir, num_gpu_blocks=16, num_cpu_blocks=0)
    engine = worker.run_engine(executor, PROMPTS, MAX_TOKENS, ignore_eos=False, serial=False)
    assert engine["token_ids"] == static.token_ids
