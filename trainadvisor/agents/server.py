"""`trainadvisor mcp`: the Model Context Protocol over stdio, with the official Python SDK
(`pip install 'trainadvisor[mcp]'`). Tools:

- `profile`: measure a training script, try the fixes and keep only those that are faster and
  train the same; progress notifications carry trainadvisor's progress lines; cancelling the
  call stops the run (the script and its DataLoader workers too).
- `analyze`: existing torch.profiler traces (files, folders, archives, s3:// prefixes).
- `compare`: two saved reports, or one against a named baseline: the CI gate's verdict.
- `explain`: one finding of a saved report: its evidence, where its thresholds come from, what
  to write instead, and what its fixes measured.

Each runs trainadvisor's command line in a child process (`python -m trainadvisor ... --format
json`) and answers with `digest.summary` (at most 8 KB) or the comparison, never raw traces."""

# No `from __future__ import annotations`: the SDK reads the tools' annotations at run time, and
# `Context` is imported only when the server starts (the SDK is an optional extra).
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from trainadvisor._serial import to_plain
from trainadvisor.agents.digest import SUMMARY_MAX_BYTES, summary
from trainadvisor.errors import MissingDependencyError, TrainAdvisorError, UsageError
from trainadvisor.records import fix_outcomes_of
from trainadvisor.report.saved import saved_report

STOP_GRACE_S = 30.0  # a cancelled run's time to stop its script and workers before it is killed
INSTRUCTIONS = (
    "trainadvisor profiles PyTorch training and measures each fix by running it: a fix is kept "
    "only if it was measured faster and the loss of the same seeded steps is unchanged. Call "
    "`profile` on a training script (it runs the script several times: minutes), `analyze` on "
    "saved traces, `compare` on two reports, `explain` for one finding. Trust `kept` fixes and "
    "apply their diff; `opportunity` fixes change what is learned; `inconclusive` ones were not "
    "measurable on this machine."
)


def _server() -> Any:
    try:
        from mcp.server.mcpserver import Context, MCPServer
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:
        raise MissingDependencyError(
            "`trainadvisor mcp` needs the Model Context Protocol SDK: pip install 'trainadvisor[mcp]'"
        ) from None
    server = MCPServer("trainadvisor", instructions=INSTRUCTIONS)
    # the SDK tells an agent the message of a ToolError; any other exception only as "Error
    # executing tool ...": trainadvisor's own errors (what to do next) go out as ToolErrors
    told = _told_as(ToolError)

    @server.tool()
    async def profile(
        script: str,
        ctx: Context,
        args: list[str] | None = None,
        measure_fixes: bool = True,
        budget: str | None = None,
        out: str = "trainadvisor-report",
        cwd: str | None = None,
    ) -> dict[str, Any]:
        """Profile SCRIPT (run as `python SCRIPT ARGS`), diagnose what holds its training
        loop back, and measure each proposed fix by running it (measure_fixes=False: diagnose
        only). budget: the most the trials may take (10m, 90s). Returns the report's summary:
        findings, each fix's status, measured gain and code change (a unified diff)."""
        command = ["profile", "--format", "json", "--out", out]
        command += ([] if measure_fixes else ["--no-fix"]) + (["--budget", budget] if budget else [])
        with told:
            return await _reported(command + [script, *(args or [])], out, cwd, ctx)

    @server.tool()
    async def analyze(
        paths: list[str], ctx: Context, out: str = "trainadvisor-report", cwd: str | None = None
    ) -> dict[str, Any]:
        """Analyse existing torch.profiler traces (files, folders of one per rank, archives, or
        s3:// prefixes): the per-step breakdown, the rules' findings, the straggler rank."""
        with told:
            return await _reported(["analyze", "--format", "json", "--out", out, *paths], out, cwd, ctx)

    @server.tool()
    async def compare(
        head: str,
        ctx: Context,
        base: str | None = None,
        against: str | None = None,
        gate_pct: float = 5.0,
        metric: str = "step_time",
        cwd: str | None = None,
    ) -> dict[str, Any]:
        """Compare report HEAD with report BASE, or with a named baseline (against="baseline:main"):
        regression_likely, improvement_likely, neutral or inconclusive, with the change, its
        interval over the runs' windows and what differs between the runs."""
        with told:
            return await _compared(head, base, against, gate_pct, metric, cwd, ctx)

    @server.tool()
    def explain(report: str, rule: str) -> dict[str, Any]:
        """One finding of a saved report (a folder or its report.json) by its rule id: the
        evidence measured, where its thresholds come from, what to write instead, and what each
        of its fixes measured, with the code change."""
        with told:
            return explained(report, rule)

    return server


