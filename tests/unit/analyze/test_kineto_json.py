"""What Kineto writes that JSON has not (`analyze.read.kineto_json`): C's `inf`, `-inf`, `nan`,
`-nan` are respelled as Python's json reads them, lone surrogate escapes become U+FFFD while real
pairs and escaped backslashes are kept, strings are otherwise left as written; `kineto_spelling`
tells msgspec's refusals of such spellings from a wrong cut, on msgspec's real messages."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from trainadvisor.analyze.read.kineto_json import kineto_json, kineto_spelling, lenient_loads


def _refusal(raw: bytes) -> str:
    """msgspec's own message for `raw`."""
    with pytest.raises(msgspec.DecodeError) as caught:
        msgspec.json.decode(raw)
    return str(caught.value)


def test_cs_words_for_numbers_are_spelled_as_pythons_json_reads_them() -> None:
    text = '[{"dur": inf, "a": -inf, "b": nan, "c": -nan, "d": 1.5}]'
    assert kineto_json(text) == '[{"dur": Infinity, "a": -Infinity, "b": NaN, "c": NaN, "d": 1.5}]'
    event = json.loads(kineto_json(text))[0]
    assert event["dur"] == math.inf and event["a"] == -math.inf
    assert math.isnan(event["b"]) and math.isnan(event["c"]) and event["d"] == 1.5


def test_javascripts_spellings_are_kept() -> None:
    text = "[NaN, Infinity, -Infinity, true, false, null]"
    assert kineto_json(text) == text


def test_words_inside_strings_are_left_as_written() -> None:
    text = r'{"name": "inf nan -nan NaN \"inf\"", "inf": inf}'
    assert kineto_json(text) == r'{"name": "inf nan -nan NaN \"inf\"", "inf": Infinity}'


def test_lone_surrogates_become_the_replacement_character_and_pairs_are_kept() -> None:
    text = r'["\ud800", "x\udc00y", "\ud83d\ude00", "\uD83D\uDE00", "\ud800\u0041", "\udc00\udc01"]'
    assert kineto_json(text) == (
        r'["\ufffd", "x\ufffdy", "\ud83d\ude00", "\uD83D\uDE00", "\ufffd\u0041", "\ufffd\ufffd"]'
    )
    assert json.loads(kineto_json(text)) == ["\ufffd", "x\ufffdy", "😀", "😀", "\ufffdA", "\ufffd\ufffd"]


def test_an_escaped_backslash_before_u_is_no_escape() -> None:
    # `\\ud800` is a backslash, then the text ud800; `\\\ud800` is a backslash, then a lone surrogate;
    # `\\ud800\udc00` is a backslash, the text ud800, then a lone low surrogate
    text = r'["\\ud800", "\\\ud800", "\\ud800\udc00"]'
    assert kineto_json(text) == r'["\\ud800", "\\\ufffd", "\\ud800\ufffd"]'
    assert json.loads(kineto_json(text)) == ["\\ud800", "\\\ufffd", "\\ud800\ufffd"]


def test_text_holding_a_nul_is_left_to_fail_as_it_is() -> None:
    assert kineto_json("[inf]\x00") == "[inf]\x00"


def test_msgspecs_refusals_of_kinetos_spellings_are_told_from_other_faults() -> None:
    for raw in (b'[{"dur": inf}]', b'[{"dur": -inf}]', b'[{"dur": -nan}]', b"[NaN]", b"[1, Infinity]"):
        assert kineto_spelling(raw, _refusal(raw)), raw
    for raw in (b'["\\ud800"]', b'["\\udc00"]', b'["\\ud800\\u0041"]'):  # lone surrogates
        assert kineto_spelling(raw, _refusal(raw)), raw
    for raw in (b"[1, x]", b'[{"dur": 1}', b'[{"name": "abc'):  # a wrong character, a cut
        assert not kineto_spelling(raw, _refusal(raw)), raw


def test_the_byte_a_message_names_decides_and_truncation_needs_a_surrogate_in_the_chunk() -> None:
    assert kineto_spelling(b"[1, inf]", "JSON is malformed: invalid character (byte 4)")
    assert not kineto_spelling(b"[1, inf]", "JSON is malformed: invalid character (byte 3)")  # the space
    assert kineto_spelling(b"", "invalid utf-16 surrogate pair")
    assert kineto_spelling(b'["a\\uD800', "Input data was truncated")
    assert not kineto_spelling(b'["a\\u0041', "Input data was truncated")


def test_msgspecs_refusal_of_a_bare_nan_is_told_as_kinetos_spelling() -> None:
    raw = b'[{"dur": nan}]'
    assert kineto_spelling(raw, _refusal(raw))


def test_lenient_loads_reads_json_and_kinetos_spellings() -> None:
    assert lenient_loads(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    document = lenient_loads(b'{"dur": inf, "ts": -nan, "name": "nan"}')
    assert document["dur"] == math.inf and math.isnan(document["ts"]) and document["name"] == "nan"
    # a Kineto spelling sends the whole document through kineto_json: its lone surrogate too
    assert lenient_loads(b'["\\ud800", -inf]') == ["\ufffd", -math.inf]


def test_lenient_loads_replaces_a_lone_surrogate_in_an_otherwise_strict_document() -> None:
    assert lenient_loads(b'{"name": "\\ud800"}') == {"name": "\ufffd"}


def test_lenient_loads_reads_bytes_that_are_not_utf8_with_replacements() -> None:
    assert lenient_loads(b'["caf\xe9", inf]') == ["caf\ufffd", math.inf]


def test_lenient_loads_refuses_a_cut_document() -> None:
    with pytest.raises(ValueError):
        lenient_loads(b'{"traceEvents": [1, 2')
