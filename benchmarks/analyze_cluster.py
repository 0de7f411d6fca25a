"""Issue 27, parts 2-4: `analyze` of many rank traces, with the local engine and with Ray.

Writes N synthetic rank traces (`write_rank_traces`: the events of a data-parallel step as
Kineto records them on a GPU: ProfilerStep#N, the DataLoader, aten ops with their
cudaLaunchKernel and kernels, a pinned batch upload, NCCL all-reduce buckets in the backward
pass, the optimizer step; every rank a little jittered, one rank a straggler whose compute takes
30% longer, so that the others wait for it in every all-reduce), then analyses them in a child
process per engine and prints, for each:

- the driver's peak RSS (VmHWM of the process that runs `analyze`: the local engine's worker
  processes and Ray's workers are other processes, and are not counted);
- the analysis time and the throughput per core (ranks per second per core, the same cores for
  both: the local engine's workers, Ray's `num_cpus`); Ray's start-up is timed apart (a joined
  cluster has none); each engine runs --repeat times, in turn, and the two are compared by
  their medians (other work on the machine comes and goes: the load is printed with each run);
- the cross-rank part alone at 1,024 ranks (the rules, the rank table, its overview and the
  report of 1,024 summaries: the 256 repeated four times), with the driver's peak RSS.

    .venv/bin/python benchmarks/analyze_cluster.py [--ranks 256] [--steps 10] [--layers 128]
        [--work /tmp/trainadvisor-cluster] [--engines local,ray] [--repeat 3]

The traces are written once into --work (about 0.4 MB a rank) and reused."""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GEMM = (
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_seg"
    "ment_k_off_kernel__5x_cublas"
)
ELEMENTWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::Tenso"
    "rIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::ope"
    "rator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native:"
    ":GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator"
    "()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array"
    "<char*, 2>)"
)
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ADAM = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous n"
    "amespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<"
    "c10::BFloat16, 1, (at::native::ADAM_MODE)1, false>, bool, float*, double, double, double, "
    "double, double, bool, bool*, float*>"
)
PID, MAIN, BACKWARD = 4242, 4242, 4301  # host threads: the loop, autograd's
COMPUTE_STREAM, COMM_STREAM = 7, 21
LAYER_US = {"fwd_gemm": 180.0, "fwd_act": 25.0, "bwd_gemm": 340.0, "bwd_act": 40.0}
BUCKET_LAYERS = 8  # layers per gradient bucket: one all-reduce each
TRANSFER_US = 600.0  # an all-reduce's own time, once every rank has arrived
STRAGGLER_FACTOR = 1.3


def straggler_of(ranks: int) -> int:
    return ranks // 3


@functools.cache
def _factors(ranks: int, steps: int) -> tuple[tuple[float, ...], ...]:
    """[step][rank]: how much longer than nominal a rank's compute takes in a step
    (deterministic jitter of 3%, the straggler's 30% more)."""
    return tuple(
        tuple(
            (1.0 + random.Random(f"{rank}/{step}").uniform(-0.03, 0.03))
            * (STRAGGLER_FACTOR if rank == straggler_of(ranks) else 1.0)
            for rank in range(ranks)
        )
        for step in range(steps + 1)
    )


def _loader_us(rank: int) -> float:
    return 1500.0 + 40.0 * (rank % 7)


FORWARD_US = LAYER_US["fwd_gemm"] + LAYER_US["fwd_act"]
BACKWARD_US = LAYER_US["bwd_gemm"] + LAYER_US["bwd_act"]
UPLOAD_US = 100.0  # from the batch's arrival to the first kernel (the copy)


