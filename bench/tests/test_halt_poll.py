"""bench/device/halt_poll.py: the setting is written for the command and written back after it,
also when the command fails (files of the test's own stand in for the module's sysfs files)."""

import sys

import pytest

from bench.device import halt_poll


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    param, driver = tmp_path / "guest_halt_poll_ns", tmp_path / "current_driver"
    param.write_text("0\n")
    driver.write_text("haltpoll\n")
    monkeypatch.setattr(halt_poll, "PARAM", str(param))
    monkeypatch.setattr(halt_poll, "DRIVER", str(driver))
    return param


def test_the_command_runs_with_the_value_and_the_old_one_comes_back(sysfs, tmp_path):
    seen = tmp_path / "seen"
    code = halt_poll.main(["200000", "--", sys.executable, "-c",
                           f"open({str(seen)!r}, 'w').write(open({str(sysfs)!r}).read())"])
    assert code == 0
    assert seen.read_text() == "200000"
    assert sysfs.read_text().strip() == "0"


def test_a_failing_command_gives_its_status_and_the_value_back(sysfs):
    assert halt_poll.main(["50000", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    assert sysfs.read_text().strip() == "0"


def test_without_the_driver_it_says_so_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(halt_poll, "PARAM", str(tmp_path / "absent"))
    monkeypatch.setattr(halt_poll, "DRIVER", str(tmp_path / "absent-too"))
    assert halt_poll.main(["200000", "--", "false"]) == 2
    assert "no guest halt polling" in capsys.readouterr().err


def test_no_command_is_an_error(sysfs):
    with pytest.raises(SystemExit):
        halt_poll.main(["200000"])
    assert sysfs.read_text().strip() == "0"
