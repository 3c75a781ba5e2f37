"""What ``run-local`` shows while a pipeline runs, and where the rest goes.

kfp.local prints every task's executor input and output JSON and every line the task process
writes: over a thousand lines for one training run, with the epoch lines and the summary lost in
them. ``TaskConsole`` keeps the console to

* one line when a task starts and one when it ends (name, duration, cache hit, status);
* the progress lines the task processes print (``cifar10_kfp.progress.is_progress_line``: the
  epoch table, download and decoding meters), indented under their task;

and writes everything, kfp.local's own logging included, to ``<run>/logs/<task>.log`` (one file
per task; what happens outside a task goes to ``<run>/logs/kfp-local.log``). The hooks into
kfp.local are in ``kfp_compat.task_output_routed``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

RUN_LOG = "kfp-local.log"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # kfp.local colours task names and statuses
_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)):\s*(.+)$")


class TaskConsole:
    """Routes kfp.local's output: short task lines and progress to ``console``, the rest to log files."""

    def __init__(self, log_dir: str | Path, console: TextIO | None = None):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.console = console or sys.stdout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._taken: set[str] = set()
        self.task_logs: dict[str, Path] = {}  # task name -> its (latest) log file
        self.failed: list[str] = []  # failed task names, in order
        self._run_log = (self.log_dir / RUN_LOG).open("a", encoding="utf-8")

    # ------------------------------------------------------------------ console
    def say(self, text: str) -> None:
        with self._lock:  # not print(): kfp.local swaps builtins.print for an indenting one inside tasks
            self.console.write(text + "\n")
            self.console.flush()

    @contextlib.contextmanager
    def task(self, name: str) -> Iterator[dict]:
        """Around one task: its log file is this thread's, and it gets a start and an end line.

        The caller sets ``outcome["status"]`` ("SUCCESS" or "FAILURE"); an exception counts as FAILURE.
        """
        path = self._log_path(name)
        outcome = {"status": "FAILURE", "ran": False}
        started = time.monotonic()
        with path.open("a", encoding="utf-8") as log_file:
            self._local.log_file, self._local.outcome = log_file, outcome
            try:
                yield outcome
            finally:
                self._local.log_file = self._local.outcome = None
        seconds = time.monotonic() - started
        if outcome["status"] == "SUCCESS":
            how = "done" if outcome["ran"] else "cache hit, skipped"
            self.say(f"[{name}] {how} in {seconds:.1f} s")
        else:
            self.failed.append(name)
            self.say(f"[{name}] FAILED after {seconds:.1f} s (log: {path})")

    def task_started(self) -> None:
        """The current task really runs (kfp.local did not take it from its cache)."""
        outcome = getattr(self._local, "outcome", None)
        if outcome is not None:
            outcome["ran"] = True
            name = Path(self._local.log_file.name).stem
            self.say(f"[{name}] started")

    def task_line(self, line: str) -> None:
        """One line the task process printed: always to its log, and to the console when it shows progress."""
        from cifar10_kfp.progress import is_progress_line

        self._write(line if line.endswith("\n") else line + "\n")
        if is_progress_line(line):
            self.say("    " + line.rstrip("\n").lstrip("\r"))

    # ------------------------------------------------------------------ logs
    def _log_path(self, name: str) -> Path:
        with self._lock:
            stem, n = name, 1
            while stem in self._taken:  # ParallelFor iterations share a task name
                n += 1
                stem = f"{name}-{n}"
            self._taken.add(stem)
            path = self.log_dir / f"{stem}.log"
            self.task_logs[name] = path
            return path

    def _write(self, text: str) -> None:
        target = getattr(self._local, "log_file", None) or self._run_log
        with self._lock:
            target.write(text)
            target.flush()

    def logging_handler(self) -> logging.Handler:
        """A handler that writes log records to the current task's log (or the run log)."""
        console = self

        class _Routed(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    console._write(_ANSI.sub("", self.format(record)) + "\n")
                except Exception:  # a log line must never fail a run
                    self.handleError(record)

        handler = _Routed(logging.INFO)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        return handler

    def close(self) -> None:
        self._run_log.close()


def last_exception(log_path: str | Path) -> str:
    """The last ``SomeError: message`` line of a log (the end of a Python traceback), or ""."""
    try:
        lines = Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        match = _EXCEPTION_LINE.match(line)
        if match:
            return f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    return ""


@contextlib.contextmanager
def quiet_output(log_dir: str | Path, console: TextIO | None = None) -> Iterator[TaskConsole]:
    """Route kfp.local's output through a ``TaskConsole`` for the duration (see the module docstring)."""
    from cifar10_kfp_pipelines.kfp_compat import task_output_routed

    task_console = TaskConsole(log_dir, console)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = [task_console.logging_handler()]
    root.setLevel(min(saved_level or logging.INFO, logging.INFO))
    try:
        with task_output_routed(task_console):
            yield task_console
    finally:
        root.handlers, root.level = saved_handlers, saved_level
        task_console.close()
