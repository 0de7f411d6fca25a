"""`trainadvisor analyze s3://...` (issue 27, object storage) against a real S3 API server: moto's,
started once for the module on a free port, reached by the real CLI through s3fs with the
endpoint and credentials in the environment, as a user's would be. The report of traces in a
bucket is the report of the same files on disk; the credentials and the endpoint appear in no
report file; the objects are read in ranged requests, never fetched whole."""

from __future__ import annotations

from pathlib import Path

from conftest import require

require("s3fs", "the object-storage tests need s3fs: pip install -e '.[dev]'")


from trainadvisor.analyze.read import sources  # noqa: E402


def test_a_url_with_credentials_and_a_signature_is_shown_without_them() -> None:
    url = "s3://user:hunter2@bucket/runs/rank0.json.gz?X-Amz-Signature=abc123&X-Amz-Credential=AKIA#frag"
    assert sources.shown(url) == "s3://bucket/runs/rank0.json.gz"
    assert sources.file_name(url) == "rank0.json.gz"
    assert sources.shown("hf://datasets/me/traces/rank1.json") == "hf://datasets/me/traces/rank1.json"
    assert sources.shown(Path("C:/runs/rank0.json")) == str(Path("C:/runs/rank0.json"))
    assert not sources.is_url("C:\\runs\\rank0.json") and not sources.is_url(Path("s3:/x"))
