"""Text that scripts, traces and file names put into what trainadvisor writes (issue 28):
credentials masked wherever they reach, Markdown and HTML that show such text as text, a
reproduce command that survives a shell, and the small claims the reports make."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import warnings
from pathlib import Path

import pytest
import torch
from conftest import DATA, load_report
from support.hostile_text import ARGS, PASSWORD, PHRASE, SHOWN, TOKEN, URL
from torch.utils.data import DataLoader, TensorDataset

from trainadvisor.measure.console import NoiseFilter
from trainadvisor.profile.runs import ProfileOptions, reproduce_command
from trainadvisor.records import Evidence, Finding, FixOutcome, Overrides
from trainadvisor.redact import Secrets, mask_arguments
from trainadvisor.report import mdtext
from trainadvisor.report.render import load_report as load_saved
from trainadvisor.report.render import render_html, render_markdown
from trainadvisor.resources import templates_dir


def test_credentials_in_urls_and_passphrases_are_masked_on_the_command_line() -> None:
    shown, masked = mask_arguments(
        [*ARGS, "https://user:pass@host/x", "--password=pw1", "--secret", "s3", "HF_API_KEY=abc",
         "--url", "https://host/x@y", "--mirror=ftp://:anon@m.org"]
    )  # fmt: skip
    assert shown == [
        *SHOWN, "https://user:***@host/x", "--password=***", "--secret", "***", "HF_API_KEY=***",
        "--url", "https://host/x@y", "--mirror=ftp://:***@m.org",
    ]  # fmt: skip
    assert masked == [
        "--api-key", "--db", "--passphrase", "https://user:***@host/x", "--password", "--secret",
        "HF_API_KEY", "--mirror",
    ]  # fmt: skip


def test_a_masked_value_is_masked_in_any_text_and_file(tmp_path: Path) -> None:
    secrets = Secrets.of([*ARGS, "--key", "id"])
    text = f"no {TOKEN}; {URL} or {PASSWORD}; '{PHRASE}'; id=3 is valid; see https://a:b@c.org/ and u:p@h"
    assert secrets.text(text) == (
        "no ***; postgres://u:***@h/db or ***; '***'; ***=3 is valid; see https://a:***@c.org/ and u:p@h"
    )
    log = tmp_path / "run.log"
    log.write_bytes(f"key {TOKEN}\r 50%|##   |{PHRASE}\n".encode())
    quoted = tmp_path / "result.json"  # the child's JSON escapes what it quotes
    tricky = Secrets.of(["--token", 'pa"ss\\wörd'])
    quoted.write_text(json.dumps({"error": 'RuntimeError: pa"ss\\wörd'}))
    published = tmp_path / "published.log"  # a report folder links a staged log
    os.link(log, published)
    secrets.file(log)
    tricky.file(quoted)
    assert log.read_bytes() == published.read_bytes() == b"key ***\r 50%|##   |***\n"
    assert json.loads(quoted.read_text()) == {"error": "RuntimeError: ***"}


def test_markdown_shows_control_characters_mentions_and_markup_as_text() -> None:
    hostile = "a\rb\u2028c \x1b[31mred\x1b[0m \u202eevil\u2066 @octocat a@b.io #12 <b>x</b> [l](http://e)"
    assert mdtext.inline(hostile) == (
        r"a b c \\x1b\[31mred\\x1b\[0m \\u202eevil\\u2066 @&#8203;octocat a@&#8203;b.io \#&#8203;12 "
        r"\<b\>x\</b\> \[l\](http://e)"
    )
    assert mdtext.cell("x|y\rz") == r"x\|y z"
    assert mdtext.code("run \x1b[2J `now`\r") == "`` run \\x1b[2J `now` ``"
    assert mdtext.visible("\x07\x85\u200f\u061c\tok") == "\\x07\\x85\\u200f\\u061c\tok"


def test_report_html_shows_the_scripts_failure_escaped() -> None:
    report = load_saved(DATA / "report")
    assert report.baseline is not None
    report.baseline.raw.error = "RuntimeError: <script>alert(1)</script> \u202e"
    page = render_html(report, templates_dir())
    assert (
        "<p><b>The script failed:</b> RuntimeError: &lt;script&gt;alert(1)&lt;/script&gt; \\u202e</p>"
        in page.splitlines()
    )


def test_the_reproduce_command_survives_a_shell() -> None:
    args = ["--name", "a;b", "$(touch pwned)", "", "it's", "--hf-token", "x y", "*", "`id`"]
    command = reproduce_command(ProfileOptions(Path("my script.py"), args, Path("out dir")))
    report = load_saved(DATA / "report")
    report.command = command
    md = render_markdown(report, templates_dir()).splitlines()[2]
    assert md == (
        "``trainadvisor profile --warmup 5 --steps 20 --out 'out dir' --seed 0 'my script.py' --name "
        "'a;b' '$(touch pwned)' '' 'it'\"'\"'s' --hf-token '***' '*' '`id`'``"
    )
    assert shlex.split(md.strip("` ")) == command
    page = render_html(report, templates_dir())
    shown = re.findall(r"<tr><td>reproduce</td><td><code>(.*?)</code>", page)
    assert [shlex.split(html.unescape(s)) for s in shown] == [command]


def test_the_lightning_callback_speaks_of_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lightning = pytest.importorskip("lightning")
    from trainadvisor.integrations import LightningAdvisor

    LightningAdvisor(out=tmp_path / "new").advisor.close()
    assert capsys.readouterr().err == (
        f"trainadvisor: advising after 5 warmup steps; the report goes to {tmp_path / 'new'} "
        "(LightningAdvisor(out=...) to choose)\n"
    )
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        LightningAdvisor(out=tmp_path / "mine").advisor.close()
    assert [str(w.message).split(": the folder")[0] for w in caught] == [
        f"trainadvisor: the advisor stopped (UsageError: LightningAdvisor(out=...) {tmp_path / 'mine'}"
    ]

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4)
    callback = LightningAdvisor(warmup=1, steps=2, out=tmp_path / "r", min_time=0.0, max_warmup=None)
    lightning.Trainer(
        max_epochs=1, callbacks=[callback], accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    ).fit(Module(), data)  # fmt: skip
    report = load_report(tmp_path / "r")
    assert report["baseline"]["raw"]["step_source"] == "LightningAdvisor"
    assert report["notes"][0].startswith("Measured in-process by LightningAdvisor: fixes are not applied")


def test_a_search_note_follows_its_fix_after_a_space() -> None:
    report = load_saved(DATA / "report")
    report.fix_outcomes = [
        FixOutcome(
            "dataloader-workers", "data-stall", "no_gain",
            "no candidate was at least 5% faster than the baseline, once its drift is counted",
            Overrides(), [], search="stopped at 2 workers: they gained less than 10%",
        )
    ]  # fmt: skip
    assert (
        "- fix `dataloader-workers`: no gain: no candidate was at least 5% faster than the baseline, "
        "once its drift is counted (stopped at 2 workers: they gained less than 10%)"
    ) in render_markdown(report, templates_dir()).splitlines()


def test_report_md_names_the_line_of_a_host_sync() -> None:
    report = load_saved(DATA / "report")
    sites = "host_tensors.py:61 (.item() in main); train.py:9 (.cpu() in step)"
    report.findings = [
        Finding(
            "host-sync", "The host waits for the GPU inside every step", "low",
            "The host waited for the GPU 1.0 times per step (0.10 ms, 1.0% of the step).",
            [Evidence("syncs_per_step", "Synchronisations per step", 1.0),
             Evidence("sync_sites", "In your code (function, first line)", sites)],
            [], "Keep values on the GPU.", "x.item()", "x", "PyTorch's guide",
        )
    ]  # fmt: skip
    assert (
        r"| **low** | The host waited for the GPU 1.0 times per step (0.10 ms, 1.0% of the step). "
        r"In your code (function, first line): host\_tensors.py:61 (.item() in main); train.py:9 "
        r"(.cpu() in step) | `host-sync` |"
    ) in render_markdown(report, templates_dir()).splitlines()


def test_kinetos_chatter_after_a_progress_bar_is_dropped() -> None:
    """A tqdm bar ends its updates with no newline: Kineto's line starts in the middle of one."""
    stream = (
        b"\r 50%|#####     | 5/10 [00:01<00:01]"
        b"USDT:2026-11-24 07:04:22 3053:3053 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
        b"\r 60%|######    | 6/10 [00:01<00:01]USDT is a word\n"
        b"STAGE:2026-11-24 07:04:22 3053:3053 ActivityProfilerController.cpp:312] Completed Stage: Warm Up\n"
    )
    kept = b"\r 50%|#####     | 5/10 [00:01<00:01]\r 60%|######    | 6/10 [00:01<00:01]USDT is a word\n"
    for size in (1, 3, 7, 64, len(stream)):
        noise = NoiseFilter()
        out = b"".join(noise.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        assert out + noise.flush() == kept, size
    assert NoiseFilter().feed(b"\r 70%|####### | 7/10") == b"\r 70%|####### | 7/10"
