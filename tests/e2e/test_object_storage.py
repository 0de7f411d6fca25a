"""`trainadvisor analyze s3://...` (issue 27, object storage) against a real S3 API server: moto's,
started once for the module on a free port, reached by the real CLI through s3fs with the
endpoint and credentials in the environment, as a user's would be. The report of traces in a
bucket is the report of the same files on disk; the credentials and the endpoint appear in no
report file; the objects are read in ranged requests, never fetched whole."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from conftest import DATA, load_report, published, require, run_cli, shared_trace

require("s3fs", "the object-storage tests need s3fs: pip install -e '.[dev]'")


moto_server = pytest.importorskip(
    "moto.server", reason="the S3 server the tests start is moto's: pip install -e '.[dev]'"
)


import boto3  # noqa: E402 - moto brings it; after the skip

from trainadvisor.analyze.read import sources, stream  # noqa: E402
from trainadvisor.analyze.read.reading import read_table  # noqa: E402

BUCKET = "traces"


KEY_ID = "AKIATRAINADVISORTEST7"  # fake credentials, distinctive enough to search the reports for


SECRET = "trainadvisor/test+secret/9f3c0b"


# Traces of ours (tests/data/traces): a file in a nested prefix, and a README that is no trace.
LAYOUT = {
    "profiler_steps.json.gz": "profiler_steps.json.gz",
    "record_shapes_bf16.json.gz": "record_shapes_bf16.json.gz",
    "more/no_schedule_workers2.json.gz": "no_schedule_workers2.json.gz",
    "README.md": "README.md",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Requests(logging.Handler):
    """The request lines the server logs (werkzeug's): method, path, status."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, _Requests]]:
    """moto's S3 server (a real HTTP server speaking the S3 API) with the bucket of traces."""
    port = _free_port()
    moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    requests = _Requests()
    logging.getLogger("werkzeug").addHandler(requests)
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=BUCKET)
    for key, name in LAYOUT.items():
        client.upload_file(str(DATA / "traces" / name), BUCKET, f"runs/7/{key}")
    client.put_object(Bucket=BUCKET, Key="notes/README.md", Body=b"no traces here")
    try:
        yield endpoint, requests
    finally:
        logging.getLogger("werkzeug").removeHandler(requests)
        moto.stop()


