"""Turn what fsspec and its backends raise for common mistakes into one-line `DataflowError`s.

The backends (s3fs/botocore, gcsfs/google-auth, adlfs/azure, aiohttp for http) are optional and each
raises its own types, so they are recognised by class name along the exception's cause chain, without
importing any of them. Each message names the URL, what is wrong and what to do.
"""

from __future__ import annotations

from typing import Iterator
from urllib.parse import urlsplit

from dataflow.errors import (ConfigError, CredentialsError, DataflowError, MissingDependencyError, StorageError,
                             UnreachableError)

# scheme -> (package, the extra that provides it)
BACKENDS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure"),
            "adl": ("adlfs", "azure"), "http": ("aiohttp", None), "https": ("aiohttp", None),
            "hf": ("huggingface_hub", None)}
DOCS = "see docs/object-storage.md"
CREDENTIALS_HINT = {
    "s3": "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
          "storage_options={'key': ..., 'secret': ...}",
    "gs": "run `gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a "
          "service-account key file",
    "az": "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_CONNECTION_STRING), "
          "or pass storage_options={'account_name': ..., 'account_key': ...}",
}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "DefaultCredentialsError", "RefreshError", "ClientAuthenticationError"}
_UNREACHABLE = {"ClientConnectorError", "ClientConnectorDNSError", "ClientConnectorCertificateError",
                "ServerTimeoutError", "ConnectionTimeoutError", "EndpointConnectionError", "ConnectTimeoutError",
                "ConnectionRefusedError", "gaierror", "ConnectError", "ServiceRequestError"}
QUOTED_CHARS = 200  # the most of an error's own text that a message quotes
_DENIED_WORDS = ("AccessDenied", "Access Denied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden",
                 "ExpiredToken", "AuthorizationFailure", "AuthenticationFailed")


def scheme(url: str) -> str:
    """The URL's scheme, normalised to a credentials family (`s3`, `gs`, `az`) where there is one."""
    s = url.split("://", 1)[0].lower() if "://" in url else "file"
    return {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}.get(s, s)


def chain(e: BaseException) -> Iterator[BaseException]:
    """`e`, then what caused it (explicitly or while handling), without loops."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def explain(url: str, e: BaseException) -> DataflowError | None:
    """A one-line error for a common mistake behind `e` (raised while reading `url`), else None."""
    for err in chain(e):
        if isinstance(err, DataflowError):
            return err
        name = type(err).__name__
        if isinstance(err, ImportError):
            return missing_backend(url, err)
        if isinstance(err, ValueError) and "Protocol not known" in str(err):
            return ConfigError(f"{url}: unknown URL scheme {url.split('://')[0]!r}; use a local path or an "
                               f"fsspec URL such as s3://, gs://, az://, https://")
        if name in _NO_CREDENTIALS:
            return no_credentials(url, err)
        if isinstance(err, PermissionError) or _status(err) in (401, 403) or \
                any(w in str(err) for w in _DENIED_WORDS):
            return denied(url, err)
        if name in _UNREACHABLE or isinstance(err, (ConnectionRefusedError, TimeoutError)):
            return unreachable(url, err)
    return None


def missing_backend(url: str, e: BaseException) -> MissingDependencyError:
    s = url.split("://", 1)[0].lower()
    package, extra = BACKENDS.get(s, (getattr(e, "name", None) or "the fsspec backend for it", None))
    install = f"pip install 'dataflow-lm[{extra}]'" if extra else f"pip install {package}"
    return MissingDependencyError(f"{url}: reading {s}:// URLs needs {package}, which is not installed; "
                                  f"run: {install}")


def no_credentials(url: str, e: BaseException) -> CredentialsError:
    hint = CREDENTIALS_HINT.get(scheme(url), "pass credentials in storage_options")
    return CredentialsError(f"{url}: no credentials found ({first_line(e)}); {hint}; {DOCS}")


def denied(url: str, e: BaseException) -> DataflowError:
    if scheme(url) == "file":
        return ConfigError(f"{url}: permission denied ({first_line(e)}); check the file's and folders' permissions")
    hint = CREDENTIALS_HINT.get(scheme(url), "check the credentials in storage_options")
    return CredentialsError(f"{url}: access denied ({first_line(e)}); the credentials in use cannot read it: "
                            f"check them and the bucket's permissions ({hint})")


def unreachable(url: str, e: BaseException) -> UnreachableError:
    host = urlsplit(url).netloc if scheme(url) in ("http", "https") else f"the {scheme(url)}:// endpoint"
    return UnreachableError(f"{url}: cannot reach {host} ({first_line(e)}); check the URL, the network, "
                            f"proxies and, for S3-compatible stores, the endpoint_url; {DOCS}")


def server_error(e: BaseException) -> BaseException | None:
    """The server's answer in `e`'s chain when it is an HTTP error other than "not found" (fsspec's http
    filesystem reports every failed request as FileNotFoundError, with the answer as its cause)."""
    return next((err for err in chain(e) if _status(err) not in (None, 404, 410)), None)


def read_failed(url: str, e: BaseException) -> StorageError:
    """Any other failure to read a remote file (a server error, a broken transfer)."""
    return StorageError(f"{url}: cannot read it ({type(e).__name__}: {first_line(e)}); check the URL and the "
                        "server, then retry")


def _status(e: BaseException) -> int | None:
    status = getattr(e, "status", None) or getattr(e, "status_code", None)
    return status if isinstance(status, int) else None


def first_line(e: BaseException, limit: int = QUOTED_CHARS) -> str:
    """What an error says, as a message quotes it: its first non-blank line, at most `limit` characters. A
    server that answers garbage makes an exception of its bytes (tens of KB escaped on one line), and a
    message quotes only a few hundred characters of what it received."""
    text = next((line.strip() for line in str(e).splitlines() if line.strip()), "") or type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
