"""`tiktoken:NAME`: an OpenAI encoding by name (r50k_base, p50k_base, cl100k_base, o200k_base), its `.tiktoken`
file found in tiktoken's own cache, where `tiktoken.get_encoding` keeps it.

tiktoken's cache is the folder TIKTOKEN_CACHE_DIR (else DATA_GYM_CACHE_DIR, else `data-gym-cache` in the system's
temporary folder), each file named by the sha1 of its URL; the URL and the file's sha256 are those tiktoken's
registry names (tiktoken_files.registry_file). A file there with that sha256 is used as it is; one that is absent
(or not the published file) is downloaded into the cache as tiktoken would, unless HF_HUB_OFFLINE is set or the
download fails: then one line says what to download and where to put it. Nothing else in the cache is touched.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from dataflow.errors import ConfigError
from dataflow.formats.atomic import atomic_open
from dataflow.tokenizers import tiktoken_files

NAMES = tiktoken_files.OPENAI_ENCODINGS
DOWNLOAD_TIMEOUT_S = (10, 60)  # connect, then each read of the download (a published file is 1-4 MB)


def is_name(source: str) -> bool:
    """Whether `tiktoken:SOURCE` names an encoding (no file of that name is here)."""
    return source in NAMES and not os.path.exists(source)


def cache_dir() -> str:
    """tiktoken's cache folder, by tiktoken's own rule (tiktoken.load.read_file_cached); "" turns caching off."""
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def named_file(name: str) -> tuple[str, bytes]:
    """(path, bytes) of the `.tiktoken` file of the encoding `name` in tiktoken's cache, downloaded into it first
    when it is not there; a ConfigError of one line when it cannot be had."""
    url, sha256 = tiktoken_files.registry_file(name)
    accepted = {sha256} | {h for h, n in tiktoken_files.EXTRA_KNOWN_FILES.items() if n == name}
    folder = cache_dir()
    path = os.path.join(folder, hashlib.sha1(url.encode()).hexdigest()) if folder else None
    found = _read(path) if path else None
    if found is not None and hashlib.sha256(found).hexdigest() in accepted:
        return path, found
    where = (f"save it as {path}" if path else "set TIKTOKEN_CACHE_DIR to a folder and save it there as "
             f"{hashlib.sha1(url.encode()).hexdigest()}")
    todo = f"download {url} and {where} (tiktoken's cache), or pass tiktoken:PATH to the file"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        what = (f"{path} in tiktoken's cache is not the published file (sha256 "
                f"{hashlib.sha256(found).hexdigest()[:16]}...)" if found is not None
                else f"not in tiktoken's cache ({folder or 'off: TIKTOKEN_CACHE_DIR is empty'})")
        raise ConfigError(f"tiktoken:{name}: {what} and HF_HUB_OFFLINE is set: {todo}")
    data = _download(name, url, todo)
    if hashlib.sha256(data).hexdigest() not in accepted:
        raise ConfigError(f"tiktoken:{name}: the download of {url} is not the published file (sha256 "
                          f"{hashlib.sha256(data).hexdigest()[:16]}..., expected {sha256[:16]}...); try again")
    if path is None:
        return url, data
    try:
        os.makedirs(folder, exist_ok=True)
        with atomic_open(path) as f:  # a whole file or none: tiktoken and the next run find it
            f.write(data)
    except OSError as e:
        raise ConfigError(f"tiktoken:{name}: cannot save the download in tiktoken's cache {folder} ({e.strerror}); "
                          "set TIKTOKEN_CACHE_DIR to a folder this user can write") from None
    return path, data


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ConfigError(f"cannot read {path} in tiktoken's cache ({e.strerror})") from None


def _download(name: str, url: str, todo: str) -> bytes:
    """The published file, fetched as tiktoken fetches it (requests), with timeouts."""
    import requests

    try:
        response = requests.get(url, timeout=DOWNLOAD_TIMEOUT_S)
        response.raise_for_status()
        return response.content
    except requests.RequestException as e:
        first_line = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"tiktoken:{name}: not in tiktoken's cache and the download failed ({type(e).__name__}: "
                          f"{first_line}): {todo}") from None
