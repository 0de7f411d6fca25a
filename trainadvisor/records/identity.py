"""A run's id, derived from its content: the same code, arguments and environment give the same
id on any machine and at any time, whatever the paths, clocks or trainadvisor version. `compare`
reads it to tell whether two reports measured the same thing.

May import: nothing of the package (records' DeviceInfo comes in through the package)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from trainadvisor.records import DeviceInfo

PREFIX = "sha256:"
READ_UP_TO_BYTES = 64 * 2**20  # a script larger than this is digested by its first 64 MiB


def content_digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def file_digest(path: Path) -> str:
    """The digest of a file's bytes; where it cannot be read, of its name (said so)."""
    try:
        with path.open("rb") as handle:
            return content_digest(handle.read(READ_UP_TO_BYTES))
    except OSError:
        return content_digest(f"unreadable: {path.name}")


def run_id(content: str, arguments: list[str], environment: DeviceInfo | None, world_size: int) -> str:
    """`content`: the digest of what ran (the script's bytes; for `analyze`, the traces'
    summaries); `arguments`: what the script was given; the environment that changes what a
    step measures (torch and CUDA versions, the GPU or the CPU's cores, the ranks)."""
    env: dict[str, Any] | None = None
    if environment is not None:
        env = {
            "torch": environment.torch_version,
            "cuda": environment.cuda_version if environment.cuda_used else None,
            "gpu": environment.gpu_name if environment.cuda_used else None,
            "cpus": None if environment.cuda_used else environment.cpu_count,
        }
    blob = json.dumps(
        {"content": content, "arguments": arguments, "environment": env, "world_size": world_size},
        sort_keys=True,
    )
    return PREFIX + content_digest(blob)[:20]
