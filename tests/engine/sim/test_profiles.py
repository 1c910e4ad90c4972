"""GPU and model profiles: lookup, shapes against published sizes, YAML loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from slopilot.engine.sim.profiles import (
    GPUS,
    MODELS,
    GPUProfile,
    ModelProfile,
    ProfileError,
    get_gpu,
    get_model,
    gpu_from_dict,
    load_profiles,
    model_from_dict,
)


@pytest.mark.parametrize("name", ["h800", "H800", " H800-SXM ", "h800-sxm"])
def test_gpu_lookup_is_case_insensitive_and_knows_aliases(name: str) -> None:
    assert get_gpu(name) is GPUS["h800"]


@pytest.mark.parametrize("name", ["deepseek-67b", "DeepSeek-67B", "deepseek-llm-67b"])
def test_model_lookup_is_case_insensitive_and_knows_aliases(name: str) -> None:
    assert get_model(name).name == "DeepSeek-67B"


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ProfileError, match=r"unknown GPU 'v100'.*H800.*H200"):
        get_gpu("v100")
    with pytest.raises(ProfileError, match=r"unknown model 'gpt-5'.*Llama-3-8B.*DeepSeek-67B"):
        get_model("gpt-5")


@pytest.mark.parametrize(("name", "billions"), [
    # Published sizes of the checkpoints (model cards / safetensors metadata).
    ("llama-3-8b", 8.03), ("llama-3-70b", 70.55), ("deepseek-67b", 67.4),
    ("smollm2-135m", 0.1345),
])
def test_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    assert get_model(name).total_params / 1e9 == pytest.approx(billions, rel=0.005)


def test_deepseek_67b_shape() -> None:
    m = get_model("deepseek-67b")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim,
            m.intermediate_size, m.vocab_size) == (95, 8192, 64, 8, 128, 22016, 102400)
    # K and V, 95 layers, 8 KV heads of 128, bf16.
    assert m.kv_bytes_per_token == 2 * 95 * 8 * 128 * 2


def test_gpu_figures_follow_the_spec_sheets() -> None:
    h100, h800, h200, a100 = (get_gpu(n) for n in ("h100", "h800", "h200", "a100"))
    assert h800.peak_flops == h100.peak_flops == h200.peak_flops > a100.peak_flops
    assert h800.nvlink_bandwidth < h100.nvlink_bandwidth  # the export cut
    assert h200.hbm_bandwidth > h100.hbm_bandwidth
    assert h200.memory_bytes > h100.memory_bytes


def test_every_registry_entry_is_keyed_by_its_lowercase_name() -> None:
    for key, gpu in GPUS.items():
        assert key == gpu.name.lower()
    for key, model in MODELS.items():
        assert key == model.name.lower()


@pytest.mark.parametrize("field", ["peak_flops", "hbm_bandwidth", "memory_bytes"])
def test_gpu_profile_rejects_non_positive_figures(field: str) -> None:
    good = dict(name="x", peak_flops=1e12, hbm_bandwidth=1e12, memory_bytes=10**10,
                nvlink_bandwidth=0.0, pcie_bandwidth=1e10)
    with pytest.raises(ProfileError, match=field):
        GPUProfile(**{**good, field: 0})  # type: ignore[arg-type]


def test_model_profile_needs_heads_to_be_a_multiple_of_kv_heads() -> None:
    with pytest.raises(ProfileError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
        ModelProfile("odd", num_layers=1, hidden_size=64, num_heads=6, num_kv_heads=4,
                     head_dim=16, intermediate_size=64, vocab_size=10, max_position_embeddings=64)


def test_model_profile_rejects_zero_layers() -> None:
    with pytest.raises(ProfileError, match="num_layers=0"):
        ModelProfile("empty", num_layers=0, hidden_size=64, num_heads=4, num_kv_heads=4,
                     head_dim=16, intermediate_size=64, vocab_size=10, max_position_embeddings=64)


def test_profiles_load_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text(
        "gpus:\n"
        "  - {name: L40S, peak_flops: 362e12, hbm_bandwidth: 864e9,\n"
        "     memory_bytes: 48000000000, nvlink_bandwidth: 0, pcie_bandwidth: 32e9}\n"
        "models:\n"
        "  - {name: Mini, num_layers: 4, hidden_size: 256, num_heads: 4, num_kv_heads: 2,\n"
        "     head_dim: 64, intermediate_size: 512, vocab_size: 1000,\n"
        "     max_position_embeddings: 32768}\n")
    gpus, models = load_profiles(path)
    assert gpus["l40s"].peak_flops == 362e12
    assert gpus["l40s"].memory_bytes == 48_000_000_000
    assert models["mini"].num_kv_heads == 2
    assert models["mini"].tie_word_embeddings is False
    assert models["mini"].max_position_embeddings == 32768


def test_a_model_without_its_context_is_refused_not_given_a_guess() -> None:
    # A default (4,096) made the twin refuse a 32k-context model's long requests, or
    # serve a 2k one's, by a number nobody wrote.
    shape = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4,
             "num_kv_heads": 2, "head_dim": 64, "intermediate_size": 512, "vocab_size": 1000}
    with pytest.raises(ProfileError, match=r"missing field\(s\) max_position_embeddings "
                       r"\(the model's context in tokens, config.json's"):
        model_from_dict(shape)
    with pytest.raises(TypeError, match="max_position_embeddings"):
        ModelProfile(**shape)  # type: ignore[arg-type]
    assert model_from_dict({**shape, "max_position_embeddings": 32768}) \
        .max_position_embeddings == 32768


def test_yaml_with_an_unknown_field_names_it_and_the_valid_ones(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models:\n  - {name: m, layers: 4}\n")
    with pytest.raises(ProfileError, match=r"models\[0\]: unknown field\(s\) layers.*num_layers"):
        load_profiles(path)


def test_missing_fields_and_bad_documents_are_reported() -> None:
    with pytest.raises(ProfileError, match=r"missing field.*peak_flops"):
        gpu_from_dict({"name": "x"})
    with pytest.raises(ProfileError, match="expected a mapping"):
        model_from_dict([1, 2])  # type: ignore[arg-type]


def test_unreadable_or_misshapen_yaml_is_a_profile_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profiles"):
        load_profiles(tmp_path / "missing.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- just a list\n")
    with pytest.raises(ProfileError, match="'gpus' and/or 'models'"):
        load_profiles(path)


def test_numbers_written_as_text_are_parsed_or_refused_by_name() -> None:
    gpu = gpu_from_dict({"name": "g", "peak_flops": "1e12", "hbm_bandwidth": 1e12,
                         "memory_bytes": "8e9", "nvlink_bandwidth": 0,
                         "pcie_bandwidth": 1e10})
    assert gpu.memory_bytes == 8_000_000_000
    with pytest.raises(ProfileError, match="peak_flops='fast': expected a number"):
        gpu_from_dict({"name": "g", "peak_flops": "fast", "hbm_bandwidth": 1e12,
                       "memory_bytes": 8e9, "nvlink_bandwidth": 0, "pcie_bandwidth": 1e10})
    with pytest.raises(ProfileError, match=r"num_layers='2\.5': expected a whole number"):
        model_from_dict({"name": "m", "num_layers": "2.5", "hidden_size": 64,
                         "num_heads": 4, "num_kv_heads": 4, "head_dim": 16,
                         "intermediate_size": 64, "vocab_size": 10,
                         "max_position_embeddings": 64})


def test_whole_floats_become_ints_for_integer_fields() -> None:
    gpu = gpu_from_dict({"name": "g", "peak_flops": 1e12, "hbm_bandwidth": 1e12,
                         "memory_bytes": 8e9, "nvlink_bandwidth": 0, "pcie_bandwidth": 1e10})
    assert isinstance(gpu.memory_bytes, int)
