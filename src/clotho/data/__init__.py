"""Datasets: records from local JSONL / JSON / Parquet files or a Hugging Face dataset.

`DatasetSource` says where and how (split, subset, streaming, field mapping, limit);
`read_records` yields `Record`s, a bad one an error of its own; `load_records` and
`stream_records` do the reading in a worker thread for async callers.
"""

from clotho.data.hub import HubUnreachable
from clotho.data.read import load_records, peek, read_records, stream_records
from clotho.data.record import Record, remap
from clotho.data.source import HUB_PREFIX, DatasetSource, source_list

__all__ = [
    "HUB_PREFIX",
    "DatasetSource",
    "HubUnreachable",
    "Record",
    "load_records",
    "peek",
    "read_records",
    "remap",
    "source_list",
    "stream_records",
]
