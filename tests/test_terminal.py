"""workers.cli.terminal: what the CLI prints is safe for a terminal (the CLI: test_cli.py)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.cli.terminal import json_text, one_line, printable

UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, café", "plain text, café"),
        ("a\nb\tc", "a\nb\tc"),
        ("a\r\nb", "a\nb"),
        ("\x1b[8mhidden\x1b[0m", "�[8mhidden�[0m"),
        ("over\rwrite", "over�write"),
        ("\x9b2J \u202eevil \x07", "�2J �evil �"),
        ("\x00\x7f\u2028", "���"),
    ],
)
def test_printable_keeps_lines_and_tabs_and_marks_every_other_control(
    text: str, shown: str
) -> None:
    assert printable(text) == shown


def test_one_line_collapses_whitespace_and_cuts() -> None:
    assert one_line("a\n\n b\t\x1b[2Jc") == "a b �[2Jc"
    assert one_line("x" * 10, 5) == "xxxx…"
    assert one_line(ValueError("bad\x1b")) == "bad�"


@given(st.text())
def test_what_is_printed_has_no_control_but_newline_and_tab(text: str) -> None:
    assert not UNSAFE.search(printable(text))
    assert not UNSAFE.search(one_line(text))
    assert "\n" not in one_line(text)
    assert len(printable(text)) <= len(text)


@given(
    st.recursive(
        st.text() | st.integers(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)
    )
)
def test_json_text_is_the_same_json_without_terminal_controls(value: object) -> None:
    raw = json.dumps(value, ensure_ascii=False)
    shown = json_text(raw)
    assert not UNSAFE.search(shown)
    assert json.loads(shown) == value
