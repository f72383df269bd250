"""NVLink presence and link state through NVML, which gate the NVLink throughput fields.

The fields: ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` and ``DCGM_FI_PROF_NVLINK_TX_BYTES`` / ``RX_BYTES``
(``exporter.nvml.fields.NVLINK_FIELDS``). A GPU without NVLink, or whose links are all down, serves none of them:
absent, never 0 (GPM answers 0 for NVLink on a PCIe H200, see ``exporter/data/h200.json``).

Which links exist is read once, at probe time (:func:`present_links`): ``nvmlDeviceGetNvLinkState``
for each link index below ``NVML_NVLINK_MAX_LINKS``. NOT_SUPPORTED means the device has no NVLink
(nvml.h: "the device doesn't support this feature"; the recorded H200 answers it for link 0), so the
walk stops; INVALID_ARGUMENT means that link index does not exist on this board (an H100/H200 SXM
has 18 links of the 36 the constant allows); any other error skips the link, except the errors
after which the GPU no longer answers (``DOWN_ERRORS``), which propagate.

Whether any present link is active is re-read on every pass (:func:`any_active`), stopping at the
first active link (one call on a healthy board), so links that come up after the exporter started
(a fabric manager starting late) get their series without a restart, and a board whose links all
went down loses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from exporter.nvml.devices import DOWN_ERRORS, error_name

MAX_LINKS_FALLBACK = 18  # NVML_NVLINK_MAX_LINKS in nvml.h before Blackwell (36 since)
_FEATURE_ENABLED = 1  # nvmlEnableState_t NVML_FEATURE_ENABLED: the link is active


def present_links(nvml: Any, handle: Any) -> tuple[int, ...]:
    """The link indices NVML reports a state for (active or not); () for a GPU without NVLink."""
    error: type[BaseException] = nvml.NVMLError
    links: list[int] = []
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS_FALLBACK))):
        try:
            nvml.nvmlDeviceGetNvLinkState(handle, link)
        except error as exc:
            name = error_name(nvml, exc)
            if name in DOWN_ERRORS:
                raise
            if name == "NOT_SUPPORTED":
                break
            continue  # INVALID_ARGUMENT: no such link on this board; anything else: not this one
        links.append(link)
    return tuple(links)


def any_active(nvml: Any, handle: Any, links: Sequence[int]) -> bool:
    """Whether one of ``links`` is active now (DOWN_ERRORS propagate; other errors read as down)."""
    error: type[BaseException] = nvml.NVMLError
    for link in links:
        try:
            if int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == _FEATURE_ENABLED:
                return True
        except error as exc:
            if error_name(nvml, exc) in DOWN_ERRORS:
                raise
    return False


def links_up(nvml: Any, handle: Any, links: Sequence[int], failed: Callable[[BaseException], None]) -> bool:
    """:func:`any_active` for one pass: an error is handed to ``failed`` (which raises for a GPU that
    no longer answers) and reads as "no link up"."""
    try:
        return any_active(nvml, handle, links)
    except nvml.NVMLError as exc:
        failed(exc)
        return False
