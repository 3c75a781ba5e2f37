"""Progress of long work (downloads, decoding), in the fixed-column style of the epoch lines.

On a terminal a ``ProgressMeter`` rewrites one line in place; anywhere else (KFP pod logs,
kfp.local's pipe, a file) it prints a whole line every ``CIFAR10_KFP_PROGRESS_INTERVAL_S``
seconds (default 5) and one when the work ends, so a log shows progress without carriage
returns. A line reads::

    download    54.0 MiB /  162.6 MiB   33.2%    12.1 MiB/s   elapsed     4.5s   eta     9.0s

``is_progress_line`` recognises these lines and the epoch table of ``ProgressPrinter``:
``run-local`` shows exactly those lines of a task's output on its console.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping

from cifar10_kfp.env_settings import env_number

INTERVAL_ENV = "CIFAR10_KFP_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 5.0
TTY_INTERVAL_S = 0.2

_METER_LINE = re.compile(r"^\S+ +[\d.]+ \S+ +/ +[\d.?]+ .*%\s+[\d.]+ \S+/s\s+elapsed\s+\S+\s+eta\s+\S+\s*$")
_EPOCH_HEADER = re.compile(r"^\s*epoch\s+train_loss\s+train_acc\b")
_EPOCH_ROW = re.compile(r"^\s*\d+/\d+\s+-?(\d+\.\d{4}|nan|inf)\s+[\d.]+%\s+[\d.]+%")


def is_progress_line(line: str) -> bool:
    """Whether ``line`` is a progress line: a meter line or a row (or the header) of the epoch table."""
    text = line.rstrip("\r\n").lstrip("\r")
    return bool(_METER_LINE.match(text) or _EPOCH_HEADER.match(text) or _EPOCH_ROW.match(text))


def interval_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds between two progress lines off a terminal (``CIFAR10_KFP_PROGRESS_INTERVAL_S``)."""
    return env_number(INTERVAL_ENV, DEFAULT_INTERVAL_S, allow_zero=True, env=env)


def _bytes(n: float) -> tuple[str, str]:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return (f"{n:.0f}" if unit == "B" else f"{n:.1f}"), unit
        n /= 1024
    raise AssertionError("unreachable")


def _count(n: float, unit: str) -> tuple[str, str]:
    return f"{n:.0f}", unit


def _seconds(s: float | None) -> str:
    return "?" if s is None else f"{s:.1f}s"


class ProgressMeter:
    """Progress of ``total`` units of work (bytes with ``unit="B"``, else counted items).

    Use as a context manager, or call ``close()``; ``update(n)`` adds ``n`` done units.
    """

    def __init__(
        self, label: str, total: int | None, unit: str = "B", stream=None, interval: float | None = None
    ):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = TTY_INTERVAL_S if self.tty else (interval_s() if interval is None else interval)
        self.done = 0
        self.started = self.last_shown = time.monotonic()
        self.closed = False

    def __enter__(self) -> ProgressMeter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def line(self, now: float | None = None) -> str:
        """The current progress line (no newline)."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        fmt = _bytes if self.unit == "B" else (lambda n: _count(n, self.unit))
        done, done_unit = fmt(self.done)
        total, total_unit = fmt(self.total) if self.total else ("?", "")
        rate = self.done / elapsed if elapsed > 0 else 0.0
        rate_text, rate_unit = fmt(rate)
        percent = f"{100 * self.done / self.total:.1f}" if self.total else "?"
        eta = (self.total - self.done) / rate if self.total and rate > 0 else None
        return (
            f"{self.label:<10} {done:>7} {done_unit:<3} / {total:>7} {total_unit:<3} {percent:>6}% "
            f"{rate_text:>8} {rate_unit}/s   elapsed {_seconds(elapsed):>8}   eta {_seconds(eta):>8}"
        )

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last_shown >= self.interval:
            self.last_shown = now
            self._show(self.line(now), final=False)

    def close(self) -> None:
        """Show the final line (once)."""
        if not self.closed:
            self.closed = True
            self._show(self.line(), final=True)

    def _show(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
