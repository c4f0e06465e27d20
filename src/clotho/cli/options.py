"""The options `eval`, `generate`, `process`, `serve` and `evaluate` share, defined once.

Each option is an `Annotated` alias: its typer option (help panel, help text, default and
bounds read from the config model's field) and `To`, the config path its value goes to.
`overrides(command, values)` turns a command's collected flags into one nested dict, merged
into the configuration the way `--set` is (`config_data`: --config, then the flags, then
--set); `with_sandbox` fills in the default backend and the `--ray` wrapping for all. The
--sft-* options come together: `with_sft_flags` adds them all, as one `SftFlags` value.

The sandbox kinds are the registry's when typer builds a command, not when this module is
imported: `Sandbox` is made on each access (module `__getattr__`), so commands name it as
`opt.Sandbox` in their (postponed) annotations.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import annotated_types
import typer
from pydantic import BaseModel

from clotho.chat.client import ModelConfig, SamplingParams
from clotho.cli.config_io import apply_sets, load_config_file, merge
from clotho.cli.sft_options import ERROR_KIND_HELP, SftFlags
from clotho.env.config import EnvConfig
from clotho.errors import ConfigError
from clotho.runs.records import EvalConfig
from clotho.sandbox import LocalSandboxConfig
from clotho.sandbox.config import sandbox_kinds
from clotho.sandbox.remote_config import CREATE_CAPPED, RaySandboxConfig

MODEL = "Model"
SANDBOX = "Sandbox"
LIMITS = "Limits"
RUN = "Run"
OUTPUT = "Output"


@dataclass(frozen=True)
class To:
    """Where a flag's value goes in the command's configuration (a `--set` path), and how it
    is written there (`convert`; None from it leaves the setting alone)."""

    path: str
    convert: Callable[[Any], Any] | None = None


def field_option(
    model: type[BaseModel],
    name: str,
    *decls: str,
    panel: str,
    help: str | None = None,
    **extra: Any,
) -> Any:
    """A typer option for `model.name`: help from the field's description (unless given),
    its default said in the help, and its lower bound (`ge`) as the option's `min`."""
    field = model.model_fields[name]
    text = help or field.description or name
    default = field.get_default(call_default_factory=True)
    if isinstance(default, str | int | float) and not isinstance(default, bool):
        text += f" (default: {default})"
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            extra.setdefault("min", rule.ge)
    return typer.Option(*decls, help=text, rich_help_panel=panel, **extra)


def choices(model: type[BaseModel], name: str) -> Any:
    """The field's `Literal[...]` (its allowed values), for an option's type."""
    annotation = model.model_fields[name].annotation
    if typing.get_origin(annotation) is not Literal:
        raise TypeError(f"{model.__name__}.{name} is not a Literal")
    return annotation


def split_list(values: list[str] | None) -> list[str] | None:
    """Comma-separated and repeated values, as one list (None when there are none)."""
    parts = [part.strip() for v in values or [] for part in v.split(",") if part.strip()]
    return parts or None


# A system prompt read from a file is a prompt, not a book.
MAX_SYSTEM_PROMPT_BYTES = 1 << 20


