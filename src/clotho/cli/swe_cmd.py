"""`clotho swe generate|build-examples` and `clotho bench swe`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from clotho.cli import options as opt
from clotho.cli.running import user_errors
from clotho.sandbox.config import SandboxConfigBase, config_type

app = typer.Typer(help="SWE instances: generate them from a repository.", no_args_is_help=True)
console = Console()


def _sandbox(backend: str) -> SandboxConfigBase:
    return config_type(backend)()


@app.command("generate")
def generate_command(
    repo: Annotated[Path, typer.Argument(help="a git repository with a pytest suite (HEAD)")],
    out: Annotated[Path, typer.Option(help="instances file to write (.jsonl)")],
    n: Annotated[int, typer.Option(min=1, help="instances wanted")] = 10,
    seed: Annotated[int, typer.Option(help="which bugs are tried, in which order")] = 0,
    max_tries: Annotated[int | None, typer.Option(help="suite runs at most (default: 6 n)")] = None,
    sandbox: opt.IsolatedSandboxKind = "local",
    repo_field: Annotated[
        str | None,
        typer.Option(help="what the records' `repo` says (default: the repository's path)"),
    ] = None,
) -> None:
    """Inject bugs into REPO's source, keep those that break a passing test and no other
    (validated by running the suite in a sandbox), and write them as SWE instances."""
    from clotho.swe.generate import generate, write_jsonl

    with user_errors(console):
        found = asyncio.run(
            generate(
                repo, n=n, seed=seed, max_tries=max_tries, sandbox_config=_sandbox(sandbox),
                repo_field=repo_field, progress=lambda m: console.print(f"[dim]{m}[/]"),
            )
        )  # fmt: skip
        write_jsonl(found, out)
    console.print(f"{len(found)} instances in {out}")
    if len(found) < n:
        console.print(f"[yellow]fewer than {n}: try a larger --max-tries or another --seed[/]")


@app.command("build-examples")
def build_examples_command(
    dest: Annotated[Path, typer.Option(help="folder of repositories to make")] = Path(
        "~/.cache/clotho/swe/mirrors"
    ),
) -> None:
    """Build the bundled toy repositories (examples/swe/toy/) with their bug commits: a
    folder to pass as --repos-dir (clotho finds them by itself without it, too)."""
    from clotho.swe.examples import build_toys

    with user_errors(console):
        repos = build_toys(dest.expanduser())
    console.print(f"{len(repos)} repositories in {dest}")


def swe_bench_command(
    sandbox: opt.IsolatedSandboxKind = "local",
    instances: Annotated[
        Path | None, typer.Option(help="instance file (default: the bundled toy instances)")
    ] = None,
    instance: Annotated[
        str | None, typer.Option(help="which instance (default: the first)")
    ] = None,
    repos_dir: Annotated[Path | None, typer.Option(help="folder of git mirrors")] = None,
    rollouts: Annotated[int, typer.Option(min=2, help="rollouts measured")] = 20,
    json_: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Time to a ready SWE workspace from the warm cache (p50 over the rollouts) beside a
    fresh git clone of the same repository, and verification time per instance."""
    from clotho.bench.swe_bench import run_swe_bench
    from clotho.swe.examples import TOY_INSTANCES

    say = (lambda m: None) if json_ else (lambda m: console.print(f"[dim]{m}[/]"))
    with user_errors(console):
        result = asyncio.run(
            run_swe_bench(
                instances=instances or TOY_INSTANCES, instance_id=instance, repos_dir=repos_dir,
                sandbox=_sandbox(sandbox), rollouts=rollouts, progress=say,
            )
        )  # fmt: skip
    if json_:
        print(result.model_dump_json())
        return
    table = Table(title=f"SWE workspace and verification: {result.instance} ({result.backend})")
    table.add_column("measure")
    table.add_column("p50 (ms)", justify="right")
    table.add_column("baseline p50 (ms)", justify="right")
    table.add_row(
        "workspace ready, warm cache", f"{result.workspace_ready_p50_ms:.1f}",
        f"git clone {result.git_clone_p50_ms:.1f}",
    )  # fmt: skip
    if result.workspace_no_install_cache_p50_ms is not None:
        table.add_row(
            "workspace ready, install cache off", f"{result.workspace_no_install_cache_p50_ms:.1f}",
            f"saved per rollout {result.install_saved_p50_ms or 0:.1f}",
        )  # fmt: skip
    if result.install_first_ms is not None:
        size = (result.install_cached_bytes or 0) / 1e6
        table.add_row("first install + capture", f"{result.install_first_ms:.0f}", f"{size:.1f} MB")
    table.add_row("verification (FAIL_TO_PASS + PASS_TO_PASS)", f"{result.verify_p50_ms:.0f}", "")
    table.add_row("first snapshot (fetch + checkout)", f"{result.first_snapshot_ms:.0f}", "")
    console.print(table)
