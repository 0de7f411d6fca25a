"""Where a trace's bytes come from: a local file, or an object in storage named by an fsspec URL
(`s3://bucket/runs/7/`, `gs://...`, `hf://...`), listed under its prefix and read as a stream of
ranged reads (nothing is downloaded whole, to disk or to memory). A gzipped trace is inflated
here by the fastest inflater installed (python-isal, else zlib), and only up to a bound on what
it may expand to (`bounds`). fsspec and the stores' clients are imported only for a URL; they
take credentials and endpoints from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...),
and what a report shows of a URL (`shown`) holds no credentials."""

from __future__ import annotations

import gzip
import io
import os
import re
import types
import typing
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

from trainadvisor.analyze.read.bounds import Capped, expansion_limit_bytes, refuse_special, too_expanded
from trainadvisor.analyze.read.deadline import store_deadline
from trainadvisor.errors import UsageError

_gzip: types.ModuleType = gzip
_inflate_errors: tuple[type[Exception], ...] = (zlib.error,)
try:  # 4-5 times zlib's speed at inflating a trace (python-isal: manylinux, macOS and Windows wheels)
    from isal import igzip, isal_zlib

    _gzip, _inflate_errors = igzip, (zlib.error, typing.cast(type[Exception], isal_zlib.error))
except ImportError:  # a platform without its wheel: the standard library's
    pass

Location = Path | str  # a local path, or a URL
TRACE_SUFFIXES = (".json", ".json.gz")
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")  # what `archives` unpacks
# What a damaged or cut-off compressed trace raises while it is read.
READ_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, *_inflate_errors)
RANGE_BYTES = 8 << 20  # one ranged read of an object in storage
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+://")  # a scheme of two letters at least: `C:\` is a path
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}  # trainadvisor's extras by scheme


def is_url(location: Location) -> bool:
    return isinstance(location, str) and _URL.match(location) is not None


def shown(location: Location) -> str:
    """How reports and messages name a trace: a URL without its credentials (`user:password@`),
    query and fragment (a presigned URL's signature); a path as it is."""
    text = str(location)
    if not is_url(text):
        return text
    parts = urlsplit(text)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def file_name(location: Location) -> str:
    """The name of the file or object, without its folder or prefix."""
    return Path(location).name if not is_url(location) else shown(location).rstrip("/").rsplit("/", 1)[-1]


def list_urls(url: str) -> list[str]:
    """The trace files (*.json, *.json.gz) under the URL's prefix, recursively, in the order
    a folder's are listed; the URL itself where it names one object."""
    if file_name(url).endswith(ARCHIVE_SUFFIXES):
        raise UsageError(
            f"{shown(url)}: archives are unpacked from disk only: download it and pass the file, or "
            "store its traces under a prefix and pass that"
        )
    fs, root = _filesystem(url)
    with _store_call(url, 4 * store_timeout_s()):  # a listing: pages of keys
        if fs.isfile(root):
            return [url]
        found = fs.find(root)
    traces = [fs.unstrip_protocol(p) for p in found if p.endswith(TRACE_SUFFIXES)]
    if not traces:
        what = "no trace files (*.json, *.json.gz)" if found else "nothing"
        raise UsageError(f"{shown(url)}: {what} under this prefix; check the URL")
    return sorted(traces, key=lambda u: u.split("/"))  # as Path sorts a folder's files


def size_bytes(url: str) -> int:
    """The size of a trace in storage (compressed, if it is)."""
    fs, path = _filesystem(url)
    with _store_call(url, store_timeout_s()):
        return int(fs.size(path))


def open_trace(location: Location) -> IO[bytes]:
    """The trace's bytes, inflated where it is gzipped (told by its first bytes, not its name);
    reading past EXPANSION_RATIO times its stored size raises a UsageError."""
    raw, stored_bytes = _open_url(str(location)) if is_url(location) else _open_local(Path(location))
    gzipped = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    if not gzipped:
        return raw
    limit_bytes = expansion_limit_bytes(stored_bytes)
    verdict = "a compression bomb or a damaged file, not read further; if it is genuine, decompress it "
    verdict += "(gunzip) and pass the .json"
    refusal = too_expanded(shown(location), "decompresses", limit_bytes, verdict)
    inflated = _gzip.open(raw, "rb")  # type: ignore[call-overload]
    return typing.cast(IO[bytes], Capped(inflated, limit_bytes, refusal, raw))


def _open_local(path: Path) -> tuple[IO[bytes], int]:
    if not path.exists():
        raise UsageError(f"{path}: no such trace file")
    if path.is_dir():
        raise UsageError(f"{path}: a folder, not a trace file")
    refuse_special(path)
    return open(path, "rb"), path.stat().st_size


def _open_url(url: str) -> tuple[IO[bytes], int]:
    fs, path = _filesystem(url)
    if "file" in _protocols(fs):  # file:// is a local path: a pipe or a device is refused as one
        refuse_special(Path(path))
    with _store_call(url, store_timeout_s()):
        stream = fs.open(path, "rb", block_size=RANGE_BYTES, cache_type="readahead")
        stored_bytes = getattr(stream, "size", None)
        stored_bytes = int(stored_bytes if stored_bytes is not None else fs.size(path))
    return typing.cast(IO[bytes], _StoreStream(stream, url, stored_bytes)), stored_bytes


