"""Where the per-rank analysis runs: `LocalEngine` (this machine's cores, the default) or
`RayEngine` (a Ray cluster, `--engine ray`). Both call `kineto.analyze_trace` on each trace as
`find_traces` names it (a path, or a URL that the task opens itself) and return the per-rank
summaries (`TraceAnalysis`: steps and measurements, a few kB, never events) in the order given,
so everything after them (rules, rank table, report) is the same whichever engine ran.

Ray is imported only when its engine runs: the local default needs no Ray installed."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainadvisor._version import __version__
from trainadvisor.analyze.read.reading import cores, on_workers
from trainadvisor.analyze.trace.analysis import TraceAnalysis, analyze_trace
from trainadvisor.errors import MissingDependencyError, TrainAdvisorError, UsageError

ENGINES = ("local", "ray")
PROBE_TIMEOUT_S = 5.0  # ray.init retries an unreachable address for minutes; a socket says at once
_NOT_PROBED = ("auto", "local")


class Engine(Protocol):
    def run(self, sources: Sequence[Any]) -> list[TraceAnalysis]:
        """Each source's analysis, in the order of `sources`."""
        ...


@dataclass(frozen=True)
class LocalEngine:
    """Each trace on as many worker processes as there are cores when there are several (each
    worker reads its files one by one, in bounded memory); one large file alone is read in
    parts on those cores instead (`analyze.read.reading`)."""

    def run(self, sources: Sequence[Any]) -> list[TraceAnalysis]:
        workers = min(cores(), len(sources), 8)
        if workers < 2:
            return [analyze_trace(source) for source in sources]
        analysed = on_workers(workers, _analyze_one, list(sources))
        return analysed if analysed is not None else [analyze_trace(source) for source in sources]


def _analyze_one(source: Any) -> TraceAnalysis:
    return analyze_trace(source, workers=1)


@dataclass(frozen=True)
class RayEngine:
    """One Ray task per trace, each reading its own file where it is (a shared folder, object
    storage); only the summaries travel to this process. `address` (else RAY_ADDRESS) joins a
    running cluster; without one a local Ray is started for the run and stopped after it. A Ray
    already started in this process (a notebook's) is used as it is."""

    address: str | None = None
    num_cpus: int | None = None  # of a local Ray started here; None: every core

    def run(self, sources: Sequence[Any]) -> list[TraceAnalysis]:
        ray = _import_ray()
        started = connect(ray, self.address or os.environ.get("RAY_ADDRESS") or None, self.num_cpus)
        try:
            return _on_ray(ray, list(sources))
        finally:
            if started:
                ray.shutdown()


def engine_for(name: str, address: str | None = None) -> Engine:
    """The engine `--engine NAME` names; `--address` belongs to the Ray engine only."""
    if name == "ray":
        return RayEngine(address)
    if name != "local":
        raise UsageError(f"--engine {name}: unknown engine; choose one of {', '.join(ENGINES)}")
    if address:
        raise UsageError("--address joins a Ray cluster: add --engine ray, or leave --address out")
    return LocalEngine()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(
            f"--engine ray needs Ray ({exc}): pip install 'trainadvisor[ray]', or use --engine local"
        ) from None
    return ray


def connect(ray: Any, address: str | None, num_cpus: int | None) -> bool:
    """Join the cluster at `address`, or start a local Ray; True when this call started Ray."""
    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    if address is None:
        ray.init(address="local", num_cpus=num_cpus or cores(), include_dashboard=False, **quiet)
        return True
    if address not in _NOT_PROBED:
        _probe(address)
    try:
        ray.init(address=address, **quiet)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"cannot join the Ray cluster at {address}: {first_line}; check --address or "
            "RAY_ADDRESS (the head node's GCS address, host:6379), or leave both out to start a "
            "local Ray"
        ) from None
    return True  # this process's connection: let go of it after the run, the cluster stays


def _probe(address: str) -> None:
    """A TCP connection to the address, so an unreachable one fails at once, not after
    ray.init's minutes of retries."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"--address {address}: not a Ray address; give HOST:PORT (the head node's GCS)")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S) as connection:
            answers = _speaks_grpc(connection)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(
            f"cannot reach the Ray cluster at {address} ({reason}): check --address or RAY_ADDRESS, "
            "that the head node runs (`ray start --head`), or leave both out to start a local Ray"
        ) from None
    if not answers:
        raise UsageError(
            f"--address {address}: something listens there, but not Ray (no gRPC server answered "
            f"within {PROBE_TIMEOUT_S:g} s, where ray.init would wait for minutes): give the head "
            "node's GCS address (host:6379), or leave --address out to start a local Ray"
        )


# HTTP/2's client preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its client
# server) answers with a SETTINGS frame of its own at once.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x04


def _speaks_grpc(connection: socket.socket) -> bool:
    """Whether the peer answers HTTP/2's preface with its SETTINGS frame (as every gRPC server
    does) before the probe's timeout; a server that says nothing, or something else, does not."""
    try:
        connection.sendall(_HTTP2_HELLO)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # the timeout, or the peer hung up
        return False
    return header[3] == _SETTINGS


def _on_ray(ray: Any, sources: list[Any]) -> list[TraceAnalysis]:
    """A task per source, read back in order: a trace that cannot be analysed raises the
    error the local engine raises for it (the first one in order), and the tasks left are
    cancelled."""
    task = ray.remote(num_cpus=1)(_analyze_in_task)
    pending = [task.remote(source) for source in sources]
    results: list[TraceAnalysis] = []
    try:
        for i, ref in enumerate(pending):
            version, result = _get(ray, ref)
            pending[i] = None  # its object can go as soon as it has been read
            if version != __version__:
                raise UsageError(
                    f"the Ray cluster's workers run trainadvisor {version} and this process "
                    f"{__version__}: install the same version on every node"
                )
            if isinstance(result, BaseException):
                raise result
            results.append(result)
    finally:
        for ref in pending[len(results) :]:
            if ref is not None:
                ray.cancel(ref)
    return results


def _get(ray: Any, ref: Any) -> tuple[str, TraceAnalysis | BaseException]:
    try:
        return ray.get(ref)  # type: ignore[no-any-return]
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, ModuleNotFoundError) and "trainadvisor" in str(exc.cause):
            raise UsageError(
                "the Ray cluster's workers cannot import trainadvisor: install it (the same "
                f"version, {__version__}) on every node"
            ) from None
        raise


def _analyze_in_task(source: Any) -> tuple[str, TraceAnalysis | BaseException]:
    """In a Ray worker: the trace on this one core (the task's CPU); our errors and unreadable
    files come back as values, so the driver raises them as the local engine does, without
    Ray's wrapping."""
    try:
        return __version__, analyze_trace(source, workers=1)
    except (TrainAdvisorError, OSError) as exc:
        return __version__, exc
