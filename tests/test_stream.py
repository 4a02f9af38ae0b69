"""FinalStream: the `final` text of a reply, decoded while it streams in."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_core.stream import FinalStream
from agent_core.text import clean

FFFD = "\ufffd"


def stream_all(chunks: Iterable[str]) -> tuple[str, FinalStream]:
    stream = FinalStream()
    return "".join(stream.feed(chunk) for chunk in chunks), stream


def splits(reply: str) -> list[list[str]]:
    """The reply whole, one character at a time, and in threes."""
    return [
        [reply],
        list(reply),
        [reply[i : i + 3] for i in range(0, len(reply), 3)],
    ]


EXAMPLES = [
    pytest.param('{"final": "hello"}', "hello", id="final-first"),
    pytest.param('{ "final" :\n "spaced" , "more": 1 }', "spaced", id="whitespace"),
    pytest.param(
        '{"a": "x\\"}{", "b": {"final": "nested"}, "final": "yes"}', "yes", id="tricky-keys"
    ),
    pytest.param(
        '{"list": [1, "]", {"x": [null, "\\\\"]}], "n": -1.5e3, "t": true, "f": false, '
        '"z": null, "final": "after values"}',
        "after values",
        id="every-kind-of-value",
    ),
    pytest.param('{"fin\\u0061l": "escaped key"}', "escaped key", id="escaped-key"),
    pytest.param('Sure! Here it is: {"final": "done"} Bye.', "done", id="after-prose"),
    pytest.param('```json\n{"final": "fenced"}\n```', "fenced", id="json-fence"),
    pytest.param('Here:\n```\n{"final": "fenced"}\n```', "fenced", id="plain-fence"),
    pytest.param(
        '<think>I could say {"final": "decoy"} here.</think>\n{"final": "real"}',
        "real",
        id="think-decoy",
    ),
    pytest.param(
        '<think>a < b, </thin, <{"final": "decoy"}</think>{"final": "real"}',
        "real",
        id="think-with-partial-tags",
    ),
    pytest.param(
        'a <thinking> b <<think>{"final": "decoy"} <</think>{"final": "real"}',
        "real",
        id="near-tags",
    ),
    pytest.param('1<{"final": "real"}', "real", id="brace-after-angle"),
    pytest.param(
        'Use {x} or {{ or { y or {1: 2} or {"k" x} then {"final": "real"}',
        "real",
        id="stray-braces",
    ),
    pytest.param('{"a": 1, {"final": "real"}', "real", id="broken-object-then-real"),
    pytest.param('{"a": 1 x "final": "no"}', "", id="missing-comma"),
    pytest.param('{"a" "final": "no"}', "", id="missing-colon"),
    pytest.param('{"a": @, "final": "no"}', "", id="not-a-value"),
    pytest.param('{"final": "first"} {"final": "second"}', "first", id="first-object-only"),
    pytest.param('{"tool": "x", "args": {}} {"final": "later"}', "", id="first-object-no-final"),
    pytest.param('{} {"final": "later"}', "", id="empty-object-first"),
    pytest.param('<think>{"final": "hidden"}', "", id="unclosed-think"),
    pytest.param('{"finally": "no", "fina": "no"}', "", id="near-keys"),
    pytest.param('{"final": 42}', "", id="number-final"),
    pytest.param('{"final": {"text": "x"}}', "", id="object-final"),
    pytest.param('{"final": ["x"]}', "", id="array-final"),
    pytest.param('{"final": null}', "", id="null-final"),
    pytest.param('{"final": 1, "final": "second"}', "second", id="string-after-non-string"),
]


@pytest.mark.parametrize(("reply", "expected"), EXAMPLES)
def test_examples(reply: str, expected: str) -> None:
    for chunks in splits(reply):
        text, stream = stream_all(chunks)
        assert text == expected
        assert stream.text == expected


ESCAPES = [
    pytest.param(r"a\nb\tc\"d\\e\/f\bg\fh\ri", 'a\nb\tc"d\\e/f\bg\fh\ri', id="simple"),
    pytest.param(r"\u00e9\u4E2D\u0000", "\u00e9\u4e2d\u0000", id="unicode"),
    pytest.param(r"x\ud83d\ude00y", "x\U0001f600y", id="surrogate-pair"),
    pytest.param(r"\ud83d x", FFFD + " x", id="lone-high"),
    pytest.param(r"\ud83d", FFFD, id="lone-high-at-end"),
    pytest.param(r"\ude00x", FFFD + "x", id="lone-low"),
    pytest.param(r"\ud83d\ud83d\ude00", FFFD + "\U0001f600", id="high-then-pair"),
    pytest.param(r"\ud83d\n", FFFD + "\n", id="high-then-escape"),
    pytest.param(r"\ud83d\u0041", FFFD + "A", id="high-then-bmp"),
    pytest.param(r"a\qb", "a" + FFFD + "b", id="invalid-escape"),
    pytest.param(r"\u12G4", FFFD + "G4", id="bad-hex"),
    pytest.param("\\u12", FFFD, id="bad-hex-at-close"),
    pytest.param(r"\u12\n", FFFD + "\n", id="bad-hex-then-escape"),
    pytest.param("raw\nnewline", "raw\nnewline", id="raw-control"),
]


@pytest.mark.parametrize(("escaped", "expected"), ESCAPES)
def test_escapes(escaped: str, expected: str) -> None:
    reply = '{"final": "' + escaped + '"}'
    for chunks in splits(reply):
        text, stream = stream_all(chunks)
        assert text == expected
        assert stream.done


def test_surrogate_pair_split_at_every_pair_of_points() -> None:
    reply = '{"final": "a\\ud83d\\ude00b"}'
    for first in range(len(reply) + 1):
        for second in range(first, len(reply) + 1):
            text, _ = stream_all([reply[:first], reply[first:second], reply[second:]])
            assert text == "a\U0001f600b", (first, second)


def test_text_is_emitted_as_it_arrives() -> None:
    stream = FinalStream()
    assert stream.feed('Ok {"note": "x", "final": "hel') == "hel"
    assert stream.feed("lo\\") == "lo"
    assert stream.feed("n\\u00") == "\n"
    assert stream.feed("e9 \\ud83d") == "\u00e9 "
    assert not stream.done
    assert stream.feed('\\ude00"') == "\U0001f600"
    assert stream.done
    assert stream.text == "hello\n\u00e9 \U0001f600"


def test_nothing_after_the_final_string_closes() -> None:
    stream = FinalStream()
    assert stream.feed('{"final": "x"') == "x"
    assert stream.done
    assert stream.feed(', "final": "y"} {"final": "z"}') == ""
    assert stream.feed('"more"') == ""
    assert stream.text == "x"


def test_done_stays_false_without_a_string_final() -> None:
    text, stream = stream_all(['{"final": 3}', ' {"final": "late"}'])
    assert text == ""
    assert not stream.done
    assert stream.text == ""


# --- property: any reply json.dumps can write, cut anywhere ---------------------------------

_KEYS = st.text(max_size=6) | st.sampled_from(["final", "finally", "fina", "}", '"{'])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)
_OTHER_KEYS = st.dictionaries(_KEYS.filter(lambda key: key != "final"), _VALUES, max_size=3)

# Prose never holds "{", so braces come only from stray pieces that cannot start an object.
_PROSE = st.text(st.characters(exclude_characters="{"), max_size=20).filter(
    lambda text: "<think>" not in text
)
_NOT_A_KEY_START = st.characters(exclude_characters='"{}< \t\n\r')
_STRAY_BRACE = st.builds(
    lambda space, char: "{" + space + char, st.sampled_from(["", " ", "\n"]), _NOT_A_KEY_START
)
_THINK = st.builds(
    lambda text: f'<think>{text} {{"final": "decoy"}}</think>',
    st.text(max_size=20).filter(lambda text: "</think>" not in text),
)
_PREFIX = st.lists(_PROSE | _STRAY_BRACE | _THINK, max_size=4).map("".join)
_FENCES = st.sampled_from([("", ""), ("```json\n", "\n```"), ("```\n", "\n```")])
_SUFFIX = st.sampled_from(["", " Done.", '\n{"final": "later"}'])


@st.composite
def _replies(draw: st.DrawFn, final: st.SearchStrategy[str]) -> tuple[str, str]:
    """A reply around a final object, and the final text as written."""
    text = draw(final)
    body: dict[str, Any] = {**draw(_OTHER_KEYS), "final": text, **draw(_OTHER_KEYS)}
    encoded = json.dumps(
        body,
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, 2])),
    )
    opening, closing = draw(_FENCES)
    reply = draw(_PREFIX) + opening + encoded + closing + draw(_SUFFIX)
    return reply, text


@st.composite
def _cut(draw: st.DrawFn, reply: str) -> list[str]:
    if draw(st.booleans()):
        return list(reply)
    points = sorted(draw(st.lists(st.integers(0, len(reply)), max_size=12)))
    bounds = [0, *points, len(reply)]
    return [reply[start:end] for start, end in pairwise(bounds)]


# The default text strategy has no surrogates, so every final here is valid Unicode.
@given(data=st.data(), written=_replies(st.text()))
def test_any_reply_cut_anywhere_gives_the_final_text(
    data: st.DataObject, written: tuple[str, str]
) -> None:
    reply, final = written
    text, stream = stream_all(data.draw(_cut(reply)))
    assert text == final
    assert stream.done


# Lone surrogates, escaped by ensure_ascii, come out as U+FFFD (adjacent halves join).
_WITH_SURROGATES = st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr))


@given(data=st.data(), final=_WITH_SURROGATES)
def test_lone_surrogates_become_replacement_characters(data: st.DataObject, final: str) -> None:
    reply = json.dumps({"final": final}, ensure_ascii=True)
    text, _ = stream_all(data.draw(_cut(reply)))
    assert text == clean(final)


# --- linear time ---------------------------------------------------------------------------


def _megabyte_reply() -> tuple[str, str]:
    """About 1 MB that stops the fast paths often: stray braces, escapes, deep nesting."""
    prose = "Stray {x} and <b> and <thin tags. " * 6_000
    thinking = "<think>" + 'maybe {"final": "no"} < ' * 4_000 + "</think>"
    nested = "[" * 20_000 + '"a\\"]", ' * 20_000 + "]" * 20_000
    final = 'line\n\u00e9\U0001f600 "q" \\ ' * 15_000
    body = '{"other": ' + nested + ', "final": ' + json.dumps(final) + "}"
    return prose + thinking + body, final


def test_a_megabyte_reply_streams_in_linear_time() -> None:
    reply, final = _megabyte_reply()
    assert len(reply) > 1_000_000
    chunks = [reply[i : i + 7] for i in range(0, len(reply), 7)]
    started = time.perf_counter()
    text, stream = stream_all(chunks)
    elapsed = time.perf_counter() - started
    assert text == final
    assert stream.done
    assert elapsed < 10, f"{elapsed:.1f} s for {len(reply)} characters"
