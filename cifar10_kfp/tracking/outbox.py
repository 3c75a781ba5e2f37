"""A background sender: the network calls of a tracking sink, run in order on one daemon thread.

Training never waits on a tracking server: a sink only puts a call in the outbox, and the outbox's
thread makes it. The first call that fails is logged as one warning line; after that the outbox
either drops everything (``stop_on_error``: a server that is down would otherwise cost a timeout per
call) or keeps sending quietly (a status server whose next update may well get through). ``close``
waits a bounded time for what is queued, so a hanging server delays the end of a run by at most that.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Job = Callable[[], None]
_STOP = object()


def one_line(exc: BaseException, secrets: tuple[str, ...] = (), limit: int = 300) -> str:
    """``exc`` as one short line for a log, with every non-empty string of ``secrets`` masked."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Outbox:
    """Runs submitted calls in order on one daemon thread; warns once when one fails.

    Args:
        what: What is being sent to where, for the warning ("MLflow tracking at http://...").
        stop_on_error: Drop every later call once one has failed.
        secrets: Strings that must never reach the log (tokens, passwords), masked in the warning.
    """

    def __init__(self, what: str, *, stop_on_error: bool, secrets: tuple[str, ...] = ()):
        self.what = what
        self.stop_on_error = stop_on_error
        self.secrets = secrets
        self.failed = False  # a call has failed (and that has been said)
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"cifar10-kfp-outbox-{what[:24]}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job`` (dropped when the outbox is closed, or stopped after an error)."""
        if not self._closed and not (self.failed and self.stop_on_error):
            self._queue.put(job)

    def close(self, timeout_s: float) -> bool:
        """Send what is queued, waiting at most ``timeout_s``; True when everything was sent or dropped."""
        if self._closed:
            return not self._thread.is_alive()
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._warn(f"it did not answer within {timeout_s:g} s at the end of the run")
            return False
        return True

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            if self.failed and self.stop_on_error:
                continue
            try:
                job()
            except Exception as exc:  # a tracking failure of any kind must not end training
                self._warn(one_line(exc, self.secrets))

    def _warn(self, why: str) -> None:
        if self.failed:
            return
        self.failed = True
        then = "no more updates are sent" if self.stop_on_error else "later updates are still tried"
        log.warning("%s failed (%s); training goes on, %s", self.what, why, then)
