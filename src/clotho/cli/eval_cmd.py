"""`clotho eval`: run agents on task directories and report pass rates."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from clotho.agent.factory import agent_kinds
from clotho.cli.config_io import apply_sets, load_config_file, merge, resumed
from clotho.cli.running import run_async, user_errors
from clotho.cli.sft_options import (
    SftAllOpt,
    SftDedupOpt,
    SftErrorsOpt,
    SftFormatOpt,
    SftMinRewardOpt,
    SftOutOpt,
    SftTokenizerOpt,
    load_sft_tokenizer,
    print_sft,
    sft_from_flags,
)
from clotho.errors import UNSCORED_KINDS, ConfigError
from clotho.runs.eval import run_eval
from clotho.runs.records import EvalConfig, RunMetrics, TrialRecord
from clotho.runs.tracking import require_wandb, track_run
from clotho.sandbox.config import sandbox_kinds
from clotho.sandbox.remote_config import CREATE_CAPPED, DEFAULT_CREATE_CONCURRENCY

if TYPE_CHECKING:
    from clotho.chat.tokenizer import TemplateTokenizer
    from clotho.export.sft import SftOptions

console = Console(stderr=True)


def _split(values: list[str] | None) -> list[str]:
    return [part.strip() for v in values or [] for part in v.split(",") if part.strip()]


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


class _Live:
    """Rich progress with the live pass rate."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task_id = progress.add_task("eval", total=0, rate="-")
        self.scored = 0
        self.passed = 0
        self.errors = 0

    def __call__(self, event: str, data: object) -> None:
        if event == "start":
            assert isinstance(data, dict)
            self.progress.update(self.task_id, total=data["pending"])
            skipped = data.get("skipped") or []
            if skipped:
                self.progress.console.print(
                    f"  [yellow]skipped[/] {len(skipped)} task(s) known not to run on this "
                    f"backend: {escape(', '.join(skipped))} (--set default_skips=false runs them)"
                )
        elif event == "trial_end":
            assert isinstance(data, TrialRecord)
            if not data.scored:
                self.errors += 1
            else:
                self.scored += 1
                self.passed += data.passed
            mark = "[green]pass" if data.passed else "[red]fail"
            if data.error is not None:
                mark = f"[yellow]{data.error.kind} error"
            self.progress.console.print(
                f"  {mark}[/] {escape(data.task)} #{data.attempt} "
                f"(reward {data.reward}, {data.duration_s:.1f} s)"
                + (f" — {escape(data.error.message[:200])}" if data.error else "")
            )
            rate = f"{self.passed / self.scored:.1%}" if self.scored else "-"
            self.progress.update(
                self.task_id, advance=1, rate=f"{rate} ({self.errors} unscored errors)"
            )
        elif event == "trial_retry":  # the lost try; its retry ends with trial_end
            assert isinstance(data, TrialRecord)
            message = data.error.message[:200] if data.error else ""
            self.progress.console.print(
                f"  [yellow]retrying[/] {escape(data.task)} #{data.attempt} — {escape(message)}"
            )
        elif event == "task_error":
            assert isinstance(data, TrialRecord)
            if data.attempt == 0 and data.error is not None:
                self.progress.console.print(
                    f"  [yellow]invalid task[/] {escape(data.error.message)}"
                )


# What a resumed run may change: how fast it goes, never what it measures.
RESUMABLE_CHANGES = {"concurrency", "prewarm", "force_build", "retries", "retry_budget"}


# Sandbox settings that lower isolation below the default, and the flag that asks for each.
# A run folder is anyone's to edit: a resume takes these from its config.json only when the
# same command line asks for them again.
_LOWERED_ISOLATION: dict[tuple[str, Any], str] = {
    ("backend", "unsafe-local"): "--sandbox unsafe-local",
    ("network", True): "--network",
    ("cgroup_limits", False): "--set {path}=false",
    ("slot_isolation", "none"): "--set {path}=none",
}


