"""Hugging Face datasets through `datasets.load_dataset` (the `datasets` extra).

The Hub is asked only when the dataset is not in the local cache, as `datasets` does; with
HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) it is never asked and the cache is used alone.
`datasets` 4 and later run no dataset scripts, so a Hub dataset brings data, not code.
A Hub that cannot be reached is a `HubUnreachable` that says what to do about it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clotho.data.files import plain
from clotho.data.record import Record
from clotho.data.source import DatasetSource
from clotho.errors import ConfigError

INSTALL_HINT = "pip install 'clotho-rl[datasets]'"


class HubUnreachable(ConfigError):
    """The dataset is neither in the local cache nor reachable on the Hub."""


def _datasets(source: DatasetSource) -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            f"{source.label}: reading a Hugging Face dataset needs the `datasets` package: "
            f"{INSTALL_HINT} (or convert it to a .jsonl/.parquet file)"
        ) from exc
    return datasets


def offline_mode(datasets: Any) -> bool:
    return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False))


def unreachable(source: DatasetSource, datasets: Any, exc: BaseException) -> HubUnreachable:
    cache = source.cache_dir or datasets.config.HF_DATASETS_CACHE
    if offline_mode(datasets):
        return HubUnreachable(
            f"{source.label}: not in the local datasets cache ({cache}), and offline mode is on "
            "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE): load it once where the Hub is reachable "
            "into the same cache (cache_dir, or HF_DATASETS_CACHE), or give a local file"
        )
    reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
    return HubUnreachable(
        f"{source.label}: cannot reach the Hugging Face Hub ({reason}), and the dataset is not "
        f"in the local datasets cache ({cache}). Without network: fill that cache where the "
        "Hub is reachable and set HF_HUB_OFFLINE=1 here (the cache is then read without "
        "asking the Hub), or give a local .jsonl/.json/.parquet file"
    )


def _load(source: DatasetSource, datasets: Any) -> Any:
    try:
        loaded = datasets.load_dataset(
            source.hub,
            name=source.config,
            split=source.split,
            revision=source.revision,
            streaming=source.streaming,
            cache_dir=source.cache_dir,
        )
    except ConnectionError as exc:  # includes datasets' OfflineModeIsEnabled
        raise unreachable(source, datasets, exc) from exc
    except (ValueError, OSError, RuntimeError, datasets.exceptions.DatasetsError) as exc:
        # No such dataset or split, a gated dataset without a token, a script-based dataset.
        problem = str(exc).strip()[:400] or type(exc).__name__
        raise ConfigError(f"{source.label}: cannot load the dataset: {problem}") from exc
    if isinstance(loaded, datasets.DatasetDict | datasets.IterableDatasetDict):
        splits = sorted(loaded)
        if len(splits) != 1:
            raise ConfigError(
                f"{source.label}: the dataset has the splits {', '.join(splits)}: "
                "choose one with `split` (hf:NAME?split=...)"
            )
        loaded = loaded[splits[0]]
    return loaded


def read_hub(source: DatasetSource) -> Iterator[Record]:
    datasets = _datasets(source)
    rows = iter(_load(source, datasets))
    index = 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except ConnectionError as exc:  # a stream cut off
            raise unreachable(source, datasets, exc) from exc
        except Exception as exc:  # a shard that cannot be decoded: no row after it is reachable
            yield Record.failed(
                f"{source.label}[{index}:]",
                index + 1,
                f"rows from {index} on cannot be read: {type(exc).__name__}: {str(exc)[:300]}",
            )
            return
        yield Record(f"{source.label}[{index}]", index + 1, plain(dict(row)))
        index += 1