def system_prompt_text(value: str | None) -> str | None:
    """`--system-prompt`: the text itself, or `@FILE` for a file's (UTF-8). The prompt's
    `{workdir}` is filled in for each attempt, so any other brace must be doubled; a prompt
    that does not format is refused here, not in the first attempt."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            with path.open("rb") as file:
                data = file.read(MAX_SYSTEM_PROMPT_BYTES + 1)
        except OSError as exc:
            why = exc.strerror or exc
            raise ConfigError(f"--system-prompt {value}: cannot read {path}: {why}") from exc
        if len(data) > MAX_SYSTEM_PROMPT_BYTES:
            raise ConfigError(f"--system-prompt {value}: larger than 1 MiB")
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"--system-prompt {value}: {path} is not UTF-8 text") from exc
    if not text.strip():
        raise ConfigError("--system-prompt is empty (leave it out for the default prompt)")
    try:
        text.format(workdir="/app")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"--system-prompt: {{workdir}} is the only field it may name ({exc!r}): write a "
            "literal brace as {{ or }}"
        ) from exc
    return text


# The configuration itself.
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        help="YAML or JSON file with the command's configuration (then the flags, then --set)",
        rich_help_panel=RUN,
    ),
]
Set = Annotated[
    list[str] | None,
    typer.Option(
        "--set", help="override a config field: key.path=value (YAML)", rich_help_panel=RUN
    ),
]

# Model: where the agent's model is and how it is asked.
Model = Annotated[
    str | None,
    field_option(
        ModelConfig,
        "model",
        panel=MODEL,
        help="model name (without --base-url or another model: the embedded one)",
    ),
    To("model.model"),
]
Api = Annotated[
    choices(ModelConfig, "api") | None,
    field_option(ModelConfig, "api", panel=MODEL),
    To("model.api"),
]
Tokenizer = Annotated[
    str | None, field_option(ModelConfig, "tokenizer", panel=MODEL), To("model.tokenizer")
]
ToolParser = Annotated[
    str | None, field_option(ModelConfig, "tool_parser", panel=MODEL), To("model.tool_parser")
]
BaseUrl = Annotated[
    list[str] | None,
    field_option(
        ModelConfig, "base_url", panel=MODEL, help="OpenAI-compatible base URL; repeat to balance"
    ),
    To("model.base_url"),
]
ApiKeyEnv = Annotated[
    str | None, field_option(ModelConfig, "api_key_env", panel=MODEL), To("model.api_key_env")
]
Temperature = Annotated[
    float | None,
    field_option(SamplingParams, "temperature", panel=MODEL, help="sampling temperature"),
    To("model.sampling.temperature"),
]
MaxTokens = Annotated[
    int | None,
    field_option(SamplingParams, "max_tokens", panel=MODEL, help="max tokens per model reply"),
    To("model.sampling.max_tokens"),
]
# An environment's own tokenizer (tokens and masks of chat rollouts): EnvConfig.tokenizer.
EnvTokenizer = Annotated[
    str | None, field_option(EnvConfig, "tokenizer", panel=MODEL), To("tokenizer")
]

# Sandbox: where the attempts run (`Sandbox` itself: see `__getattr__`).
Network = Annotated[
    bool | None,
    typer.Option(
        "--network/--no-network",
        help="let sandboxes have a network (the local backend's is guarded: the host's own "
        "services stay out of reach): a Harbor task's only when it asks "
        "(\\[environment] allow_internet = true), other formats' always (default: off; a "
        "task that asks is then refused)",
        rich_help_panel=SANDBOX,
    ),
    To("sandbox.network"),
]
Ray = Annotated[
    str | None,
    typer.Option(
        help="spread the sandboxes over a Ray cluster: its address, or auto (extra ray); "
        "--sandbox (or the config's sandbox) says what each node runs",
        rich_help_panel=SANDBOX,
    ),
]
CreateConcurrency = Annotated[
    int | None,
    field_option(
        RaySandboxConfig,
        "create_concurrency",
        panel=SANDBOX,
        help=f"sandboxes being created at once on a cluster backend ({', '.join(CREATE_CAPPED)}: "
        "sandbox.create_concurrency); only creation waits, not the rollouts",
    ),
]
SlotsPerContainer = Annotated[
    int | None,
    typer.Option(min=1, help="docker: sandboxes per container", rich_help_panel=SANDBOX),
    To("sandbox.slots_per_container"),
]
ForceBuild = Annotated[
    bool | None,
    field_option(EvalConfig, "force_build", "--force-build", panel=SANDBOX),
    To("force_build"),
]

# Limits: how long and how much each attempt may take.
MaxTurns = Annotated[
    int | None,
    field_option(EvalConfig, "max_turns", panel=LIMITS, help="max model turns per attempt"),
    To("max_turns"),
]
TaskTimeout = Annotated[
    float | None,
    field_option(
        EvalConfig,
        "task_timeout_s",
        panel=LIMITS,
        help="wall-clock seconds per attempt, agent + verification",
    ),
    To("task_timeout_s"),
]
VerifierTimeout = Annotated[
    float | None,
    field_option(
        EvalConfig,
        "verifier_timeout_s",
        panel=LIMITS,
        min=0.001,
        help="seconds for every task's verifier, instead of the task's own",
    ),
    To("verifier_timeout_s"),
]
CommandTimeout = Annotated[
    float | None,
    field_option(
        EvalConfig,
        "command_timeout_s",
        panel=LIMITS,
        min=0.001,
        help="seconds each command the agent runs may take, at most (also its default)",
    ),
    To("command_timeout_s"),
]
Retries = Annotated[
    int | None,
    field_option(
        EvalConfig,
        "retries",
        panel=LIMITS,
        help="run an attempt lost to an infra error (a lost node, a broken backend, a "
        "model outage) again within the run, up to N times",
    ),
    To("retries"),
]
RetryBudget = Annotated[
    int | None,
    field_option(
        EvalConfig,
        "retry_budget",
        panel=LIMITS,
        help="retries in the whole run (default: max(2 x concurrency, attempts / 4))",
    ),
    To("retry_budget"),
]

# Run: what runs, how much at once.
Concurrency = Annotated[
    int | None,
    field_option(
        EvalConfig,
        "concurrency",
        "--concurrency",
        "-n",
        panel=RUN,
        help="attempts (generate: prompts) running at once",
    ),
    To("concurrency"),
]
Workers = Annotated[
    int | None,
    field_option(
        EnvConfig,
        "max_num_workers",
        "--max-num-workers",
        "--concurrency",
        panel=RUN,
        help="groups in flight at once, each of --group-size rollouts",
    ),
    To("max_num_workers"),
]
GroupSize = Annotated[
    int | None, field_option(EnvConfig, "group_size", panel=RUN), To("group_size")
]
SystemPrompt = Annotated[
    str | None,
    typer.Option(
        help="the model agent's system prompt: TEXT, or @FILE to read it from a file "
        "({workdir} is filled in; default: clotho's own)",
        rich_help_panel=RUN,
    ),
    To("system_prompt", system_prompt_text),
]

# Output.
Wandb = Annotated[
    str | None,
    typer.Option(
        "--wandb",
        help="log the run to this Weights & Biases project (extra wandb)",
        rich_help_panel=OUTPUT,
    ),
]

# SFT export: with --sft-out, the run's trajectories are also written as SFT training data.
# Commands take them all at once (`with_sft_flags`), as one `SftFlags`.
SFT = "SFT export"
SftOut = Annotated[
    Path | None,
    typer.Option(
        "--sft-out",
        help="also write the trajectories as SFT training data (JSONL) to this file",
        rich_help_panel=SFT,
    ),
]
SftFormat = Annotated[
    Literal["chat", "sharegpt"],
    typer.Option(
        "--sft-format",
        help="chat: OpenAI messages with tool calls; sharegpt: LLaMA-Factory's ShareGPT",
        rich_help_panel=SFT,
    ),
]
SftMinReward = Annotated[
    float | None,
    typer.Option(
        "--sft-min-reward",
        help="keep trajectories with at least this reward (default: passed ones only)",
        rich_help_panel=SFT,
    ),
]
SftAll = Annotated[
    bool,
    typer.Option(
        "--sft-all", help="keep every trajectory, whatever its reward", rich_help_panel=SFT
    ),
]
SftErrors = Annotated[
    list[str] | None,
    typer.Option(
        "--sft-errors",
        help=f"also keep trajectories that ended in these error kinds ({ERROR_KIND_HELP}; "
        "comma-separated or repeated; default: none)",
        rich_help_panel=SFT,
    ),
]
SftTokenizer = Annotated[
    str | None,
    typer.Option(
        "--sft-tokenizer",
        help="tokenizer folder or tokenizer.json with a chat template: adds tokens and "
        "assistant masks (token-API rollouts carry their exact tokens without it)",
        rich_help_panel=SFT,
    ),
]
SftDedup = Annotated[
    bool,
    typer.Option(
        "--sft-dedup/--sft-keep-duplicates",
        help="write identical trajectories once",
        rich_help_panel=SFT,
    ),
]
# The parameters `with_sft_flags` adds, in order: (annotation, `SftFlags` field).
_SFT_PARAMETERS = {
    "sft_out": (SftOut, "out"),
    "sft_format": (SftFormat, "format"),
    "sft_min_reward": (SftMinReward, "min_reward"),
    "sft_all": (SftAll, "keep_all"),
    "sft_errors": (SftErrors, "errors"),
    "sft_tokenizer": (SftTokenizer, "tokenizer"),
    "sft_dedup": (SftDedup, "dedup"),
}


class SftCommand:
    """A command with the --sft-* options after its own: typer sees them in its signature,
    and the command gets them as one `SftFlags`, its `sft` parameter.

    The signature is made when it is read, as typer reads a command's annotations then
    (`Sandbox`'s kinds: see `__getattr__`)."""

    def __init__(self, command: Callable[..., Any]) -> None:
        functools.update_wrapper(self, command)
        self.command = command

    @property
    def __signature__(self) -> inspect.Signature:
        own = inspect.signature(self.command, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "sft"]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=getattr(SftFlags, field),
                annotation=annotation,
            )
            for name, (annotation, field) in _SFT_PARAMETERS.items()
        ]
        return own.replace(parameters=[*kept, *added])

    def __call__(self, **values: Any) -> Any:
        given = {field: values.pop(name) for name, (_, field) in _SFT_PARAMETERS.items()}
        return self.command(**values, sft=SftFlags(**given))


