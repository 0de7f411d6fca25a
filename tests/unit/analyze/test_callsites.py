"""Where in the user's code a traced event came from (`analyze.trace.callsites`): the innermost
user frame around a time, the lines of a function that call a torch built-in (read from a small
script written here), and the site a report names, most frequent first."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainadvisor.analyze.trace.callsites import (
    BUILTIN,
    FRAME,
    call_lines,
    innermost,
    parse,
    sites,
    user_site,
)
from trainadvisor.analyze.trace.trace_records import Facts

# Line numbers: `def step` is line 4 (its calls: .item() on 5 and 8, torch.zeros on 6), `def other`
# line 12 (.item() on 13), Model.step line 17 (.item() on 18), the module's own print on 21.
SCRIPT = """import torch


def step(x):
    y = x.item()
    z = torch.zeros(3)
    if y:
        z = x.cpu().item()
    return z


def other(x):
    return x.item()


class Model:
    def step(self, x):
        return x.item()


print(torch.zeros(1).item())
"""


@pytest.fixture
def script_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def test_innermost_is_the_latest_starting_span_that_holds_the_time() -> None:
    spans = [(0.0, 100.0, "outer"), (10.0, 20.0, "a"), (30.0, 40.0, "b")]
    assert innermost(spans, 15.0) == "a"
    assert innermost(spans, 25.0) == "outer"  # past a, before b
    assert innermost(spans, 30.0) == "b"  # a span holds its start
    assert innermost(spans, 40.0) == "b"  # and its end
    assert innermost(spans, 150.0) is None
    assert innermost(spans, -1.0) is None
    assert innermost([], 15.0) is None
    assert innermost(None, 15.0) is None


def test_of_spans_that_start_together_the_one_that_ends_first_is_innermost() -> None:
    # a frame and the frame it calls at once share a start at the trace's microsecond resolution
    spans = sorted([(0.0, 100.0, "train.py(9): main"), (10.0, 50.0, "train.py(4): step"),
                    (10.0, 20.0, "train.py(6): loss_of")])  # fmt: skip
    assert innermost(spans, 15.0) == "train.py(6): loss_of"
    assert innermost(spans, 30.0) == "train.py(4): step"  # past the inner one's end
    assert innermost(spans, 70.0) == "train.py(9): main"


def test_a_frame_and_a_builtin_are_read_from_their_event_names() -> None:
    frame = FRAME.match("train.py(4): step")
    assert frame is not None and (frame["file"], frame["line"], frame["func"]) == ("train.py", "4", "step")
    assert FRAME.match("<string>(1): <module>") is None
    builtin = BUILTIN.match("<built-in method item of Tensor object at 0x7f00>")
    assert builtin is not None and builtin["name"] == "item"
    assert BUILTIN.match("aten::item") is None


def test_parse_reads_a_script_and_gives_none_for_one_it_cannot(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    broken = tmp_path / "broken.py"
    broken.write_text("def (:\n")
    tree = parse(good)
    assert tree is not None and len(tree.body) == 1
    assert parse(broken) is None
    assert parse(tmp_path / "missing.py") is None


def test_the_calls_of_a_builtin_in_the_function_holding_the_frames_line(script_dir: Path) -> None:
    assert call_lines("train.py", 4, "step", "item", (script_dir,)) == [5, 8]
    assert call_lines("train.py", 4, "step", "zeros", (script_dir,)) == [6]
    assert call_lines("train.py", 17, "step", "item", (script_dir,)) == [18]  # Model.step
    assert call_lines("train.py", 12, "other", "cpu", (script_dir,)) == []


def test_when_no_function_of_that_name_holds_the_line_all_of_them_count(script_dir: Path) -> None:
    assert call_lines("train.py", 100, "step", "item", (script_dir,)) == [5, 8, 18]


def test_the_module_level_frame_looks_through_the_whole_file(script_dir: Path) -> None:
    assert call_lines("train.py", 1, "<module>", "item", (script_dir,)) == [5, 8, 13, 18, 21]
    assert call_lines("train.py", 1, "<module>", "print", (script_dir,)) == [21]


def test_the_file_is_found_under_the_first_folder_that_has_it(tmp_path: Path) -> None:
    empty, scripts, other = tmp_path / "empty", tmp_path / "scripts", tmp_path / "other"
    for folder in (empty, scripts, other):
        (folder / "pkg").mkdir(parents=True)
    (scripts / "pkg" / "loop.py").write_text("def run(x):\n    return x.item()\n")
    (other / "pkg" / "loop.py").write_text("def run(x):\n    pass\n    return x.item()\n")
    assert call_lines("pkg/loop.py", 1, "run", "item", (empty, scripts, other)) == [2]
    assert call_lines("pkg/loop.py", 1, "run", "item", (other, scripts)) == [3]


def test_the_current_folder_is_looked_in_last(script_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(script_dir)
    assert call_lines("train.py", 4, "step", "item", ()) == [5, 8]


def test_a_file_not_found_or_not_parsed_has_no_lines(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def step(:\n    x.item()\n")
    assert call_lines("no_such_script_here.py", 4, "step", "item", (tmp_path,)) == []
    assert call_lines("broken.py", 1, "step", "item", (tmp_path,)) == []


def _facts(source_dirs: tuple[Path, ...]) -> Facts:
    return Facts(
        source_dirs=source_dirs,
        frames={1: [(0.0, 100.0, "train.py|4|step")], 2: [(0.0, 100.0, "gone.py|3|loop")]},
        builtins={
            1: [(10.0, 20.0, "item"), (30.0, 40.0, "zeros"), (60.0, 70.0, "print")],
            2: [(10.0, 20.0, "item")],
        },
    )


def test_a_user_site_names_the_call_lines_and_the_function(script_dir: Path) -> None:
    c = _facts((script_dir,))
    assert user_site(c, 1, 15.0) == "train.py:5,8 (.item() in step)"
    assert user_site(c, 1, 35.0) == "train.py:6 (zeros() in step)"  # a factory: called, not a method
    assert user_site(c, 1, 65.0) == "train.py (print() in step)"  # no print in step: no line


def test_a_user_site_without_a_builtin_or_a_readable_file_names_less(script_dir: Path) -> None:
    c = _facts((script_dir,))
    assert user_site(c, 1, 50.0) == "train.py (in step)"
    assert user_site(c, 2, 15.0) == "gone.py (.item() in loop)"
    assert user_site(c, 1, 150.0) is None  # outside every frame
    assert user_site(c, 3, 15.0) is None  # a thread without frames


def test_sites_are_distinct_and_the_most_frequent_first(script_dir: Path) -> None:
    c = _facts((script_dir,))
    events = [(2, 15.0), (1, 50.0), (1, 15.0), (1, 16.0), (1, 150.0), (1, 17.0), (3, 1.0), (1, 55.0)]
    events.append((2, 16.0))
    # .item() in step 3 times; gone.py's and "in step" twice each, kept in the order first seen
    item, gone, bare = "train.py:5,8 (.item() in step)", "gone.py (.item() in loop)", "train.py (in step)"
    assert sites(c, events) == [item, gone, bare]
    assert sites(c, [(1, 150.0), (3, 1.0)]) == []
