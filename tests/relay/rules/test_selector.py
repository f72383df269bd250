from __future__ import annotations

import pytest

from relay.common.labels import Labels, make
from relay.rules.selector import Matcher, Selector, SelectorError, parse_selector

UTIL = make([("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "0"), ("pod", "trainer-0")])
IDLE = make([("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("gpu", "1")])


@pytest.mark.parametrize(("text", "matchers"), [
    ('{__name__=~"DCGM_FI_DEV_.*",pod!=""}',
     (Matcher("__name__", "=~", "DCGM_FI_DEV_.*"), Matcher("pod", "!=", ""))),
    ('metric{a="b"}', (Matcher("__name__", "=", "metric"), Matcher("a", "=", "b"))),
    ("metric", (Matcher("__name__", "=", "metric"),)),
    ("ns:rule:sum", (Matcher("__name__", "=", "ns:rule:sum"),)),
    ("{}", ()),
    ('  m { a = "b" , c !~ "d" , }  ', (Matcher("__name__", "=", "m"), Matcher("a", "=", "b"),
                                        Matcher("c", "!~", "d"))),
    ("{a='single'}", (Matcher("a", "=", "single"),)),
    ("{a=`raw\\n`}", (Matcher("a", "=", "raw\\n"),)),
    ('{a="q\\"\\n\\x41\\u00e9"}', (Matcher("a", "=", 'q"\nA\u00e9'),)),
    ('{"quoted.name"="v"}', (Matcher("quoted.name", "=", "v"),)),
])
def test_parse_selector_table(text: str, matchers: tuple[Matcher, ...]) -> None:
    assert parse_selector(text) == Selector(matchers)


@pytest.mark.parametrize(("text", "position", "message"), [
    ("", 0, "empty selector"),
    ('m{a="b"', 7, "expected ',' or '}'"),
    ('m{a~"b"}', 3, "expected one of"),
    ('{a=~"("}', 4, "invalid regex"),
    ('m{__name__="x"}', 2, "metric name given twice"),
    ('{a="b"} x', 8, "unexpected text"),
    ('{a="b}', 3, "unterminated string"),
    ("{a=b}", 3, "expected a quoted string"),
    ('{a="\\q"}', 4, "unknown escape"),
    ('{1a="b"}', 1, "expected a name"),
    ("{", 1, "expected '}'"),
])
def test_parse_selector_errors_carry_position(text: str, position: int, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert info.value.position == position
    assert message in info.value.message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("text", "labels", "hit"), [
    ('{__name__=~"DCGM_FI_DEV_.*",pod!=""}', UTIL, True),
    ('{__name__=~"DCGM_FI_DEV_.*",pod!=""}', IDLE, False),  # missing label is ""
    ('{pod=""}', IDLE, True),
    ('{__name__=~"DCGM_FI_DEV"}', UTIL, False),  # anchored: no partial match
    ('{__name__=~"GPU_UTIL"}', UTIL, False),
    ('{pod=~"trainer-\\\\d+"}', UTIL, True),
    ('{pod!~"trainer-.*"}', UTIL, False),
    ('{pod!~"trainer-.*"}', IDLE, True),
    ('{gpu=~"0|1"}', IDLE, True),
    ('{a=~".+"}', make([("a", "x\ny")]), True),  # (?s): dot matches newline
    ("DCGM_FI_DEV_GPU_UTIL", UTIL, True),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="2"}', UTIL, False),
    ("{}", UTIL, True),
])
def test_selector_matches_table(text: str, labels: Labels, hit: bool) -> None:
    assert parse_selector(text).matches(labels) is hit


def test_matcher_rejects_unknown_operator_and_bad_regex() -> None:
    with pytest.raises(ValueError, match="unknown operator"):
        Matcher("a", "==", "b")
    with pytest.raises(ValueError, match="invalid regex"):
        Matcher("a", "=~", "[")


def test_selector_str_round_trips() -> None:
    text = '{__name__=~"DCGM_FI_DEV_.*",pod!="",a="x\\"y"}'
    assert str(parse_selector(text)) == text
    assert parse_selector(str(parse_selector(text))) == parse_selector(text)
