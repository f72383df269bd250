"""destinations[].queue.on_auth_error (issue 20 point 5): hold (the default) or drop, anything else an
error naming file, line and field; the sender gets what the file says."""

from __future__ import annotations

import pytest

from relay.config.config import ConfigError, parse_config
from relay.control.destinations import sender_settings

D = "destinations:\n  - name: a\n    url: http://127.0.0.1:9/w\n"


@pytest.mark.parametrize(("text", "want"), [
    (D, "hold"),
    (D + "    queue:\n      on_auth_error: hold\n", "hold"),
    (D + "    queue:\n      on_auth_error: drop\n", "drop"),
])
def test_on_auth_error_defaults_to_hold_and_reaches_the_sender(text: str, want: str) -> None:
    d = parse_config(text).destinations[0]
    assert d.queue.on_auth_error == want
    assert sender_settings(d).on_auth_error == want


@pytest.mark.parametrize("value", ["retry", "HOLD", "1"])
def test_any_other_on_auth_error_is_an_error_naming_file_line_and_field(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(D + f"    queue:\n      on_auth_error: {value}\n")
    assert str(info.value) == (f'relay.yaml:5: destinations[0].queue.on_auth_error: must be "hold" or "drop", '
                               f'not "{value}"')
