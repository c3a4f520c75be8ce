"""Configuration: validation, error messages that name key and file, printing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_agent.config import AppConfig, ConfigError, default_store_path, load_config, parse_config, tomllib
from edge_agent.config_toml import dump_toml, sections_toml, toml_value


def write(tmp_path, text: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / "edge-agent.toml"
    p.write_text(text)
    return p


def test_defaults_without_a_file(monkeypatch):
    monkeypatch.delenv("EDGE_AGENT_CONFIG", raising=False)
    cfg = load_config(None)
    assert (
        cfg.engine.type == "onnxruntime" and cfg.engine.provider == "cpu" and cfg.engine.precision == "auto"
    )  # INT8 on CPU where the manifest vouches for it
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


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("[labels]\nreview_pool = 99999999999999999999\n", "labels.review_pool: Input should be at most 9223372036854775807"),
        ("[trainer]\nseed = -99999999999999999999\n", "trainer.seed: Input should be at most 9223372036854775807"),
        ("[hotswap]\npoll_s = 1e308\n", "hotswap.poll_s: Input should be at most 1e\\+09"),
        ("[daemon]\nstall_timeout_s = inf\n", "daemon.stall_timeout_s: Input should be a finite number"),
        ("[trainer.strategy]\ntype = 'ewc'\newc_lambda = nan\n", "trainer.strategy.ewc_lambda: Input should be a finite number"),
        ("[trainer]\npseudo_only_steps = [1.0, inf]\n", "trainer.pseudo_only_steps.1: Input should be a finite number"),
        ("[rollout]\nperiod_s = 1e12\n", "rollout.period_s: Input should be at most 1e\\+09"),
        ("[engine]\ndevice_id = 99999999999999999999\n", "engine.device_id: Input should be at most 9223372036854775807"),
        ("[alerts]\nretry_max_s = inf\n", "alerts.retry_max_s: Input should be a finite number"),
        ('[inbox]\npath = "/srv/in\\u0000box"\n', "inbox.path: Input should not hold a NUL character"),
        ('[classify]\ncrops = ["Apple", "Co\\u0000rn"]\n', "classify.crops: Input should not hold a NUL character"),
    ],
)
def test_a_value_the_code_cannot_use_is_refused_when_the_file_is_read_naming_the_file_and_key(tmp_path, text, fragment):
    with pytest.raises(ConfigError, match=fragment) as exc:
        load_config(write(tmp_path, text))
    assert str(tmp_path) in str(exc.value)


def test_the_largest_numbers_an_option_takes_are_taken():
    cfg = parse_config({"trainer": {"seed": 2**63 - 1}, "rollout": {"period_s": 1e9}})
    assert (cfg.trainer.seed, cfg.rollout.period_s) == (2**63 - 1, 1e9)


def test_a_value_given_on_the_command_line_is_checked_as_the_files_keys_are(tmp_path):
    from edge_agent.config import override

    cfg = load_config(write(tmp_path, "[web]\nport = 8081\n"))
    changed = override(cfg, {"web.port": 9000, "web.bind": None, "trainer.strategy.per_class": 3})
    assert (changed.web.port, changed.web.bind, changed.trainer.strategy.per_class) == (9000, "127.0.0.1", 3)
    assert changed.source == cfg.source and cfg.web.port == 8081
    assert override(cfg, {"web.port": None}) is cfg
    with pytest.raises(ConfigError, match=r"^--port: web.port: Input should be less than or equal to 65535 \(got 99999999\)$"):
        override(cfg, {"web.port": 99999999}, "--port")


@pytest.mark.parametrize(
    "command,argv,message",
    [
        ("edge-agent", ["web", "--port", "99999999"], "edge-agent: --bind/--port: web.port: Input should be less than or equal to 65535"),
        ("edge-trainer", ["serve", "--retrain-threshold", "0"], "edge-trainer: --retrain-threshold: trainer.retrain_threshold"),
    ],
)
def test_a_command_line_value_out_of_range_is_one_line_and_exit_2_not_a_traceback(tmp_path, capsys, command, argv, message):
    import edge_agent.cli
    import trainer.cli

    main = edge_agent.cli.main if command == "edge-agent" else trainer.cli.main
    argv = [*argv, "--state-dir", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and "Traceback" not in err and err.count("\n") == 1


def test_missing_and_malformed_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[engine\n"))


def test_an_endless_huge_or_deeply_nested_file_is_refused_without_reading_it_all(tmp_path):
    from edge_agent.config import MAX_CONFIG_BYTES

    with pytest.raises(ConfigError, match="/dev/zero: larger than 1 MiB, so not a configuration file"):
        load_config("/dev/zero")  # never ends: read whole, it fills the memory
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config(write(tmp_path, "# " + "x" * MAX_CONFIG_BYTES + "\n"))
    with pytest.raises(ConfigError, match="not valid TOML: nested too deeply"):
        load_config(write(tmp_path, "x = " + "[" * 100_000 + "\n"))
    assert load_config(write(tmp_path, "# " + "x" * (MAX_CONFIG_BYTES - 100) + "\n")) == AppConfig()


def test_tensorrt_section_is_validated_by_its_backend(tmp_path):
    cfg = load_config(write(tmp_path, "[engine]\ntype = 'tensorrt'\nprecision = 'fp32'\nmax_batch = 16\n"))
    assert cfg.engine.type == "tensorrt" and cfg.engine.max_batch == 16 and cfg.engine.precision == "fp32"


def test_show_output_is_valid_toml_that_reloads_to_the_same_config(tmp_path):
    cfg = load_config(write(tmp_path, "[engine]\nprecision = 'int8'\n[classify]\ntop_k = 4\n"))
    text = dump_toml(cfg)
    assert parse_config(tomllib.loads(text)) == cfg
    assert 'precision = "int8"' in text


def test_webhooks_print_as_an_array_of_tables_and_reload_to_the_same_config(tmp_path):
    cfg = load_config(write(tmp_path, "[[webhooks]]\nurl = 'http://a/1'\n[[webhooks]]\nurl = 'https://b/2'\nformat = 'ntfy'\n"))
    text = dump_toml(cfg)
    assert text.splitlines().count("[[webhooks]]") == 2
    assert parse_config(tomllib.loads(text)) == cfg
    assert [w.format for w in cfg.webhooks] == ["json", "ntfy"]


def test_with_no_webhooks_the_printed_config_shows_one_commented_out():
    text = dump_toml(AppConfig())
    assert "# [[webhooks]]" in text and '# url = "https://' in text
    assert tomllib.loads(text).get("webhooks") is None


def test_a_webhook_url_that_is_not_http_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="webhooks"):
        load_config(write(tmp_path, "[[webhooks]]\nurl = 'ftp://a/1'\n"))


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


@pytest.mark.parametrize(
    "steps, fragment", [([1.5], "every step must lie between 0 and 1"), ([-0.1, 0.5], "between 0 and 1"), ([], "at least 1 item")]
)
def test_pseudo_only_steps_outside_0_to_1_or_empty_are_refused(steps, fragment):
    with pytest.raises(ConfigError, match=fragment) as exc:
        parse_config({"trainer": {"pseudo_only_steps": steps}})
    assert "trainer.pseudo_only_steps" in str(exc.value)


# ---- plugins: [engine] and [trainer.strategy] by type ------------------------------------------------------------
def test_a_strategy_is_chosen_by_type_with_its_own_options():
    from edge_agent.trainer_config import EwcConfig, RehearsalConfig

    cfg = parse_config({"trainer": {"strategy": {"type": "ewc", "ewc_lambda": 5.0}}})
    assert cfg.trainer.strategy == EwcConfig(ewc_lambda=5.0)
    assert parse_config({}).trainer.strategy == RehearsalConfig()
    assert parse_config({"trainer": {"strategy": "lwf"}}).trainer.strategy.type == "lwf"  # the old form, defaults


@pytest.mark.parametrize(
    "table, message",
    [
        ({"trainer": {"strategy": {"type": "magic"}}}, "trainer.strategy: unknown strategy 'magic' (known: ewc, finetune, lwf, rehearsal)"),
        ({"trainer": {"strategy": {"type": "ewc", "per_class": 3}}}, "unknown key 'trainer.strategy.per_class'"),
        (
            {"trainer": {"strategy": {"type": "rehearsal", "per_class": 0}}},
            "trainer.strategy.per_class: Input should be greater than or equal to 1",
        ),
        ({"engine": {"type": "tensorrt", "provider": "cpu"}}, "unknown key 'engine.provider'"),
        ({"engine": {"type": "onnxruntime", "device_id": -1}}, "engine.device_id: Input should be greater than or equal to 0"),
    ],
)
def test_a_plugins_options_are_checked_by_its_own_class_and_errors_name_the_key_without_the_tag(table, message):
    with pytest.raises(ConfigError) as err:
        parse_config(table, "edge-agent.toml")
    assert f"edge-agent.toml: {message}" in str(err.value)


@pytest.mark.parametrize(
    "key, replacement",
    [
        ("ewc_lambda", "ewc_lambda in [trainer.strategy]"),
        ("rehearsal_per_class", "per_class in [trainer.strategy]"),
        ("rehearsal_selection", "selection in [trainer.strategy]"),
        ("lwf_temperature", "trainer.distill_temperature"),
    ],
)
def test_a_strategy_key_of_an_earlier_release_says_what_replaced_it(key, replacement):
    with pytest.raises(ConfigError, match=f"unknown key 'trainer.{key}' \\(replaced by {replacement.replace('[', '.').replace(']', '.')}"):
        parse_config({"trainer": {key: 1}}, "edge-agent.toml")


def test_config_show_prints_the_strategy_as_its_own_table_and_reads_back_the_same():
    cfg = parse_config({"trainer": {"strategy": {"type": "ewc", "ewc_lambda": 7.5}}})
    text = dump_toml(cfg)
    assert "[trainer.strategy]\n# Online Elastic Weight Consolidation" in text and "ewc_lambda = 7.5" in text
    assert parse_config(tomllib.loads(text)) == cfg


def test_sections_written_as_toml_read_back_to_the_same_values_nested_tables_included():
    sections = {
        "inbox": {"settle_s": 0.5, "recursive": False, "extensions": [".jpg", ".png"]},
        "camera": {"source": "/dev/video0"},
        "trainer": {"epochs": 2},
        "trainer.strategy": {"type": "ewc", "ewc_lambda": 7.5},
    }
    back = tomllib.loads(sections_toml(sections))
    assert back["inbox"] == sections["inbox"] and back["camera"] == sections["camera"]
    assert back["trainer"] == {"epochs": 2, "strategy": {"type": "ewc", "ewc_lambda": 7.5}}
    cfg = parse_config(back)
    assert (cfg.inbox.settle_s, cfg.inbox.recursive, cfg.trainer.strategy.type) == (0.5, False, "ewc")
    assert toml_value({"camera:0": 'say "hi"'}) == '{"camera:0" = "say \\"hi\\""}'


def test_a_value_toml_cannot_hold_is_refused_naming_its_type():
    with pytest.raises(TypeError, match="cannot write NoneType as TOML"):
        sections_toml({"inbox": {"path": None}})


def test_a_command_given_no_configuration_reads_the_file_the_services_read_where_it_exists(tmp_path, monkeypatch):
    import edge_agent.config as config

    monkeypatch.delenv("EDGE_AGENT_CONFIG", raising=False)
    monkeypatch.setattr(config, "SYSTEM_CONFIG", tmp_path / "absent.toml")
    assert load_config().source is None and load_config() == AppConfig()
    system = write(tmp_path, "[daemon]\nstate_dir = '/srv/farm'\n")
    monkeypatch.setattr(config, "SYSTEM_CONFIG", system)
    assert load_config().daemon.state_dir == "/srv/farm" and load_config().source == str(system)
    monkeypatch.setenv("EDGE_AGENT_CONFIG", str(write(tmp_path / "other", "")))
    assert load_config().daemon.state_dir == ""  # $EDGE_AGENT_CONFIG first


@pytest.mark.parametrize(
    "argv",
    [
        ["trainer", "fleet"],
        ["trainer", "status"],
        ["trainer", "retrain"],
        ["trainer", "signing-key"],
        ["edge_agent", "status"],
        ["edge_agent", "results"],
    ],
)
def test_commands_that_only_look_say_where_they_looked_and_why_and_make_nothing(tmp_path, argv):
    import subprocess
    import sys

    repo = Path(__file__).parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_AGENT_CONFIG", "STATE_DIRECTORY")} | {"PYTHONPATH": str(repo)}
    out = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and f"the default ./edge-state in {tmp_path}" in out.stderr, out.stderr
    conf = write(tmp_path / "etc", f"[daemon]\nstate_dir = '{tmp_path / 'farm'}'\n")
    out = subprocess.run([sys.executable, "-m", *argv, "--config", str(conf)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 2 and f"{tmp_path / 'farm'}" in out.stderr and f"[daemon] state_dir in {conf}" in out.stderr, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["etc"]  # no state, key or store made anywhere


@pytest.mark.parametrize(
    "argv",
    [
        ["edge_agent", "run"],
        ["edge_agent", "status"],
        ["edge_agent", "web"],
        ["edge_agent", "engine", "list"],
        ["edge_agent", "backup", "--out", "farm.tar"],
        ["trainer", "serve"],
    ],
)
def test_a_state_directory_that_is_a_file_is_one_line_and_exit_2_naming_why_it_was_chosen(tmp_path, argv):
    import subprocess
    import sys

    repo = Path(__file__).parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_AGENT_CONFIG", "STATE_DIRECTORY")} | {"PYTHONPATH": str(repo)}
    (tmp_path / "edge-state").write_text("not a folder")
    out = subprocess.run([sys.executable, "-m", *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"edge-state is a file, not a folder (the state directory, chosen by the default ./edge-state in {tmp_path}" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge-state"]  # nothing made beside it
