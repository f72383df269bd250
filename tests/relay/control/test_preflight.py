from __future__ import annotations

import os
from pathlib import Path

import pytest

from relay.config.config import parse_config
from relay.control.preflight import MachineProbe, storage_problem

D = "destinations:\n  - name: a\n    url: http://127.0.0.1:9/w\n"


def listing(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))


def test_an_existing_writable_directory_passes_and_keeps_its_contents(tmp_path: Path) -> None:
    (tmp_path / "q").mkdir()
    assert storage_problem(tmp_path / "q") is None
    assert listing(tmp_path) == ["q"]


def test_a_directory_that_can_be_created_passes_and_is_not_created(tmp_path: Path) -> None:
    assert storage_problem(tmp_path / "a" / "b" / "c") is None
    assert listing(tmp_path) == []


def test_a_path_under_a_file_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    expected = f"cannot create {tmp_path / 'f' / 'queue'}: {tmp_path / 'f'} is not a directory"
    assert storage_problem(tmp_path / "f" / "queue") == expected
    assert storage_problem(tmp_path / "f") == f"{tmp_path / 'f'} exists and is not a directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in read-only directories")
def test_a_read_only_directory_is_reported(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    assert storage_problem(ro) == f"cannot write in {ro}: Permission denied"
    assert storage_problem(ro / "q") == f"cannot create {ro / 'q'}: {ro} is not writable (Permission denied)"


def test_a_read_only_file_system_is_reported() -> None:
    problem = storage_problem(Path("/proc/gpu-relay-queue"))
    assert problem is not None and problem.startswith("cannot create /proc/gpu-relay-queue: /proc is not writable")


def test_profile_found_or_named_as_missing() -> None:
    probe = MachineProbe(lambda: ["default", "prod"])
    assert probe.profile_problem("prod") is None
    assert 'profile "staging" is not defined in ' in (probe.profile_problem("staging") or "")


def test_profile_lookup_reads_the_aws_config_file_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("[default]\nregion = us-east-1\n[profile amp-writer]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    probe = MachineProbe()
    assert probe.profile_problem("amp-writer") is None
    assert probe.profile_problem("other") == f'profile "other" is not defined in {cfg} or {tmp_path / "none"}'


def test_a_broken_aws_config_is_a_problem_not_an_exception() -> None:
    def broken() -> list[str]:
        raise ValueError("bad ini")

    problem = MachineProbe(broken).profile_problem("p")
    assert problem == 'cannot read the AWS config files to look for profile "p": bad ini'


def test_probe_problems_become_warnings_with_the_line_of_the_key(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    text = (
        f"storage:\n  path: {tmp_path / 'f' / 'q'}\n" + D + "    sigv4:\n      region: us-east-1\n      profile: nope\n"
    )
    config = parse_config(text, probe=MachineProbe(lambda: ["default"]))
    assert [w.split(": ", 2)[:2] for w in config.warnings] == [
        ["relay.yaml:2", "storage.path"],
        ["relay.yaml:8", "destinations[0].sigv4.profile"],
    ]
    assert all(w.endswith("(on this machine)") for w in config.warnings)


def test_the_default_storage_path_is_checked_at_line_1() -> None:
    class NoStorage:
        def profile_problem(self, profile: str) -> str | None:
            return None

        def storage_problem(self, path: Path) -> str | None:
            return f"cannot create {path}"

    config = parse_config(D, probe=NoStorage())
    assert config.warnings == ("relay.yaml:1: storage.path: cannot create /var/lib/gpu-relay (on this machine)",)


def test_without_a_probe_nothing_about_the_machine_is_checked(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert parse_config(f"storage: {{path: {tmp_path / 'f'}}}\n" + D).warnings == ()
