"""Load a Hugging Face checkpoint directory into the plain-torch Llama model.

A directory holds ``config.json``, the weights as ``model.safetensors`` or as shards
listed in ``model.safetensors.index.json``, ``tokenizer.json`` and, optionally,
``tokenizer_config.json`` / ``chat_template.jinja`` / ``generation_config.json``.
Every tensor is checked by name and shape before the model sees it, so a mismatched
config fails here with the file named rather than deep inside a matmul.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from slopilot.engine.executors.llama import LlamaConfig, LlamaForCausalLM
from slopilot.engine.executors.tokenizer import TextTokenizer
from slopilot.engine.models import rebuild_hint

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
# Tensors some checkpoints carry that the model recomputes or does not use.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """The checkpoint directory is incomplete or does not match its config."""


@dataclass(slots=True)
class LoadedModel:
    path: Path
    config: LlamaConfig
    model: LlamaForCausalLM
    tokenizer: TextTokenizer
    # All ids that end generation (config, generation_config and tokenizer agree or add).
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def read_config(path: Path) -> tuple[LlamaConfig, dict[str, Any]]:
    """The model config of a checkpoint directory, and the raw config.json."""
    cfg_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(
            f"{path} is not a directory; pass a Hugging Face checkpoint directory or a "
            "model name that `slopilot models fetch` knows")
    if not cfg_file.is_file():
        raise CheckpointError(
            f"{cfg_file} is missing; a checkpoint directory needs the config.json that "
            "transformers' save_pretrained writes")
    raw = _read_json(cfg_file)
    archs = raw.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{cfg_file}: architecture {arch!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (SmolLM and SmolLM2 are Llama)")
    if raw.get("use_sliding_window"):
        raise CheckpointError(
            f"{cfg_file}: sliding-window attention is not supported; set "
            "use_sliding_window to false or use the simulated executor")
    if raw.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"{cfg_file}: hidden_act={raw['hidden_act']!r}; only silu (SwiGLU) is supported")
    try:
        return LlamaConfig.from_hf(raw), raw
    except KeyError as exc:
        raise CheckpointError(f"{cfg_file} lacks the field {exc.args[0]!r}") from exc
    except ValueError as exc:
        raise CheckpointError(f"{cfg_file}: {exc}") from exc


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no weight_map object")
        files = [path / name for name in sorted(set(weight_map.values()))]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        raise CheckpointError(
            f"{path} has no model.safetensors nor model.safetensors.index.json; save the "
            "model with safe_serialization (the default in transformers) or fetch it with "
            "`slopilot models fetch NAME`")
    missing = [f for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(
            f"{index}: shard {missing[0].name} is listed but missing; download it again")
    return files


def _read_tensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    tensors: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    tensors[name] = f.get_tensor(name)
                    origin[name] = file
        # SafetensorError is none of the others: a file cut short ("invalid header
        # length") escaped as a traceback.
        except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
            raise CheckpointError(f"{file} is not a readable safetensors file ({exc}): it "
                                  "is damaged or cut short") from exc
    return tensors, origin


def load_weights(model: LlamaForCausalLM, path: Path) -> None:
    """Check every tensor's name and shape, then load them into ``model`` (meta or real)."""
    files = _weight_files(path)
    tensors, origin = _read_tensors(files)
    tied = model.config.tie_word_embeddings
    expected = {k: v.shape for k, v in model.state_dict().items()
                if not (tied and k == "lm_head.weight")}
    where = files[0].name if len(files) == 1 else f"the {len(files)} shards"
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise CheckpointError(
            f"{path}: tensor {missing[0]!r} is missing from {where} ({len(missing)} missing "
            "in all); the weights do not belong to this config.json, or a shard is "
            "incomplete")
    unexpected = sorted(k for k in set(tensors) - set(expected)
                        if not k.endswith(_IGNORED_SUFFIXES)
                        and not (tied and k == "lm_head.weight"))
    if unexpected:
        raise CheckpointError(
            f"{origin[unexpected[0]]}: tensor {unexpected[0]!r} is not part of a "
            f"{model.config.num_hidden_layers}-layer Llama model ({len(unexpected)} such); "
            "check num_hidden_layers and architectures in config.json")
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            raise CheckpointError(
                f"{origin[name]}: tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                f"but config.json implies {tuple(shape)}; the config does not match the "
                "weights (check hidden_size, heads, head_dim, vocab_size)")
    state = {name: tensors[name] for name in expected}
    model.load_state_dict(state, strict=False, assign=True)


def _eos_ids(raw: dict[str, Any], path: Path, tokenizer: TextTokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    sources: list[Any] = [raw.get("eos_token_id")]
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        sources.insert(0, _read_json(gen_file).get("eos_token_id"))
    sources.append(tokenizer.eos_token_id)
    for value in sources:
        for tid in value if isinstance(value, list) else [value]:
            if isinstance(tid, int) and tid not in ids:
                ids.append(tid)
    return tuple(ids)


def load_checkpoint(path: Path | str, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> LoadedModel:
    path = Path(path)
    config, raw = read_config(path)
    tokenizer = TextTokenizer.from_dir(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    try:
        load_weights(model, path)
    except CheckpointError as exc:
        hint = rebuild_hint(path)
        if hint is None:
            raise
        raise CheckpointError(f"{exc}; {hint}") from exc
    model.to_runtime(torch.device(device), dtype)
    bos = raw.get("bos_token_id")
    return LoadedModel(
        path=path, config=config, model=model, tokenizer=tokenizer,
        eos_token_ids=_eos_ids(raw, path, tokenizer),
        bos_token_id=bos if isinstance(bos, int) else tokenizer.bos_token_id)