def _lowered_isolation(sandbox: Any, prefix: str = "sandbox") -> dict[str, tuple[Any, str]]:
    """{setting path: (value, flag)} for each isolation-lowering setting in `sandbox`,
    nested ones (a cluster backend's `inner`) included."""
    found: dict[str, tuple[Any, str]] = {}
    if not isinstance(sandbox, dict):
        return found
    for key, value in sandbox.items():
        path = f"{prefix}.{key}"
        if isinstance(value, dict):
            found.update(_lowered_isolation(value, path))
            continue
        for (name, lowered), flag in _LOWERED_ISOLATION.items():
            if key == name and value == lowered and type(value) is type(lowered):
                found[path] = (value, flag.format(path=path))
    return found


def _check_isolation(out: Path, saved: dict[str, Any], given: dict[str, Any]) -> None:
    """Refuse a resume whose saved configuration runs with less isolation than this command
    line asks for (see `_LOWERED_ISOLATION`)."""
    asked = _lowered_isolation(given.get("sandbox"))
    missing = {
        path: flag
        for path, (value, flag) in _lowered_isolation(saved.get("sandbox")).items()
        if path not in asked or asked[path][0] != value
    }
    if missing:
        settings = ", ".join(f"{path}={saved_value(saved, path)}" for path in missing)
        flags = " ".join(dict.fromkeys(missing.values()))
        host = (
            " (unsafe-local runs the tasks' code on this host, as you)"
            if any(flag.startswith("--sandbox") for flag in missing.values())
            else ""
        )
        raise ConfigError(
            f"{out / 'config.json'} asks for less isolation than the default: {settings}"
            f"{host}. A resume never takes that from a run folder alone: to continue this run "
            f"so, give {flags} again (and check the file if you did not write it)"
        )


def saved_value(data: dict[str, Any], path: str) -> Any:
    value: Any = data
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return json.dumps(value)


def _resumed(out: Path | None, given: dict[str, Any], ray: str | None = None) -> dict[str, Any]:
    if out is None:
        raise ConfigError("--resume needs the run directory: --out DIR")
    saved_path = out / "config.json"
    if not saved_path.is_file():
        raise ConfigError(f"{out} holds no run to resume (no config.json)")
    saved = load_config_file(saved_path)
    asked = given
    if ray and (given.get("sandbox") or {}).get("backend") != "ray":  # as --ray will wrap it
        inner = {"backend": "local", **(given.get("sandbox") or {})}
        asked = {**given, "sandbox": {"backend": "ray", "address": ray, "inner": inner}}
    _check_isolation(out, saved, asked)
    return resumed(saved, given, RESUMABLE_CHANGES)


def print_report(metrics: RunMetrics, out: Path) -> None:
    table = Table(title="pass rate by category")
    table.add_column("category")
    table.add_column("passed", justify="right")
    table.add_column("n", justify="right")
    table.add_column("pass rate", justify="right")
    for name, cat in metrics.by_category.items():
        rate = f"{cat.pass_rate:.1%}" if cat.pass_rate is not None else "-"
        table.add_row(escape(name), str(cat.n_passed), str(cat.n), rate)
    overall = f"{metrics.pass_rate:.1%}" if metrics.pass_rate is not None else "-"
    table.add_row("[bold]all", str(metrics.n_passed), str(metrics.n_scored), f"[bold]{overall}")
    console.print(table)
    if metrics.pass_rate_ci95:
        lo, hi = metrics.pass_rate_ci95
        console.print(f"95% interval of the pass rate: {lo:.1%} to {hi:.1%}")
    if metrics.pass_at_k:
        console.print("pass@k: " + ", ".join(f"@{k} {v:.1%}" for k, v in metrics.pass_at_k.items()))
    if metrics.errors:
        console.print(
            "errors: "
            + ", ".join(f"{k} {v}" for k, v in sorted(metrics.errors.items()))
            + f" ({' and '.join(sorted(UNSCORED_KINDS))} errors are not counted in the pass rate)"
        )
    if metrics.timings:
        console.print(
            "time per attempt (p50 / p95): "
            + ", ".join(
                f"{phase.removesuffix('_s')} {t.p50_s:.2f} / {t.p95_s:.2f} s"
                for phase, t in metrics.timings.items()
            )
        )
    console.print(f"results in {out}")


def _export_sft(
    run_dir: Path, path: Path, options: SftOptions, tokenizer: TemplateTokenizer | None
) -> None:
    """The run's trajectories as SFT data, read back from the run directory."""
    from clotho.export.sources import trajectories_from_run
    from clotho.export.writer import export_sft

    with user_errors(console):
        stats = export_sft(trajectories_from_run(run_dir), path, options, tokenizer)
    print_sft(console, path, stats)