@contextmanager
def _store_call(url: str, timeout_s: float, size_bytes: int = 0) -> Iterator[None]:
    """One call to the store, within its deadline (`deadline`); whatever the store's client
    raises is said as a usage problem (`_store_error`), the deadline's own error as it is."""
    try:
        with store_deadline(shown(url), timeout_s, size_bytes):
            yield
    except UsageError:
        raise
    except Exception as exc:
        raise _store_error(url, exc) from None


def filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for a store's URL and the path within it (a usage error where the
    package it needs is missing), for others of the package that keep files in a store."""
    return _filesystem(url)


def store_call(url: str) -> Any:
    """One call to a store, within its deadline, its failure said as a usage problem."""
    return _store_call(url, store_timeout_s())


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class _StoreStream(io.RawIOBase):
    """An object's stream whose failures (the connection lost mid-read) are usage errors that
    name the URL without credentials, not the client's exception with the endpoint in it."""

    def __init__(self, stream: Any, url: str, stored_bytes: int) -> None:
        super().__init__()
        self._stream, self._url, self._stored_bytes = stream, url, stored_bytes

    def read(self, size: int | None = -1) -> bytes:
        wanted = self._stored_bytes if size is None or size < 0 else max(size, RANGE_BYTES)
        with _store_call(self._url, store_timeout_s(), min(wanted, self._stored_bytes)):
            return self._stream.read(-1 if size is None else size)  # type: ignore[no-any-return]

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)  # type: ignore[no-any-return]

    def tell(self) -> int:
        return self._stream.tell()  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stream.close()
        super().close()


def _filesystem(url: str) -> tuple[Any, str]:
    """fsspec's filesystem for the URL and the path within it."""
    scheme = url.split("://", 1)[0].lower()
    install = f"pip install 'trainadvisor[{_EXTRAS.get(scheme, 's3')}]'"
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"{shown(url)}: reading traces from a URL needs fsspec: {install}") from None
    try:
        fs, path = fsspec.core.url_to_fs(url, **_timeouts(scheme))
        if scheme in _S3:
            fs.retries = 1  # s3fs's own retries on top of botocore's attempts: bounded by those
        return fs, path
    except ImportError as exc:  # the protocol's package (s3fs, gcsfs, huggingface_hub) is missing
        how = install if scheme in _EXTRAS else f"install the package fsspec names ({exc})"
        raise UsageError(
            f"{shown(url)}: {scheme}:// URLs need a package that is not installed: {how}"
        ) from None
    except ValueError as exc:  # fsspec knows no such protocol, or the URL is malformed
        raise UsageError(f"{shown(url)}: not a URL fsspec can read ({exc}); check the scheme") from None


_S3 = ("s3", "s3a")
# How long a store may keep a request waiting for its connection, and for each answer: a store
# that never answers, or an endpoint that is not one, ends in a usage error instead of a read
# that waits forever (botocore's own default reads wait 60 s, retried on top by s3fs).
STORE_TIMEOUT_ENV = "TRAINADVISOR_STORE_TIMEOUT_S"
STORE_TIMEOUT_S = 30.0


def store_timeout_s() -> float:
    """TRAINADVISOR_STORE_TIMEOUT_S where it is a positive number, else STORE_TIMEOUT_S."""
    try:
        timeout_s = float(os.environ.get(STORE_TIMEOUT_ENV) or STORE_TIMEOUT_S)
    except ValueError:
        return STORE_TIMEOUT_S
    return timeout_s if 0 < timeout_s < float("inf") else STORE_TIMEOUT_S


def _timeouts(scheme: str) -> dict[str, Any]:
    """The S3 client's timeouts and attempts (other stores keep their clients' own)."""
    if scheme not in _S3:
        return {}
    timeout_s = store_timeout_s()
    config: dict[str, Any] = {"connect_timeout": timeout_s, "read_timeout": timeout_s}
    if not os.environ.get("AWS_MAX_ATTEMPTS"):
        config["retries"] = {"max_attempts": 2, "mode": "standard"}
    return {"config_kwargs": config}


def _store_error(url: str, exc: BaseException) -> UsageError:
    """The store's failure as a usage problem. Its own message is left out: clients quote the
    endpoint and request (AWS_ENDPOINT_URL, signed parameters)."""
    where = shown(url)
    if isinstance(exc, FileNotFoundError):
        return UsageError(f"{where}: no such bucket, prefix or object; check the URL")
    if isinstance(exc, PermissionError):
        return UsageError(
            f"{where}: permission denied; use credentials that may list and read it (AWS_PROFILE, "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN)"
        )
    return UsageError(
        f"{where}: cannot read from the store ({type(exc).__name__}); check the network, the endpoint "
        "(AWS_ENDPOINT_URL) and the credentials in the environment"
    )
