"""dataflow: keep GPUs fed.

The public face: `ShardWriter`, `StreamingDataset`, `StreamingDataLoader`, `DevicePrefetcher`,
`StarvationMonitor` and `DataflowError`. Torch-dependent names load on first use, so the
preprocessing CLI starts without importing torch.
"""

from __future__ import annotations

from typing import Any

from dataflow.errors import (CacheFullError, CacheUnwritable, ConfigError, CredentialsError, DataflowError,
                             FormatError, InputError, InputNotFoundError, MissingDependencyError, NotADatasetError,
                             StorageError, TrainingAborted, UnreachableError, WorkerDied)
from dataflow.formats.manifest import TokenizerMeta
from dataflow.formats.writer import ShardWriter
from dataflow.version import __version__

_LAZY = {
    "StreamingDataset": "dataflow.loading.dataset",
    "StreamingDataLoader": "dataflow.loading.loader",
    "DevicePrefetcher": "dataflow.loading.prefetch",
    "StarvationMonitor": "dataflow.profiling.monitor",
}

__all__ = ["ShardWriter", "TokenizerMeta", "DataflowError", "InputError", "InputNotFoundError", "FormatError",
           "ConfigError", "StorageError", "WorkerDied", "TrainingAborted", "NotADatasetError", "MissingDependencyError",
           "CredentialsError", "UnreachableError", "CacheFullError", "CacheUnwritable", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dataflow' has no attribute {name!r}")
