"""Text that scripts, traces and file names put into what trainadvisor writes (issue 28):
credentials masked wherever they reach, Markdown and HTML that show such text as text, a
reproduce command that survives a shell, and the small claims the reports make."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import DATA, load_report, run_cli
from support.hostile_text import ARGS, PASSWORD, PHRASE, SHOWN, TOKEN

from trainadvisor.measure.runner import RunSpec, measure
from trainadvisor.profile.runs import ProfileOptions, reproduce_command
from trainadvisor.report.render import load_report as load_saved
from trainadvisor.report.render import render_markdown
from trainadvisor.resources import templates_dir

# A script that prints its credentials and fails quoting them, after a few steps.
LEAKS = """\
import argparse, sys
import torch
parser = argparse.ArgumentParser()
parser.add_argument("--api-key")
parser.add_argument("--db")
parser.add_argument("--passphrase")
args = parser.parse_args()
print("using key", args.api_key, "db", args.db, flush=True)
print("phrase", args.passphrase, file=sys.stderr, flush=True)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    if step == 8:
        raise RuntimeError(f"could not log in with {args.api_key} to {args.db} ({args.passphrase})")
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""


def _every_file(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): p.read_bytes().decode("utf-8", "replace")
        for p in folder.rglob("*")
        if p.is_file() and not p.name.endswith(".gz")
    }


def test_a_run_masks_what_the_script_printed_in_its_log_and_result(tmp_path: Path) -> None:
    script = tmp_path / "leaks.py"
    script.write_text(LEAKS)
    raw = measure(RunSpec("after", script, ARGS, tmp_path, 1, 1, show_output=False))
    assert raw.status == "window_complete" and raw.log_file == "logs/after.log"
    log = (tmp_path / "logs" / "after.log").read_text()
    assert sorted(log.splitlines()) == ["phrase ***", "using key *** db postgres://u:***@h/db"]
    for name, text in _every_file(tmp_path).items():
        assert TOKEN not in text and PASSWORD not in text and PHRASE not in text, name


def test_a_secret_in_the_scripts_exception_is_masked_in_every_report_file(tmp_path: Path) -> None:
    script = tmp_path / "leaks.py"
    script.write_text(LEAKS)
    out = tmp_path / "r"
    result = run_cli("profile", "--warmup", "2", "--steps", "10", "--out", out, script, *ARGS, cwd=tmp_path)
    assert result.returncode == 3, result.stderr[-2000:]
    report = load_report(out)
    assert report["command"][-6:] == SHOWN
    error = "RuntimeError: could not log in with *** to postgres://u:***@h/db (***)"
    assert report["baseline"]["raw"]["error"] == error
    md = (out / "report.md").read_text()
    assert (
        r"**The script failed:** RuntimeError: could not log in with \*\*\* to "
        r"postgres://u:\*\*\*@&#8203;h/db (\*\*\*)" in md.splitlines()
    )
    assert f"<p><b>The script failed:</b> {error}</p>" in (out / "report.html").read_text()
    files = _every_file(out)
    assert {"report.md", "report.json", "report.html"} <= set(files)
    for name, text in files.items():
        assert TOKEN not in text and PASSWORD not in text and PHRASE not in text, name
    # trainadvisor's own last word (the script's own traceback above it is the script's)
    assert result.stderr.splitlines()[-1] == (
        f"trainadvisor: error: {script} failed: {error}. What was measured before it failed is in "
        f"{out / 'report.html'}"
    )


