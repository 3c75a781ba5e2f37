"""Progress meters: fixed-column lines, a line per interval off a terminal, recognised by run-local."""

from __future__ import annotations

import io

import pytest

from cifar10_kfp.progress import INTERVAL_ENV, ProgressMeter, interval_s, is_progress_line
from cifar10_kfp.train.outputs import ProgressPrinter


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_an_interval_of_zero_prints_a_line_per_update(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    out = io.StringIO()
    with ProgressMeter("download", 3 * 1024 * 1024, stream=out) as meter:
        for _ in range(3):
            meter.update(1024 * 1024)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and "\r" not in out.getvalue()  # three updates and the final line
    assert "3.0 MiB /     3.0 MiB  100.0%" in lines[-1] and "eta" in lines[-1]
    assert all(is_progress_line(line) for line in lines)


def test_off_a_terminal_a_long_interval_prints_only_the_final_line(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "3600")
    out = io.StringIO()
    with ProgressMeter("decode", 60_000, unit="img", stream=out) as meter:
        for _ in range(60):
            meter.update(1000)
    assert out.getvalue().count("\n") == 1 and "60000 img /   60000 img" in out.getvalue()


def test_on_a_terminal_the_line_is_rewritten_in_place():
    out = _Tty()
    meter = ProgressMeter("download", None, stream=out)
    meter.interval = 0  # a terminal refreshes at most every TTY_INTERVAL_S; no waiting in a test
    meter.update(10)
    meter.close()
    assert out.getvalue().startswith("\rdownload") and out.getvalue().count("\n") == 1
    assert "?" in out.getvalue()  # unknown total: no percentage, no ETA


@pytest.mark.parametrize("raw", ["soon", "-1"])
def test_a_bad_interval_is_an_error_naming_it(raw):
    with pytest.raises(ValueError, match=INTERVAL_ENV):
        interval_s({INTERVAL_ENV: raw})


def test_the_epoch_table_is_a_progress_line_and_log_lines_are_not():
    printer = ProgressPrinter(True, 12, stream=io.StringIO())
    row = {"epoch": 3, "train_loss": 1.2345, "train_acc": 0.5, "val_acc": 0.6, "lr": 0.1,
           "images_per_s": 900.0, "elapsed_s": 12.0}  # fmt: skip
    assert is_progress_line(printer.HEADER) and is_progress_line(printer.line(row, 30.0) + "\n")
    assert not is_progress_line(
        "2026-12-03 20:00:00,000 INFO cifar10_kfp.train.engine: training on 1 process(es)"
    )
    assert not is_progress_line('    "epochs": 12,')
