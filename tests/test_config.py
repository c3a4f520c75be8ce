"""Configuration: validation, error messages that name key and file, printing."""

from __future__ import annotations

from edge_agent.config import tomllib

import pytest

from edge_agent.config import AppConfig, ConfigError, default_store_path, dump_toml, load_config, parse_config


def write(tmp_path, text: str):
    p = tmp_path / "edge-agent.toml"
    p.write_text(text)
    return p


def test_defaults_without_a_file(monkeypatch):
    monkeypatch.delenv("EDGE_AGENT_CONFIG", raising=False)
    cfg = load_config(None)
    assert cfg.engine.type == "onnxruntime" and cfg.engine.provider == "cpu" and cfg.engine.precision == "auto"  # INT8 on CPU where the manifest vouches for it
    assert cfg.store.resolved() == default_store_path()
    assert cfg.classify.top_k == 3


def test_env_var_names_the_file(tmp_path, monkeypatch):
    p = write(tmp_path, "[classify]\ntop_k = 5\n")
    monkeypatch.setenv("EDGE_AGENT_CONFIG", str(p))
    assert load_config().classify.top_k == 5


@pytest.mark.parametrize(
    "text,key",
    [
        ("[store]\nbogus = 1\n", "store.bogus"),
        ("[engine]\nprovder = 'cpu'\n", "engine.provder"),
        ("[nonsense]\nx = 1\n", "nonsense"),
        ("[engine]\ntype = 'tensorrt'\nprovider = 'cpu'\n", "engine.provider"),
    ],
)
def test_unknown_key_names_key_and_file(tmp_path, text, key):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert f"unknown key '{key}'" in str(exc.value)
    assert str(p) in str(exc.value)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[classify]\ntop_k = 0\n", "classify.top_k"),
        ("[classify]\ntop_k = 'three'\n", "classify.top_k"),
        ("[preprocess]\nmax_pixels = 10\n", "preprocess.max_pixels"),
        ("[classify]\nextensions = ['jpg']\n", "must start with a dot"),
        ("[engine]\ntype = 'tflite'\n", "unknown engine type 'tflite'"),
        ("[engine]\nprovider = 'cuda'\nprecision = 'int8'\n", "CPU engine variant"),
        ("[engine]\nprecision = 'fp16'\n", "needs provider 'tensorrt'"),
        ("[engine]\ntype = 'tensorrt'\nopt_batch = 64\nmax_batch = 8\n", "opt_batch must not exceed max_batch"),
        ("[log]\nlevel = 'loud'\n", "log.level"),
    ],
)
def test_bad_values(tmp_path, text, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(write(tmp_path, text))


def test_missing_and_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[engine\n"))


def test_tensorrt_section_is_validated_by_its_backend(tmp_path):
    cfg = load_config(write(tmp_path, "[engine]\ntype = 'tensorrt'\nprecision = 'fp32'\nmax_batch = 16\n"))
    assert cfg.engine.type == "tensorrt" and cfg.engine.max_batch == 16 and cfg.engine.precision == "fp32"


def test_show_output_is_valid_toml_that_reloads_to_the_same_config(tmp_path):
    cfg = load_config(write(tmp_path, "[engine]\nprecision = 'int8'\n[classify]\ntop_k = 4\n"))
    text = dump_toml(cfg)
    assert parse_config(tomllib.loads(text)) == cfg
    assert "precision = \"int8\"" in text


def test_every_option_is_documented_with_its_default():
    text = dump_toml(AppConfig())
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if " = " in line and not line.startswith("#"):
            assert lines[i - 1].startswith("# ") and "Default:" in lines[i - 1], line
            assert "None" not in lines[i - 1]


def test_example_config_in_repo_is_current():
    from pathlib import Path

    example = Path(__file__).parents[1] / "edge-agent.example.toml"
    assert example.read_text() == dump_toml(AppConfig()), "regenerate with: edge-agent config show > edge-agent.example.toml"


def test_a_key_an_earlier_release_accepted_says_what_replaced_it():
    with pytest.raises(ConfigError) as exc:
        parse_config({"trainer": {"pseudo_only_interpolate": 0.5}}, source="edge-agent.toml")
    assert "edge-agent.toml: unknown key 'trainer.pseudo_only_interpolate' (replaced by trainer.pseudo_only_steps" in str(exc.value)
    assert parse_config({"trainer": {"pseudo_only_steps": [0.5]}}).trainer.pseudo_only_steps == [0.5]


@pytest.mark.parametrize("steps, fragment", [([1.5], "every step must lie between 0 and 1"), ([-0.1, 0.5], "between 0 and 1"),
                                             ([], "at least 1 item")])
def test_pseudo_only_steps_outside_0_to_1_or_empty_are_refused(steps, fragment):
    with pytest.raises(ConfigError, match=fragment) as exc:
        parse_config({"trainer": {"pseudo_only_steps": steps}})
    assert "trainer.pseudo_only_steps" in str(exc.value)