class _told_as:  # noqa: N801 - used as a `with` statement
    """Re-raises trainadvisor's own errors as `tool_error` (the SDK's ToolError), message kept."""

    def __init__(self, tool_error: type[Exception]) -> None:
        self.tool_error = tool_error

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, _tb: Any) -> None:
        if isinstance(exc, TrainAdvisorError):
            raise self.tool_error(str(exc)) from exc


async def _compared(
    head: str, base: str | None, against: str | None, gate_pct: float, metric: str, cwd: str | None, ctx: Any
) -> dict[str, Any]:
    if not base and not against:
        raise UsageError("give the report to compare with: base (a report folder) or against (baseline:NAME)")
    command = ["compare", "--format", "json", "--gate", str(gate_pct), "--metric", metric]
    command += ["--against", against] if against else [base or ""]
    code, out, err = await _run([*command, head], cwd, ctx)
    if code not in (0, 1):
        raise UsageError(_last_line(err))
    result: dict[str, Any] = json.loads(out)
    if len(out) > SUMMARY_MAX_BYTES:  # the verdict and its reasons fit; the table may not
        result.pop("metrics", None)
    return result


async def _reported(command: list[str], out: str, cwd: str | None, ctx: Any) -> dict[str, Any]:
    code, _, err = await _run(command, cwd, ctx)
    folder = Path(cwd or ".") / out
    if code not in (0, 3) or not (folder / "report.json").is_file():  # 3: the script failed, reported
        raise UsageError(_last_line(err))
    return summary(saved_report(folder), Path(out))


def explained(report: str, rule: str) -> dict[str, Any]:
    """The finding of `rule` in a saved report, with its fixes' outcomes."""
    loaded = saved_report(Path(report))
    found = [f for f in loaded.findings if f.rule == rule]
    if not found:
        known = ", ".join(f.rule for f in loaded.findings) or "none"
        raise UsageError(f"no finding {rule!r} in {report}: it has {known}")
    finding: dict[str, Any] = to_plain(found[0])
    outcomes = [o for o in fix_outcomes_of(loaded) if o.fix in found[0].fixes]
    keys = ("fix", "status", "chosen", "gain", "gain_low", "unit", "reason", "diff")
    finding["fix_outcomes"] = [{key: getattr(o, key) for key in keys} for o in outcomes]
    return finding


def _last_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    return lines[-1] if lines else "trainadvisor failed without a message"


async def _run(command: list[str], cwd: str | None, ctx: Any) -> tuple[int, str, str]:
    """trainadvisor's CLI in a child process; each line it writes to stderr is a progress
    notification; cancelled, the child gets SIGTERM (it stops the script and its workers), then
    after STOP_GRACE_S its whole process group SIGKILL."""
    import anyio

    err_lines: list[str] = []
    process = await anyio.open_process(
        [sys.executable, "-m", "trainadvisor", *command], cwd=cwd, start_new_session=True
    )
    try:
        async with anyio.create_task_group() as group:
            out = bytearray()

            async def read_out() -> None:
                assert process.stdout is not None
                async for chunk in process.stdout:
                    out.extend(chunk)

            group.start_soon(read_out)
            assert process.stderr is not None
            buffered = b""
            async for chunk in process.stderr:
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace")
                    err_lines.append(text)
                    if ctx is not None and text.startswith("trainadvisor"):
                        await ctx.report_progress(len(err_lines), None, text[:300])
        code = await process.wait()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await _stop(process)
        raise
    return code, out.decode(errors="replace"), "\n".join(err_lines)


async def _stop(process: Any) -> None:
    import anyio

    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    with anyio.move_on_after(STOP_GRACE_S):
        await process.wait()
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await process.wait()


def serve() -> None:
    """Serve over stdio until the client closes the connection."""
    _server().run("stdio")
