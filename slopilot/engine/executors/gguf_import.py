"""Turn a GGUF file into a safetensors checkpoint directory through transformers.

transformers dequantizes the GGUF weights to float32 and undoes llama.cpp's q/k
permutation; the result is saved in the Hugging Face layout the loader reads. Needs the
``models`` extra (transformers, gguf; transformers also wants accelerate for GGUF).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def convert_gguf_checkpoint(gguf_file: Path, dest: Path) -> None:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise ImportError(
            f"converting {gguf_file.name} needs transformers and gguf; install the models "
            "extra: pip install 'slopilot[models]' accelerate") from exc
    # fetch_model prints nothing: silence transformers' warnings and progress bars.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        folder, name = str(gguf_file.parent), gguf_file.name
        # The GGUF reader draws its own tqdm bar, which transformers' switch misses.
        sink = io.StringIO()
        with contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                         dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    dest.mkdir(parents=True, exist_ok=True)
    tied = bool(model.config.tie_word_embeddings)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_diff_dict()
    # The weights are plain float32 now; a quantization entry would mislead transformers.
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    model.generation_config.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