class _Trace:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.correlation = 1000

    def op(self, cat: str, name: str, ts: float, dur: float, tid: int = MAIN, **args: Any) -> None:
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid,
                            "ts": round(ts, 3), "dur": round(dur, 3), "args": args})  # fmt: skip

    def launch(
        self, name: str, ts: float, kernel_ts: float, kernel_us: float, stream: int, tid: int
    ) -> float:
        """A cudaLaunchKernel at `ts` and the kernel it starts; returns the kernel's end."""
        self.correlation += 1
        self.op("cuda_runtime", "cudaLaunchKernel", ts, 4.0, tid, correlation=self.correlation)
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                            "ts": round(kernel_ts, 3), "dur": round(kernel_us, 3),
                            "args": {"device": 0, "stream": stream,
                                     "correlation": self.correlation}})  # fmt: skip
        return kernel_ts + kernel_us


def _step(t: _Trace, rank: int, step: int, steps: int, ranks: int, layers: int, start: float) -> float:
    """One training step from `start` (alike on every rank); returns its end (the last
    all-reduce and the optimizer done, alike on every rank). The device runs its kernels back
    to back, so a rank reaches a bucket's all-reduce at start + its loader + factor x the work
    before it; the all-reduce ends once the slowest rank has arrived, plus the transfer."""
    factors = _factors(ranks, steps)[step]
    factor = factors[rank]
    t.op(
        "user_annotation",
        "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
        start,
        _loader_us(rank),
    )
    host = start + _loader_us(rank)
    t.correlation += 1
    t.op("cuda_runtime", "cudaMemcpyAsync", host + 5, 12.0, correlation=t.correlation)
    t.events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0,
                     "tid": COMPUTE_STREAM, "ts": host + 10, "dur": 90.0,
                     "args": {"device": 0, "stream": COMPUTE_STREAM, "correlation": t.correlation,
                              "bytes": 8 << 20}})  # fmt: skip
    device = host + UPLOAD_US
    host += 20.0
    for layer in range(layers):  # forward: linear, then the activation
        t.op("cpu_op", "aten::linear", host, 30.0, **{"External id": layer})
        t.op("cpu_op", "aten::addmm", host + 5, 22.0)
        device = t.launch(GEMM, host + 10, device, LAYER_US["fwd_gemm"] * factor, COMPUTE_STREAM, MAIN)
        t.op("cpu_op", "aten::gelu", host + 32, 12.0)
        device = t.launch(ELEMENTWISE, host + 34, device, LAYER_US["fwd_act"] * factor, COMPUTE_STREAM, MAIN)
        host += 48.0
    t.op("cpu_op", "autograd::engine::evaluate_function: MseLossBackward0", host, 20.0, BACKWARD)
    comm_end = 0.0
    for layer in reversed(range(layers)):
        host = max(host, device - 300.0)  # the host keeps a little ahead of the device
        t.op("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", host, 40.0, BACKWARD)
        t.op("cpu_op", "aten::mm", host + 6, 14.0, BACKWARD)
        device = t.launch(GEMM, host + 8, device, LAYER_US["bwd_gemm"] * factor, COMPUTE_STREAM, BACKWARD)
        t.op("cpu_op", "aten::gelu_backward", host + 26, 10.0, BACKWARD)
        device = t.launch(
            ELEMENTWISE, host + 28, device, LAYER_US["bwd_act"] * factor, COMPUTE_STREAM, BACKWARD
        )
        host += 44.0
        done = layers - layer
        if done % BUCKET_LAYERS == 0 or layer == 0:  # a bucket's gradients are ready
            work = layers * FORWARD_US + done * BACKWARD_US
            slowest = start + UPLOAD_US + max(_loader_us(r) + f * work for r, f in enumerate(factors))
            arrival = max(device, comm_end)
            end = max(slowest, comm_end) + TRANSFER_US
            t.op("user_annotation", "nccl:all_reduce", host, 30.0, BACKWARD)
            comm_end = t.launch(NCCL, host + 5, arrival, end - arrival, COMM_STREAM, BACKWARD)
    host = max(host, comm_end)
    t.op("user_annotation", "Optimizer.step#AdamW.step", host, 300.0)
    end = t.launch(ADAM, host + 20, host + 30, 900.0, COMPUTE_STREAM, MAIN) + 20.0
    t.op("user_annotation", f"ProfilerStep#{step}", start, end - start)
    return end


