"""The shared CLI options (clotho/cli/options.py) read the same on every command that takes
them, say the config models' defaults and allowed values, and a flag asks for the same
configuration whichever command it is given to."""

from __future__ import annotations

from typing import Any, Literal, get_args

import typer

from clotho.chat.client import ModelConfig
from clotho.cli import options as opt
from clotho.cli.env_cmd import process_command
from clotho.cli.env_options import build_environment
from clotho.cli.eval_cmd import eval_command
from clotho.cli.main import app
from clotho.env.config import EnvConfig
from clotho.runs.records import EvalConfig
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.config import register, sandbox_kinds, unregister

COMMANDS = ("eval", "generate", "process", "serve", "evaluate")
# The options of clotho/cli/options.py more than one command takes.
SHARED = {
    "--config", "--set", "--model", "--api", "--tokenizer", "--tool-parser", "--base-url",
    "--api-key-env", "--temperature", "--max-tokens", "--max-turns", "--system-prompt",
    "--sandbox", "--network", "--ray", "--retries", "--task-timeout", "--verifier-timeout",
    "--command-timeout", "--concurrency", "--max-num-workers", "--group-size", "--wandb",
    "--sft-out", "--sft-format", "--sft-min-reward", "--sft-all", "--sft-errors",
    "--sft-tokenizer", "--sft-dedup",
}  # fmt: skip
# The one flag spelled alike for two settings: the model's tokenizer (token APIs) on eval and
# generate, the environment's own (tokens and masks of chat rollouts) on the others.
TWO_SETTINGS = {"--tokenizer"}


def _options(command: str) -> dict[str, Any]:
    """{first flag: the option typer built}, as `clotho COMMAND --help` shows it."""
    built = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.opts[0]: p for p in built.params if p.opts[0].startswith("--")}


def _shown(option: Any) -> tuple[Any, ...]:
    return (
        tuple(option.opts),
        tuple(option.secondary_opts),
        option.help,
        option.default,
        option.min,
        option.max,
        option.type_descriptor.annotation,
        option.rich_help_panel,
    )


def test_a_shared_option_reads_the_same_on_every_command() -> None:
    built = {command: _options(command) for command in COMMANDS}
    for flag in SHARED:
        having = {c: _shown(o[flag]) for c, o in built.items() if flag in o}
        assert len(having) >= 2, (flag, having)
        if flag in TWO_SETTINGS:
            assert len(set(having.values())) == 2, (flag, having)
            assert having["eval"] == having["generate"]
            assert having["process"] == having["serve"] == having["evaluate"]
            continue
        assert len(set(having.values())) == 1, (flag, having)
    eval_options = built["eval"]
    assert get_args(eval_options["--sandbox"].type_descriptor.annotation) == sandbox_kinds(
        place="host"
    )
    api = ModelConfig.model_fields["api"].annotation
    assert get_args(eval_options["--api"].type_descriptor.annotation) == get_args(api)
    for flag, model, field in [
        ("--max-turns", EvalConfig, "max_turns"),
        ("--retries", EvalConfig, "retries"),
        ("--concurrency", EvalConfig, "concurrency"),
        ("--tool-parser", ModelConfig, "tool_parser"),
    ]:
        assert f"(default: {model.model_fields[field].default})" in eval_options[flag].help
    workers = built["process"]["--max-num-workers"]
    assert f"(default: {EnvConfig.model_fields['max_num_workers'].default})" in workers.help
    assert workers.min == 1 and eval_options["--retries"].min == 0  # the fields' ge


def test_sandbox_choices_are_the_kinds_registered_when_the_command_is_built() -> None:
    class LateKindConfig(LocalSandboxConfig):
        backend: Literal["late-kind"] = "late-kind"  # type: ignore[assignment]

    assert "late-kind" not in sandbox_kinds()
    register(LateKindConfig)
    try:
        for command in ("eval", "generate", "process"):
            sandbox = _options(command)["--sandbox"]
            assert "late-kind" in get_args(sandbox.type_descriptor.annotation), command
    finally:
        unregister("late-kind")
    assert "late-kind" not in get_args(_options("eval")["--sandbox"].type_descriptor.annotation)


def _flags(command: str, args: list[str]) -> dict[str, Any]:
    """The parameters typer parses `args` into for `command`, as the command gets them (a
    repeatable option not given: None)."""
    built = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    params = built.make_context(command, args).params
    return {k: (list(v) or None) if isinstance(v, tuple) else v for k, v in params.items()}


def test_a_flag_asks_for_the_same_configuration_on_eval_and_process() -> None:
    shared = ["--model", "m1", "--base-url", "http://127.0.0.1:9/v1", "--sandbox", "docker"]
    shared += ["--ray", "auto"]
    evals = _flags("eval", ["some-task", *shared])
    processes = _flags("process", ["terminal_test", *shared])
    eval_data = opt.config_data(None, opt.overrides(eval_command, evals), None)
    eval_config = EvalConfig.model_validate(opt.with_sandbox(eval_data, ray=evals["ray"]))
    env = build_environment(
        "terminal_test",
        None,
        None,
        ray=processes["ray"],
        flags=opt.overrides(process_command, processes),
    )
    assert eval_config.model is not None and env.config.model is not None
    assert eval_config.model.model_dump() == env.config.model.model_dump()
    assert eval_config.model.model == "m1" and eval_config.model.api == "chat"
    assert eval_config.sandbox.model_dump() == env.config.sandbox.model_dump()
    assert eval_config.sandbox.backend == "ray"
    assert eval_config.sandbox.inner.backend == "docker"  # type: ignore[union-attr]


def test_flags_sit_between_the_config_file_and_set(tmp_path: Any) -> None:
    """--config, then the flags, then --set, on eval and process alike."""
    config = tmp_path / "c.yaml"
    config.write_text("model: {model: from-file, tool_parser: from-file}\n")
    sets = ["model.tool_parser=from-set"]
    for command, first in (("eval", "some-task"), ("process", "terminal_test")):
        flags = _flags(command, [first, "--model", "from-flag"])
        target = eval_command if command == "eval" else process_command
        data = opt.config_data(config, opt.overrides(target, flags), sets)
        assert data["model"] == {"model": "from-flag", "tool_parser": "from-set"}, command


def _subcommand_options(*path: str) -> dict[str, Any]:
    group: Any = typer.main.get_command(app)
    for name in path:
        group = group.commands[name]
    return {p.opts[0]: p for p in group.params if p.opts[0].startswith("--")}


def test_commands_that_open_a_kinds_default_config_offer_the_registrys_kinds() -> None:
    """`check` takes any host kind, `swe generate` and `bench swe` an isolated one: the same
    option from the one layer, in the Sandbox panel, its choices read from the registry."""
    wanted = {
        ("check",): sandbox_kinds(place="host"),
        ("swe", "generate"): sandbox_kinds(place="host", isolated=True),
        ("bench", "swe"): sandbox_kinds(place="host", isolated=True),
    }
    for path, kinds in wanted.items():
        option = _subcommand_options(*path)["--sandbox"]
        assert get_args(option.type_descriptor.annotation) == kinds, path
        assert (option.default, option.help, option.rich_help_panel) == (
            "local",
            "sandbox backend",
            "Sandbox",
        ), path
    assert "unsafe-local" in wanted[("check",)]
    assert "unsafe-local" not in wanted[("swe", "generate")]
