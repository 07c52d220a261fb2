"""One error type per class of user-facing failure.

The CLI turns any `DataflowError` into one line on stderr: exit code 2 for a `ConfigError` (a mistake
the user fixes by changing what they pass or set up: a setting, a path that is not a dataset, missing
credentials, a missing optional package, an unreachable host), 1 for the others. Everything else is a
bug and keeps its traceback. With `--debug` or `DATAFLOW_DEBUG=1` the CLI shows the full traceback,
and the errors raised here keep the exception that caused them.
"""

from __future__ import annotations



class DataflowError(Exception):
    """A failure the user can act on; the message names the file or setting and what to do."""


class InputError(DataflowError):
    """Bad input data: an unreadable file, a malformed record, too many bad records."""


class FormatError(DataflowError):
    """A dataset on disk that does not match its manifest: corrupt, truncated or unknown version."""


class ConfigError(DataflowError):
    """A setting that cannot work: an unknown key, a value out of range, a refused rerun."""


class InputNotFoundError(ConfigError, InputError):
    """An input that is not there or not readable as input (a missing file, a glob matching nothing, an unsupported
    type): a usage mistake (exit 2), still an `InputError` for code that catches those."""


class NotADatasetError(ConfigError, FormatError):
    """A path given where a dataset is expected is not one: a raw file, a folder without `index.json`."""


class StorageError(DataflowError):
    """Remote storage failed: a shard could not be fetched, the server refused or kept failing."""


class MissingDependencyError(ConfigError):
    """An optional package is needed for this (gcsfs for gs://, s3fs for s3://, ...): install it."""


class CredentialsError(ConfigError, StorageError):
    """Object storage refused for lack of (valid) credentials, or they do not grant access."""


class UnreachableError(ConfigError, StorageError):
    """The host or endpoint of a URL cannot be reached (no such host, connection refused, timeout)."""


class WorkerDied(DataflowError):
    """A loader worker process exited without reporting an error (killed, out of memory, segfault)."""


class TrainingAborted(DataflowError):
    """Training cannot go on (e.g. too many non-finite steps in a row)."""


class CacheFullError(StorageError):
    """The local cache's disk is full: free space, lower `cache_limit`, or move `DATAFLOW_CACHE`."""


class CacheUnwritable(ConfigError):
    """The cache folder cannot be made or written (read-only, no permission, a file in its way): point
    `DATAFLOW_CACHE` (or `cache_dir=`) at a folder you can write."""

    reason = ""  # what the system said