def with_sft_flags(command: Callable[..., Any]) -> SftCommand:
    """`command` (whose last parameter is `sft: SftFlags`) with the --sft-* options."""
    return SftCommand(command)


def __getattr__(name: str) -> Any:
    """`Sandbox` (a run's `sandbox.backend`), `SandboxKind` and `IsolatedSandboxKind` (a kind
    whose default config a command opens: `check`, `swe`): made on each access, so their
    choices are the kinds registered when typer reads a command's annotations (a kind
    registered after import is offered too)."""
    if name == "Sandbox":
        kinds = Literal[sandbox_kinds(place="host")]  # what --ray's nodes may run, too
        return Annotated[
            kinds | None,  # type: ignore[valid-type]
            typer.Option(help="sandbox backend (default: local)", rich_help_panel=SANDBOX),
            To("sandbox.backend"),
        ]
    if name in ("SandboxKind", "IsolatedSandboxKind"):
        isolated = True if name == "IsolatedSandboxKind" else None
        return Annotated[
            Literal[sandbox_kinds(place="host", isolated=isolated)],  # type: ignore[misc]
            typer.Option(help="sandbox backend", rich_help_panel=SANDBOX),
        ]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def nested(path: str, value: Any) -> dict[str, Any]:
    data: Any = value
    for part in reversed(path.split(".")):
        data = {part: data}
    return data  # type: ignore[no-any-return]