def test_compare_shows_the_heads_exception_as_text(tmp_path: Path) -> None:
    saved = DATA / "report" / "report.json"
    base, head = tmp_path / "base", tmp_path / "head`s"
    for folder in (base, head):
        folder.mkdir()
        shutil.copy(saved, folder / "report.json")
    data = json.loads(saved.read_text())
    data["script"] = "train`s.py"
    data["baseline"]["raw"]["status"] = "script_failed"
    data["baseline"]["raw"]["error"] = (
        "RuntimeError: <img src=x onerror=alert(1)>\r\n# pwned @octocat [click](https://evil) \u202e\x1b[2J"
    )
    (head / "report.json").write_text(json.dumps(data))
    result = run_cli("compare", "--format", "markdown", base, head, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "### ❌ trainadvisor compare: regression_likely"
    assert lines[2] == (
        r"the head's run did not complete (script failed: RuntimeError: "
        r"\<img src=x onerror=alert(1)\> \# pwned @&#8203;octocat \[click\](https://evil) \\u202e\\x1b\[2J)."
    )
    assert lines[4].startswith("Base `/work/main/examples/slow_input_mnist.py` vs head ``train`s.py`` (")
    shown = run_cli("compare", base, head, cwd=tmp_path).stdout  # the terminal: no escape acts
    assert "\x1b" not in shown and "\u202e" not in shown and "regression_likely" in shown


def test_analyze_shows_a_hostile_trace_file_name_as_text(tmp_path: Path) -> None:
    name = "x|<b>hi @octocat [l](http:evil) \u202e\x1b[31mred\rz.json.gz"
    shutil.copy(DATA / "traces" / "profiler_steps.json.gz", tmp_path / name)
    result = run_cli("analyze", "--out", tmp_path / "r", tmp_path / name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    md = (tmp_path / "r" / "report.md").read_text().splitlines()
    shown = r"x\|\<b\>hi @&#8203;octocat \[l\](http:evil) \\u202e\\x1b\[31mred z.json.gz"
    assert md[4] == f"| | {shown} | "
    page = (tmp_path / "r" / "report.html").read_bytes().decode()  # a bare CR as it is
    assert "<th>x|&lt;b&gt;hi @octocat [l](http:evil) \\u202e\\x1b[31mred\rz.json.gz</th>" in page
    assert "\x1b" not in page + "\n".join(md) and "\u202e" not in page + "\n".join(md)


def test_the_terminal_shows_a_hostile_file_name_and_exception_as_text(tmp_path: Path) -> None:
    """trainadvisor's own terminal lines relayed escape sequences raw from a trace's file name
    and a script's exception: a window title, an OSC 8 link, an OSC 52 clipboard write, a CR
    that prints over the line. They are shown as escapes, the reports' way."""
    clipboard = "\x1b]52;c;cm0gLXJmIH4=\x07"
    name = f"t\x1b]0;pwned\x07{clipboard}\rz.json.gz"
    shutil.copy(DATA / "traces" / "profiler_steps.json.gz", tmp_path / name)
    result = run_cli("analyze", "--out", tmp_path / "r", tmp_path / name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\\x1b]0;pwned\\x07\\x1b]52;c;cm0gLXJmIH4=\\x07\\rz.json.gz" in result.stdout, result.stdout
    script = tmp_path / "fails.py"
    script.write_text(f"raise RuntimeError({'link ' + chr(27) + ']8;;http://evil' + chr(7) + 'click'!r})\n")
    failed = run_cli("profile", "--out", tmp_path / "p", script, cwd=tmp_path)
    assert "link \\x1b]8;;http://evil\\x07click" in failed.stdout + failed.stderr
    for text in (result.stdout, result.stderr, failed.stderr, failed.stdout):
        ours = [line for line in text.splitlines() if line.startswith(("trainadvisor", "  "))]
        assert not any(c in "\n".join(ours) for c in "\x1b\x07\r"), ours


def test_a_newline_inside_an_argument_survives_report_mds_one_line(tmp_path: Path) -> None:
    """report.md's reproduce line folded a newline inside an argument into a space (another
    argument, pasted back); it is written as bash's $'...' with escapes, and bash reads the line
    back as the same arguments."""
    import subprocess

    args = ["--prompt", "line one\nline two\tand 'quoted'", "plain"]
    command = reproduce_command(ProfileOptions(Path("s.py"), args, Path("out")))
    report = load_saved(DATA / "report")
    report.command = command
    md = render_markdown(report, templates_dir()).splitlines()[2]
    assert md.endswith("--prompt $'line one\\nline two\\tand \\'quoted\\'' plain`"), md
    read = subprocess.run(["bash", "-c", 'printf "%s\\0" ' + md.strip("` ")], capture_output=True, text=True)
    assert read.stdout.split("\0")[:-1] == command