@pytest.fixture
def s3(server: tuple[str, _Requests], monkeypatch: pytest.MonkeyPatch) -> tuple[str, _Requests]:
    """The environment a user of an S3-compatible store sets; the CLI's processes inherit it."""
    endpoint, requests = server
    for name, value in {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_MAX_ATTEMPTS": "1",  # a store that is down fails at once
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    return endpoint, requests


def _local_copy(root: Path) -> Path:
    for key, name in LAYOUT.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(DATA / "traces" / name, root / key)
    return root


def test_a_prefix_in_a_bucket_gives_the_report_of_the_same_files_on_disk(
    tmp_path: Path, s3: tuple[str, _Requests]
) -> None:
    """Every trace under the prefix (a nested one too, the README left out), analysed on the
    local engine's worker processes, each opening its own stream: the report is the local
    one's, byte for byte once the folder's name is replaced by the URL's."""
    endpoint, _ = s3
    url = f"s3://{BUCKET}/runs/7/"
    remote = run_cli("analyze", "--out", tmp_path / "remote", url, cwd=tmp_path)
    assert remote.returncode == 0, remote.stderr
    folder = _local_copy(tmp_path / "runs" / "7")
    local = run_cli("analyze", "--out", tmp_path / "local", folder, cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    report = load_report(tmp_path / "remote")
    assert [t["path"] for t in report["traces"]] == [
        f"{url}more/no_schedule_workers2.json.gz",
        f"{url}profiler_steps.json.gz",
        f"{url}record_shapes_bf16.json.gz",
    ]
    assert report["command"] == ["trainadvisor", "analyze", url]
    shown = published(folder, tmp_path)  # as the published report names it
    expected = (tmp_path / "local" / "report.json").read_text().replace(f"{shown}/", url)
    expected = expected.replace(f'"{shown}"', f'"{url}"')  # the command line's argument
    assert (tmp_path / "remote" / "report.json").read_text() == expected
    assert remote.stdout.replace(published(tmp_path / "remote", tmp_path), "OUT") == local.stdout.replace(
        published(tmp_path / "local", tmp_path), "OUT"
    ).replace(f"{shown}/", url)
    for file in (tmp_path / "remote").rglob("*"):
        if file.is_file():
            text = file.read_bytes().decode("utf-8", "replace")
            for secret in (KEY_ID, SECRET, endpoint, endpoint.split("//")[1]):
                assert secret not in text, (file, secret)


def test_an_object_is_read_in_ranged_requests_never_whole(
    s3: tuple[str, _Requests], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream fetches a range at a time as the reader asks for blocks (HTTP 206, about a
    request per block and range), so neither the disk nor memory ever holds the object: here
    310,948 bytes of JSON read in blocks of 16 kB, with ranges of 16 kB ahead."""
    _, requests = s3
    monkeypatch.setattr(stream, "BLOCK_BYTES", 16384)
    monkeypatch.setattr(sources, "RANGE_BYTES", 16384)
    plain = gzip.decompress((DATA / "traces" / "record_shapes_bf16.json.gz").read_bytes())
    key = "plain/record_shapes_bf16.json"
    boto3.client("s3").put_object(Bucket=BUCKET, Key=key, Body=plain)
    before = len(requests.lines)
    events: list[Any] = []
    meta = stream.read_trace(f"s3://{BUCKET}/{key}", events.extend)
    fetched = [line for line in requests.lines[before:] if f"GET /{BUCKET}/{key}" in line]
    local: list[Any] = []
    stream.read_trace(DATA / "traces" / "record_shapes_bf16.json.gz", local.extend)
    assert len(plain) == 310948 and meta["_events"] == len(events) == 819 and events == local
    # A miss fetches the block asked for and a range ahead: 32 kB at most, 16 kB at least.
    assert len(plain) // 32768 <= len(fetched) <= len(plain) // 16384 + 2
    assert all('" 206 ' in line for line in fetched)  # partial content, every one


def test_a_large_object_is_parsed_on_workers_as_it_streams(s3: tuple[str, _Requests]) -> None:
    """HTA's df_index_resolver trace (3 MB gzipped, 54 MB of JSON) in the bucket, streamed to two
    worker processes (forked after s3fs started its event loop) in 4 MB pieces: the same columns
    and keys as the file on disk read in one process."""
    trace = shared_trace("hta/df_index_resolver/df_index_resolver.json.gz")
    client = boto3.client("s3")
    client.upload_file(str(trace), BUCKET, "big/df_index_resolver.json.gz")
    remote, remote_meta = read_table(
        f"s3://{BUCKET}/big/df_index_resolver.json.gz", 2, piped_min_gzip_bytes=0
    )
    local, local_meta = read_table(trace, 1)
    assert remote_meta == local_meta and remote_meta["_events"] == 216092
    from support.gzip_pipeline import same_table

    same_table(remote, local)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "s3://no-such-bucket/runs/",
            "s3://no-such-bucket/runs/: no such bucket, prefix or object; check the URL",
        ),
        (
            f"s3://{BUCKET}/nothing/here/",
            f"s3://{BUCKET}/nothing/here/: nothing under this prefix; check the URL",
        ),
        (
            f"s3://{BUCKET}/notes/",
            f"s3://{BUCKET}/notes/: no trace files (*.json, *.json.gz) under this prefix; check the URL",
        ),
        (
            f"s3://{BUCKET}/runs/7.tar.gz",
            f"s3://{BUCKET}/runs/7.tar.gz: archives are unpacked from disk only: download it and pass "
            "the file, or store its traces under a prefix and pass that",
        ),
    ],
)
def test_a_missing_bucket_an_empty_prefix_or_an_archive_is_one_line(
    tmp_path: Path, s3: tuple[str, _Requests], url: str, message: str
) -> None:
    result = run_cli("analyze", "--out", tmp_path / "r", url, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"trainadvisor: error: {message}"
    assert not (tmp_path / "r" / "report.json").exists()


def test_a_store_that_cannot_be_reached_is_one_line_without_the_endpoint(
    tmp_path: Path, s3: tuple[str, _Requests], monkeypatch: pytest.MonkeyPatch
) -> None:
    closed = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    result = run_cli("analyze", "--out", tmp_path / "r", f"s3://{BUCKET}/runs/7/", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"trainadvisor: error: s3://{BUCKET}/runs/7/: cannot read from the store (EndpointConnectionError); "
        "check the network, the endpoint (AWS_ENDPOINT_URL) and the credentials in the environment"
    )
    assert closed.split("//")[1] not in result.stderr


def _analyze_at(
    server: AbstractContextManager[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`analyze` of a prefix at an endpoint on 127.0.0.1 (`server` gives its port), with signed
    requests (unsigned, the client fails on missing credentials before it connects) and the
    store timeout given: its result, and how long it took."""
    import time

    monkeypatch.setenv(sources.STORE_TIMEOUT_ENV, str(timeout_s))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    started = time.monotonic()
    with server as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        result = run_cli(
            "analyze", "--out", tmp_path / "r", f"s3://{BUCKET}/runs/7/", cwd=tmp_path, timeout_s=120
        )
    return result, time.monotonic() - started


def test_a_store_that_never_answers_is_one_line_after_its_timeout(
    tmp_path: Path, s3: tuple[str, _Requests], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint that accepts the connection and never answers: analyze waited on it for as
    long as it was left (still running at 300 s); now each request gives up after the store
    timeout (30 s by default; 2 s here), and the command says so in one line."""
    from conftest import silent_server

    result, took_s = _analyze_at(silent_server(), tmp_path, monkeypatch, timeout_s=2)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    said = result.stderr.removeprefix(f"trainadvisor: error: s3://{BUCKET}/runs/7/: ")
    # the client's read timeouts (2 s an attempt), or the listing's deadline (4x) where they add up past it
    assert said.startswith(("cannot read from the store (ReadTimeout", "the store sent too little in 8 s")), (
        said
    )
    assert took_s < 60


def test_a_store_that_trickles_its_answers_is_given_up_on_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An endpoint that answers a byte every half second never trips a socket's read timeout
    (analyze was still running at 300 s); each call to the store now has a deadline (its
    listing: 4x the store timeout, 4 s here), and the command says why it stopped."""
    from conftest import trickling_server

    result, took_s = _analyze_at(trickling_server(), tmp_path, monkeypatch, timeout_s=1)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        f"trainadvisor: error: s3://{BUCKET}/runs/7/: the store sent too little in 4 s (a stalled or "
        "trickling connection); check the endpoint (AWS_ENDPOINT_URL) and the network, or give it "
        "longer with TRAINADVISOR_STORE_TIMEOUT_S"
    )
    assert took_s < 30


@pytest.mark.parametrize(
    ("missing", "scheme", "message"),
    [
        ("s3fs", "s3", "s3:// URLs need a package that is not installed: pip install 'trainadvisor[s3]'"),
        ("gcsfs", "gs", "gs:// URLs need a package that is not installed: pip install 'trainadvisor[gcs]'"),
        ("fsspec", "s3", "reading traces from a URL needs fsspec: pip install 'trainadvisor[s3]'"),
    ],
)
def test_a_store_whose_package_is_not_installed_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str, scheme: str, message: str
) -> None:
    """The package's import fails in the CLI's process (a package of that name, first on the
    path, that raises ImportError as an absent one does)."""
    shadow = tmp_path / "shadow" / missing
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ImportError({f'No module named {missing}'!r})\n")
    monkeypatch.setenv("PYTHONPATH", str(shadow.parent))
    url = f"{scheme}://bucket/runs/"
    result = run_cli("analyze", "--out", tmp_path / "r", url, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"trainadvisor: error: {url}: {message}"


def test_local_paths_do_not_import_fsspec(tmp_path: Path) -> None:
    """fsspec is optional: analysing files on disk never imports it."""
    code = (
        "import sys; from trainadvisor.analyze.command import find_traces; "
        "from trainadvisor.analyze.trace.analysis import analyze_trace; "
        f"analyze_trace(find_traces([__import__('pathlib').Path({str(DATA)!r}) / "
        "'traces' / 'profiler_steps.json.gz'])[0][0]); print('fsspec' in sys.modules)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_baseline_kept_in_a_bucket_is_saved_listed_compared_and_deleted(
    tmp_path: Path, s3: tuple[str, _Requests]
) -> None:
    """`baseline save` into s3://, `compare --against` reading it back through the same layer
    as `analyze`: the report compared is the one saved, and one object is all it leaves."""
    store = f"s3://{BUCKET}/baselines"
    saved = DATA / "report"
    result = run_cli("baseline", "save", "--store", store, "main", saved, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = run_cli("baseline", "list", "--store", store, cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith("baseline:main\t"), listed.stderr
    compared = run_cli(
        "compare", "--format", "json", "--store", store, "--against", "baseline:main", saved, cwd=tmp_path
    )  # fmt: skip
    assert compared.returncode == 0, compared.stderr
    data = json.loads(compared.stdout)
    assert all(m["change_pct"] == 0.0 for m in data["metrics"]) and data["verdict"] == "neutral"
    objects = boto3.client("s3").list_objects_v2(Bucket=BUCKET, Prefix="baselines/")["Contents"]
    assert [o["Key"] for o in objects] == ["baselines/main/report.json"]
    deleted = run_cli("baseline", "delete", "--store", store, "main", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    missing = run_cli("baseline", "delete", "--store", store, "main", cwd=tmp_path)
    assert missing.returncode == 2 and "no baseline 'main'" in missing.stderr