def overrides(command: Callable[..., Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration `command`'s given flags (`values`, by parameter name) ask for: each
    parameter annotated with a `To` that was given (not None) at its path."""
    data: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(command, include_extras=True).items():
        value = values.get(name)
        for to in getattr(hint, "__metadata__", ()):
            if isinstance(to, To) and value is not None:
                converted = to.convert(value) if to.convert else value
                if converted is not None:
                    data = merge(data, nested(to.path, converted))
    return data


def config_data(
    config_file: Path | None, flags: dict[str, Any], sets: list[str] | None
) -> dict[str, Any]:
    """A command's configuration before validation: --config, then the flags, then --set."""
    data = load_config_file(config_file) if config_file else {}
    return apply_sets(merge(data, flags), sets or [])


def in_ray(data: dict[str, Any], address: str) -> dict[str, Any]:
    """`data` with its sandbox (local by default) run on each node of the Ray cluster at
    `address`; a sandbox already `ray` is kept."""
    sandbox = {"backend": "local", **(data.get("sandbox") or {})}
    if sandbox["backend"] != "ray":
        sandbox = {"backend": "ray", "address": address, "inner": sandbox}
    return {**data, "sandbox": sandbox}


def with_sandbox(
    data: dict[str, Any], *, ray: str | None = None, create_concurrency: int | None = None
) -> dict[str, Any]:
    """The sandbox settings every command applies last: the default backend of a sandbox
    given without one, `--ray`'s wrapping, and `--create-concurrency` on the (wrapped)
    cluster backend."""
    backend = LocalSandboxConfig.model_fields["backend"].default
    if "sandbox" in data:
        data = {**data, "sandbox": {"backend": backend, **(data["sandbox"] or {})}}
    if ray:
        data = in_ray(data, ray)
    if create_concurrency is not None:
        kind = (data.get("sandbox") or {}).get("backend", backend)
        if kind not in CREATE_CAPPED:
            raise ConfigError(
                f"--create-concurrency caps sandbox creation on {', '.join(CREATE_CAPPED)}; "
                f"this run's sandboxes are {kind}"
            )
        data["sandbox"]["create_concurrency"] = create_concurrency
    return data
