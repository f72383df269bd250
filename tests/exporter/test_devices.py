"""``-d/--devices`` (dcgm-exporter 4.8.2 pkg/cmd/app.go parseDeviceOptions): parsing, the ids that
must exist, and the filtering wrapper around a backend."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pytest

from exporter.backend import DeviceInfo, Entity, MigInstance, Value
from exporter.devices import (
    ALL,
    DeviceSelection,
    DeviceSelectionError,
    FilteredBackend,
    apply,
    check,
    instance_numbers,
    parse_devices,
    select,
)


def gpu(index: int, *gis: int) -> DeviceInfo:
    mig = tuple(MigInstance(g, "3g.40gb", f"MIG-{index}-{g}") for g in gis)
    return DeviceInfo(index=index, uuid=f"GPU-{index}", pci_bus_id=f"0000:{index:02x}:00.0", name="A100",
                      minor=index, mig=mig)


# GPU 0 whole, GPU 1 with GPU instances 1 and 2, GPU 2 with GPU instance 0, GPU 3 whole.
NODE = [gpu(0), gpu(1, 2, 1), gpu(2, 0), gpu(3)]


@dataclass
class Backend:
    devs: list[DeviceInfo] = field(default_factory=lambda: list(NODE))
    xids: list[tuple[int, ...]] = field(default_factory=list)
    closed: bool = False

    def driver_version(self) -> str:
        return "550.54.15"

    def devices(self) -> list[DeviceInfo]:
        return list(self.devs)

    def supported_fields(self, gpu: int, fields: Iterable[str]) -> set[str]:
        return set(fields)

    def read(self, gpu: int, fields: frozenset[str]) -> Mapping[Entity, Mapping[str, Value]]:
        d = self.devs[gpu]
        if not d.mig:
            return {Entity(gpu): {"DCGM_FI_DEV_GPU_UTIL": gpu}}
        return {Entity(gpu, m.gpu_instance_id): {"DCGM_FI_DEV_FB_USED": m.gpu_instance_id} for m in d.mig}

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        return list(self.xids)  # type: ignore[arg-type]  # (gpu, xid, GPU instance id) events too

    def close(self) -> None:
        self.closed = True

    def extra_method(self) -> str:
        return "passed through"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("f", ALL),
        ("g", DeviceSelection("g")),
        ("i", DeviceSelection("i")),
        ("g:0,1", DeviceSelection("g", frozenset({0, 1}))),
        ("i:0,2-4", DeviceSelection("i", frozenset({0, 2, 3, 4}))),
        ("g:3", DeviceSelection("g", frozenset({3}))),
        ("g:1-1", DeviceSelection("g", frozenset({1}))),
    ],
)
def test_parse_devices_accepts_dcgm_syntax(text: str, expected: DeviceSelection) -> None:
    assert parse_devices(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("f:0", "no range can be specified with the flex option"),
        ("g:0:1", "only be one specified range"),
        ("x", "expected f, g[:ids] or i[:ids]"),
        ("", "expected f, g[:ids] or i[:ids]"),
        ("g:a", "'a' is not a non-negative integer"),
        ("g:", "'' is not a non-negative integer"),
        ("g:1-2-3", "<number>-<number>"),
        ("g:3-1", "ends before it starts"),
        ("i:-1", "is not a non-negative integer"),
    ],
)
def test_parse_devices_rejects_bad_values_naming_them(text: str, message: str) -> None:
    with pytest.raises(DeviceSelectionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_devices(text)


def test_gpu_instances_are_numbered_node_wide_in_gpu_then_instance_order() -> None:
    assert instance_numbers(NODE) == {(1, 1): 0, (1, 2): 1, (2, 0): 2}


def test_select_g_keeps_listed_gpus_whole_with_their_instances() -> None:
    got = select(NODE, parse_devices("g:1,3"))
    assert [d.index for d in got] == [1, 3]
    assert {m.gpu_instance_id for m in got[0].mig} == {1, 2}
    assert select(NODE, parse_devices("g")) == NODE


def test_select_i_keeps_only_gpu_instances_and_drops_gpus_without_mig() -> None:
    assert [(d.index, [m.gpu_instance_id for m in d.mig]) for d in select(NODE, parse_devices("i"))] == [
        (1, [2, 1]), (2, [0])
    ]
    assert [(d.index, [m.gpu_instance_id for m in d.mig]) for d in select(NODE, parse_devices("i:0,2"))] == [
        (1, [1]), (2, [0])
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("g:4", "no GPU 4 on this node (it has 0, 1, 2, 3)"),
        ("g:0,7-8", "no GPU 7, 8"),
        ("i:3", "no GPU instance 3 on this node (it has 0, 1, 2)"),
    ],
)
def test_ids_that_do_not_exist_are_errors(text: str, message: str) -> None:
    with pytest.raises(DeviceSelectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check(NODE, parse_devices(text), "-d")


def test_i_without_any_mig_gpu_is_an_error() -> None:
    with pytest.raises(DeviceSelectionError, match="no GPU is in MIG mode"):
        check([gpu(0), gpu(1)], parse_devices("i"))


def test_apply_f_returns_the_backend_itself() -> None:
    be = Backend()
    assert apply(be, ALL) is be


def test_filtered_backend_lists_reads_and_forwards_xids_of_selected_devices_only() -> None:
    be = Backend(xids=[(0, 79), (1, 48), (3, 13)])
    f = apply(be, parse_devices("i:1"))
    assert isinstance(f, FilteredBackend)
    assert [(d.index, [m.gpu_instance_id for m in d.mig]) for d in f.devices()] == [(1, [2])]
    assert f.read(1, frozenset()) == {Entity(1, 2): {"DCGM_FI_DEV_FB_USED": 2}}
    assert f.wait_xid(0.0) == [(1, 48)]
    assert f.driver_version() == "550.54.15"
    assert f.supported_fields(1, ["A"]) == {"A"}
    assert f.extra_method() == "passed through"
    f.close()
    assert be.closed


def test_filtered_backend_i_forwards_xids_of_selected_gpu_instances_only() -> None:
    be = Backend(xids=[(1, 48, 2), (1, 48, 1), (2, 79, 0), (1, 13)])
    f = apply(be, parse_devices("i:1"))  # GPU 1, GPU instance 2
    assert f.wait_xid(0.0) == [(1, 48, 2), (1, 13)]


def test_filtered_backend_g_passes_reads_through_and_drops_other_gpus_xids() -> None:
    be = Backend(xids=[(0, 79), (2, 48)])
    f = apply(be, parse_devices("g:0"))
    assert [d.index for d in f.devices()] == [0]
    assert f.read(0, frozenset()) == {Entity(0): {"DCGM_FI_DEV_GPU_UTIL": 0}}
    assert f.wait_xid(0.0) == [(0, 79)]


def test_apply_checks_ids_against_the_backend() -> None:
    with pytest.raises(DeviceSelectionError, match="no GPU 9"):
        apply(Backend(), parse_devices("g:9"))