def rank_trace(rank: int, ranks: int, steps: int = 8, layers: int = 48) -> dict[str, Any]:
    t = _Trace()
    start = 1_700_000_000_000_000.0  # epoch microseconds, as Kineto writes them
    for step in range(1, steps + 1):
        start = _step(t, rank, step, steps, ranks, layers, start) + 50.0
    return {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85031714816,
                "computeMajor": 9,
                "computeMinor": 0,
                "numSms": 132,
            }
        ],  # fmt: skip
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
        "traceEvents": t.events,
    }


def write_rank_traces(folder: Path, ranks: int, steps: int = 8, layers: int = 48) -> list[Path]:
    """`ranks` traces in `folder` (rank<N>.pt.trace.json.gz), written unless already there."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        path = folder / f"rank{rank}.pt.trace.json.gz"
        if not path.exists():
            data = json.dumps(rank_trace(rank, ranks, steps, layers)).encode()
            partial = path.with_suffix(".partial")
            with gzip.open(partial, "wb", compresslevel=1) as f:
                f.write(data)
            partial.rename(path)
        paths.append(path)
    return paths


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _tree_cpu_s() -> float:
    """CPU seconds of this process and all it started: the local engine's workers (counted once
    they have ended), or the local Ray's processes (its GCS, raylet and workers, alive)."""
    import resource

    import psutil

    used = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        used += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # ended meanwhile
            continue
        used += times.user + times.system
    return used


def drive(engine: str, folder: Path, cpus: int) -> dict[str, Any]:
    """In the child: `analyze` of the folder with one engine, as the CLI runs it."""
    from trainadvisor.analyze.command import analyze
    from trainadvisor.analyze.engines import LocalEngine, RayEngine
    from trainadvisor.report.render import write_report
    from trainadvisor.resources import templates_dir

    result: dict[str, Any] = {"engine": engine, "start_s": 0.0}
    runner: Any = LocalEngine()
    if engine == "ray":
        import logging

        import ray

        started = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
        result["start_s"] = time.perf_counter() - started
        runner = RayEngine()
    started, cpu_s = time.perf_counter(), _tree_cpu_s()
    report, analyses = analyze([folder], [], ["trainadvisor", "analyze", str(folder)], runner)
    result["analyze_s"] = time.perf_counter() - started
    result["cpu_s"] = _tree_cpu_s() - cpu_s
    out = folder.parent / f"report-{engine}"
    write_report(report, out, templates_dir())
    result["report_s"] = time.perf_counter() - started - result["analyze_s"]
    result["ranks"] = len(analyses)
    result["events"] = sum(a.events for a in analyses)
    result["peak_rss_mb"] = _peak_rss_mb()
    result["report_json_mb"] = (out / "report.json").stat().st_size / 1e6
    result["straggler"] = (report.ranks or {}).get("straggler")
    result["load"] = os.getloadavg()[0]  # other work on the machine: the 1-minute load at the end
    return result


def drive_cross_rank(folder: Path, copies: int) -> dict[str, Any]:
    """In the child: the cross-rank part alone over `copies` x the folder's summaries (the
    per-rank work done once, outside the timing), renumbered as one job's ranks."""
    import dataclasses

    from trainadvisor import rulebook
    from trainadvisor.analyze.command import report_of
    from trainadvisor.analyze.engines import LocalEngine
    from trainadvisor.report.render import render_html, render_markdown, report_json
    from trainadvisor.resources import templates_dir

    summaries = LocalEngine().run(sorted(folder.glob("rank*.pt.trace.json.gz")))
    world = len(summaries) * copies
    many = [
        dataclasses.replace(a, rank=c * len(summaries) + (a.rank or 0), world_size=world)
        for c in range(copies)
        for a in summaries
    ]
    before_mb = _peak_rss_mb()
    started = time.perf_counter()
    report = report_of(many, rulebook.rules_for([]), ["trainadvisor", "analyze", str(folder)])
    cross_s = time.perf_counter() - started
    sizes = [len(render(report, templates_dir())) for render in (render_markdown, render_html)]
    return {
        "ranks": world,
        "cross_rank_s": cross_s,
        "render_s": time.perf_counter() - started - cross_s,
        "report_json_mb": len(report_json(report)) / 1e6,
        "report_md_kb": sizes[0] / 1e3,
        "report_html_kb": sizes[1] / 1e3,
        "peak_rss_mb": _peak_rss_mb(),
        "peak_rss_before_mb": before_mb,
    }


