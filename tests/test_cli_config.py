"""Config files and --set overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from clotho.cli.config_io import apply_sets, load_config_file, merge
from clotho.errors import ConfigError
from clotho.runs.records import EvalConfig


def test_merge_is_deep() -> None:
    assert merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"b": 3}}) == {
        "a": {"b": 3, "c": 2},
        "d": 1,
    }


def test_set_parses_yaml_values_and_nests() -> None:
    data = apply_sets(
        {"sandbox": {"backend": "local"}}, ["sandbox.network=true", "concurrency=8", "skip=[a, b]"]
    )
    assert data == {
        "sandbox": {"backend": "local", "network": True},
        "concurrency": 8,
        "skip": ["a", "b"],
    }


def test_set_without_equals_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        apply_sets({}, ["concurrency"])


def test_config_file_round_trips_into_eval_config(tmp_path: Path) -> None:
    path = tmp_path / "eval.yaml"
    path.write_text(
        "paths: [tasks]\nagent: llm\nmodel:\n  model: m\n  base_url: [http://a/v1, http://b/v1]\n"
        "  sampling: {temperature: 0.2}\nsandbox: {backend: local, root: ro}\n"
    )
    config = EvalConfig.model_validate(load_config_file(path))
    assert config.model is not None and config.model.base_urls == ["http://a/v1", "http://b/v1"]
    assert config.model.sampling.temperature == 0.2
    assert config.sandbox.backend == "local" and config.sandbox.root == "ro"


def test_bad_yaml_and_non_mapping(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("paths: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config_file(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config_file(bad)


def test_llm_agent_without_a_model_means_the_embedded_one() -> None:
    assert EvalConfig(paths=["x"], agent="llm").model is None
    assert EvalConfig(paths=["x"], agent="nop").model is None
    flags = EvalConfig.model_validate({"paths": ["x"], "model": {"api": "local"}})
    assert flags.model is not None and flags.model.model == "SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match="api"):
        EvalConfig.model_validate({"paths": ["x"], "model": {"api": "tgi"}})


def test_ray_wraps_the_environments_sandbox_for_process_and_serve() -> None:
    """`clotho process|serve|evaluate --ray ADDRESS` (the config only: no cluster needed)."""
    from clotho.cli.env_options import build_environment

    env = build_environment(
        "terminal_test", None, ["sandbox.backend=docker"], None, None, None, None,
        ray="ray://127.0.0.1:10001",
    )  # fmt: skip
    sandbox = env.config.sandbox
    assert sandbox.backend == "ray" and sandbox.address == "ray://127.0.0.1:10001"
    assert sandbox.inner.backend == "docker"
    plain = build_environment("terminal_test", None, None, None, None, None, None, ray="auto")
    assert plain.config.sandbox.backend == "ray" and plain.config.sandbox.inner.backend == "local"