def eval_command(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="task directories or folders of them")
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML/JSON file with an EvalConfig")] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="override a config field: key.path=value")
    ] = None,
    agent: Annotated[
        Literal[tuple(agent_kinds())] | None,  # clotho's own and the registered installed ones
        typer.Option(
            help="who does the task: llm (clotho's agent), oracle, nop, or an installed agent "
            "run in the sandbox behind the model gateway (default: llm)"
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="model name for --agent llm (default: the embedded SmolLM2-135M)"),
    ] = None,
    api: Annotated[
        Literal["chat", "vllm", "sglang", "local"] | None,
        typer.Option(
            help="chat: OpenAI chat completions; vllm / sglang: token ids in and out, exact "
            "tokens and logprobs; local: the embedded model (default when no --base-url)"
        ),
    ] = None,
    tokenizer: Annotated[
        str | None, typer.Option(help="tokenizer.json or its folder, for --api vllm/sglang")
    ] = None,
    tool_parser: Annotated[
        str | None, typer.Option(help="tool-call format for token APIs (default: hermes)")
    ] = None,
    base_url: Annotated[
        list[str] | None, typer.Option(help="OpenAI-compatible base URL; repeat to balance")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="environment variable with the API key (default: OPENAI_API_KEY)"),
    ] = None,
    temperature: Annotated[float | None, typer.Option(help="sampling temperature")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="max tokens per model reply")] = None,
    max_turns: Annotated[
        int | None, typer.Option(help="max model turns per attempt (default: 30)")
    ] = None,
    sandbox: Annotated[
        Literal[sandbox_kinds(place="host")] | None,  # the kinds registered when it is built
        typer.Option(help="sandbox backend (default: local)"),
    ] = None,
    network: Annotated[
        bool | None,
        typer.Option(
            "--network/--no-network",
            help="let sandboxes have a network (the local backend's is guarded: the host's own "
            "services stay out of reach): a Harbor task's only when it asks "
            "([environment] allow_internet = true), other formats' always (default: off; a "
            "task that asks is then refused)",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="spread the sandboxes over a Ray cluster: its address, or auto (extra ray); "
            "--sandbox says what each node runs"
        ),
    ] = None,
    create_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="sandboxes being created at once on a cluster backend (ray, modal, nomad: "
            f"sandbox.create_concurrency, default {DEFAULT_CREATE_CONCURRENCY}); only "
            "creation waits, not the rollouts",
        ),
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(help="attempts running at once (default: 4)")
    ] = None,
    attempts: Annotated[
        int | None, typer.Option(help="attempts per task, for pass@k (default: 1)")
    ] = None,
    retries: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="run an attempt lost to an infra error (a lost node, a broken backend, a "
            "model outage) again within the run, up to N times (default: 2)",
        ),
    ] = None,
    retry_budget: Annotated[
        int | None,
        typer.Option(
            min=0, help="retries in the whole run (default: max(2 x concurrency, attempts / 4))"
        ),
    ] = None,
    task_timeout: Annotated[
        float | None, typer.Option(help="wall-clock seconds per attempt, agent + verification")
    ] = None,
    filter: Annotated[
        list[str] | None, typer.Option(help="only these tasks (names or globs, comma-separated)")
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            "--skip-tasks",
            "--skip",
            help="skip these tasks (names or globs, comma-separated; repeat for more), beside "
            "the backend's default skip list",
        ),
    ] = None,
    system_prompt: Annotated[
        str | None,
        typer.Option(
            help="the model agent's system prompt: TEXT, or @FILE to read it from a file "
            "({workdir} is filled in; default: clotho's own)"
        ),
    ] = None,
    verifier_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001, help="seconds for every task's verifier, instead of the task's own"
        ),
    ] = None,
    command_timeout: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="seconds each command the agent runs may take, at most (also its default)",
        ),
    ] = None,
    force_build: Annotated[
        bool | None, typer.Option("--force-build", help="rebuild task images even if cached")
    ] = None,
    repos_dir: Annotated[
        Path | None,
        typer.Option(help="SWE instances: folder of git mirrors for owner/name repositories"),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="run directory")] = None,
    resume: Annotated[
        bool, typer.Option(help="continue the run in --out with its saved configuration")
    ] = False,
    wandb: Annotated[
        str | None,
        typer.Option("--wandb", help="log the run to this Weights & Biases project (extra wandb)"),
    ] = None,
    sft_out: SftOutOpt = None,
    sft_format: SftFormatOpt = "chat",
    sft_min_reward: SftMinRewardOpt = None,
    sft_all: SftAllOpt = False,
    sft_errors: SftErrorsOpt = None,
    sft_tokenizer: SftTokenizerOpt = None,
    sft_dedup: SftDedupOpt = True,
) -> None:
    """Run an agent on Harbor / Terminal-Bench tasks and report pass rates.

    Settings come from --config, then the flags, then --set overrides; the resolved
    configuration is written to the run directory as config.json. With --sft-out, the
    trajectories are also written as SFT data once the run ends, from the run directory (so a
    resumed run's file holds every attempt; `clotho export sft DIR` writes it any time).
    """
    with user_errors(console):
        if wandb:
            require_wandb()
        sft = sft_from_flags(
            sft_out,
            format=sft_format,
            min_reward=sft_min_reward,
            keep_all=sft_all,
            errors=sft_errors,
            tokenizer=sft_tokenizer,
            dedup=sft_dedup,
        )
        sft_tok = load_sft_tokenizer(sft)
        data = load_config_file(config) if config else {}
        flags: dict[str, Any] = {
            "paths": [str(p) for p in paths] if paths else None,
            "agent": agent,
            "concurrency": concurrency,
            "attempts": attempts,
            "retries": retries,
            "retry_budget": retry_budget,
            "task_timeout_s": task_timeout,
            "max_turns": max_turns,
            "filter": _split(filter) or None,
            "skip": _split(skip) or None,
            "system_prompt": system_prompt_text(system_prompt),
            "verifier_timeout_s": verifier_timeout,
            "command_timeout_s": command_timeout,
            "force_build": force_build,
            "swe": {"repos_dir": str(repos_dir.resolve())} if repos_dir else None,
        }
        model_flags = {
            "model": model,
            "api": api,
            "tokenizer": tokenizer,
            "tool_parser": tool_parser,
            "base_url": base_url,
            "api_key_env": api_key_env,
            "sampling": {
                k: v
                for k, v in {"temperature": temperature, "max_tokens": max_tokens}.items()
                if v is not None
            }
            or None,
        }
        model_flags = {k: v for k, v in model_flags.items() if v is not None}
        if model_flags:
            flags["model"] = model_flags
        sandbox_flags = {
            k: v for k, v in {"backend": sandbox, "network": network}.items() if v is not None
        }
        if sandbox_flags:
            flags["sandbox"] = sandbox_flags
        data = merge(data, {k: v for k, v in flags.items() if v is not None})
        data = apply_sets(data, set_ or [])
        if resume:
            data = _resumed(out, data, ray)
        if not data.get("paths"):
            raise ConfigError("give at least one task path (argument or `paths:` in --config)")
        data.setdefault("sandbox", {}).setdefault("backend", "local")
        if ray and data["sandbox"]["backend"] != "ray":
            data["sandbox"] = {"backend": "ray", "address": ray, "inner": data["sandbox"]}
        if create_concurrency is not None:
            if data["sandbox"]["backend"] not in CREATE_CAPPED:
                raise ConfigError(
                    f"--create-concurrency caps sandbox creation on {', '.join(CREATE_CAPPED)}; "
                    f"this run's sandboxes are {data['sandbox']['backend']}"
                )
            data["sandbox"]["create_concurrency"] = create_concurrency
        eval_config = EvalConfig.model_validate(data)
    out = out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{eval_config.agent}"
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("pass rate {task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        metrics = run_async(
            run_eval(eval_config, out, resume=resume, listener=_Live(progress)),
            console,
            interrupted=f"finished attempts are kept in {out}; "
            f"continue with: clotho eval --out {out} --resume"
            + (f" (it writes {sft_out} at the end)" if sft_out else ""),
        )
    print_report(metrics, out)
    if sft_out and sft:
        _export_sft(out, sft_out, sft, sft_tok)
    if wandb:
        with user_errors(console):
            track_run(out, wandb)