def _child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--layers", type=int, default=128)
    parser.add_argument("--work", type=Path, default=Path("/tmp/trainadvisor-cluster"))
    parser.add_argument("--engines", default="local,ray")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each engine, in turn")
    parser.add_argument("--cpus", type=int, default=None, help="cores for both engines (default: all)")
    parser.add_argument("--drive", nargs=2, metavar=("ENGINE", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--cross-rank", nargs=2, metavar=("FOLDER", "COPIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    from trainadvisor.analyze.read.reading import cores

    cpus = args.cpus or min(cores(), 8)  # the local engine's workers: a core each, at most 8
    if args.drive:
        print(json.dumps(drive(args.drive[0], Path(args.drive[1]), cpus)))
        return
    if args.cross_rank:
        print(json.dumps(drive_cross_rank(Path(args.cross_rank[0]), int(args.cross_rank[1]))))
        return
    folder = args.work / f"ranks{args.ranks}-steps{args.steps}-layers{args.layers}" / "traces"
    started = time.perf_counter()
    paths = write_rank_traces(folder, args.ranks, args.steps, args.layers)
    size_mb = sum(p.stat().st_size for p in paths) / 1e6
    print(
        f"{args.ranks} rank traces in {folder} ({size_mb:.0f} MB gzipped; "
        f"{time.perf_counter() - started:.1f} s)"
    )
    print(f"straggler: rank {straggler_of(args.ranks)}; {cpus} cores for each engine")
    engines = args.engines.split(",")
    runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    for _ in range(args.repeat):  # the engines in turn: a load that comes and goes hits both
        for engine in engines:
            runs[engine].append(_child("--drive", engine, str(folder), "--cpus", str(cpus)))
    for engine, results in runs.items():
        for r in results:
            per_core = r["ranks"] / r["analyze_s"] / cpus
            print(
                f"{engine:>5}: {r['ranks']} ranks ({r['events'] / r['ranks']:,.0f} events each) in "
                f"{r['analyze_s']:.1f} s (+ {r['report_s']:.1f} s writing the report, + {r['start_s']:.1f} s "
                f"starting Ray): {per_core:.2f} ranks/s per core, {1e3 / per_core:.0f} core-ms per rank "
                f"({1e3 * r['cpu_s'] / r['ranks']:.0f} ms of CPU time); "
                f"driver peak RSS {r['peak_rss_mb']:.0f} MB; report.json {r['report_json_mb']:.1f} MB; "
                f"straggler found: rank {r['straggler']}; load {r['load']:.1f}"
            )
    if len(runs) == 2:
        (local, ray) = runs.values()
        best = [max(r["ranks"] / r["analyze_s"] for r in results) for results in (local, ray)]
        cpu = [statistics.median(r["ranks"] / r["cpu_s"] for r in results) for results in (local, ray)]
        print(
            f"ray / local throughput per core: {best[1] / best[0]:.2f} by wall time (the best run of "
            f"{args.repeat} each), {cpu[1] / cpu[0]:.2f} by CPU time (medians; other work on the machine "
            "does not count in it)"
        )
    copies = max(1, 1024 // args.ranks)
    cross = _child("--cross-rank", str(folder), str(copies))
    print(
        f"cross-rank part at {cross['ranks']} ranks: {cross['cross_rank_s']:.2f} s (rules, rank table, "
        f"overview, report), {cross['render_s']:.2f} s rendering report.md ({cross['report_md_kb']:.0f} kB) "
        f"and report.html ({cross['report_html_kb']:.0f} kB); report.json {cross['report_json_mb']:.1f} MB; "
        f"driver peak RSS {cross['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
