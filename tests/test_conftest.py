"""The suite's shared settings (tests/conftest.py): Hypothesis runs without a deadline, so a
property test that is slow on a loaded machine still passes, and a failure prints its blob."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st


def test_the_suite_profile_has_no_deadline_and_prints_the_blob() -> None:
    current = settings()  # what a test without its own settings runs under
    assert current.deadline is None
    assert current.print_blob is True


def test_a_settings_decorator_without_a_deadline_inherits_none() -> None:
    assert settings(max_examples=5).deadline is None


@settings(max_examples=3, database=None)
@given(st.integers())
def test_an_example_slower_than_hypothesis_default_deadline_passes(n: int) -> None:
    time.sleep(0.25)  # Hypothesis' default deadline is 200 ms: this fails under the default profile
    assert isinstance(n, int)
