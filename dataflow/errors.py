"""One error type per class of user-facing failure.

The CLI turns any `DataflowError` into one line on stderr and exit code 1; everything else is a bug
and keeps its traceback.
"""


class DataflowError(Exception):
    """A failure the user can act on; the message names the file or setting and what to do."""


class InputError(DataflowError):
    """Bad input data: an unreadable file, a malformed record, too many bad records."""


class FormatError(DataflowError):
    """A dataset on disk that does not match its manifest: corrupt, truncated or unknown version."""


class ConfigError(DataflowError):
    """A setting that cannot work: an unknown key, a value out of range, a refused rerun."""


class StorageError(DataflowError):
    """A remote shard or manifest could not be fetched: the server refused or kept failing."""


class WorkerDied(DataflowError):
    """A loader worker process exited without reporting an error (killed, out of memory, segfault)."""


class TrainingAborted(DataflowError):
    """Training cannot go on (e.g. too many non-finite steps in a row)."""
