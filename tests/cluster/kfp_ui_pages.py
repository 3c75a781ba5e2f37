"""What a person does in the real KFP 2.17.0 UI, as Playwright steps over Debian's Chromium.

Every step finds things by what the page shows: button and link names, field labels, node titles in the
DAG (the title attribute is the step's display name), visible text. The labels are upstream's
(frontend/src/pages/NewPipelineVersion.tsx, NewRunV2.tsx, components/Trigger.tsx,
components/NewRunParametersV2.tsx, components/graph/ExecutionNode.tsx and SubDagNode.tsx,
components/tabs/RuntimeNodeDetailsV2.tsx, pages/CompareV2.tsx). A step's state in the DAG is the icon
ExecutionNode.tsx draws for it: MUI's CheckCircleIcon (green) for COMPLETE, CloudDownloadIcon (green) for CACHED, ErrorIcon (red) for FAILED.

`Browser` also collects every error the page reports (uncaught exceptions and console errors) so that
a test can fail on them; `screenshot` saves each page under the test's output folder.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import time
import urllib.parse

from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.cluster.helpers import wait_until
from tests.support.browser import CHROMIUM  # Debian's chromium (the report's CDP test uses it too)

#: Console errors upstream's UI always logs on a cluster that is not GKE: with DISABLE_GKE_METADATA (its
#: default) the server answers /system/cluster-name and /system/project-id 500 "GKE metadata endpoints are
#: disabled" (frontend/server/app.ts), and the side nav logs the answer. Nothing of ours; nothing a person sees.
#: And the JSON viewer (react-ace, components/Editor.tsx) asks for ace's syntax worker, worker-json.js,
#: which the 2.17.0 bundle does not contain (vite build emits no worker; client/ has none): the viewer shows
#: the JSON without it.
UPSTREAM_CONSOLE_NOISE = (
    re.compile(r"GKE metadata endpoints are disabled"),
    re.compile(r"Failed to load resource: the server responded with a status of 500"),
    re.compile(r"The script at '[^']*/worker-json\.js' failed to load"),
)
#: Green: COMPLETE draws CheckCircleIcon, CACHED (outputs taken from KFP's cache) CloudDownloadIcon.
DONE_ICONS, FAILED_ICON = ("CheckCircleIcon", "CloudDownloadIcon"), "ErrorIcon"


def _shorten(text: str, keep: int = 400) -> str:
    return text if len(text) <= 2 * keep else f"{text[:keep]} ... {text[-keep:]}"


class Browser:
    """One headless Chromium page on the UI at `url`; screenshots go to `shots`."""

    def __init__(self, url: str, shots: pathlib.Path):
        self.url, self.shots = url, shots
        self.errors: list[str] = []
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Browser:
        from playwright.sync_api import sync_playwright

        pw = self._stack.enter_context(sync_playwright())
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        self._stack.callback(browser.close)
        self.page = browser.new_page(viewport={"width": 1600, "height": 1100})
        self.page.set_default_timeout(30_000)
        self.page.on("pageerror", self._page_error)
        self.page.on("console", self._console)
        self.shots.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:  # what the page showed when the scenario failed
            with contextlib.suppress(Exception):
                self.screenshot(f"failed-{time.strftime('%H%M%S')}")
        self._stack.close()

    def _page_error(self, exc) -> None:
        if not any(p.search(str(exc)) for p in UPSTREAM_CONSOLE_NOISE):
            self.errors.append(f"page error: {_shorten(str(exc))}")

    def _console(self, message) -> None:
        if message.type == "error" and not any(p.search(message.text) for p in UPSTREAM_CONSOLE_NOISE):
            self.errors.append(f"console error: {_shorten(urllib.parse.unquote(message.text))}")

    def screenshot(self, name: str, full_page: bool = False) -> pathlib.Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    def open(self, fragment: str) -> None:
        """Go to a page of the UI; on the page already, reload it (a same-URL goto changes nothing in the app)."""
        target = f"{self.url}/#{fragment}"
        if self.page.url == target:
            self.page.reload()
        else:
            self.page.goto(target)

    # -- pipelines -------------------------------------------------------------------------
    def upload_pipeline(self, package: pathlib.Path, name: str) -> None:
        page = self.page
        self.open("/pipelines")
        page.get_by_role("button", name="Upload pipeline").click()
        page.get_by_label("Upload a file").check()
        with page.expect_file_chooser() as chooser:
            page.get_by_role("button", name="Choose file", exact=True).click()
        chooser.value.set_files(str(package))
        page.get_by_label("Pipeline Name").fill(name)
        page.get_by_role("button", name="Create").click()
        page.get_by_title("run-summary", exact=True).wait_for()

    def open_run_form(self, pipeline: str) -> None:
        page = self.page
        self.open("/pipelines")
        # The link's accessible name is its tooltip ("Name: <name>", pages/PipelineList.tsx); a person reads its text.
        page.get_by_role("link").filter(has_text=re.compile(f"^{re.escape(pipeline)}$")).click()
        page.get_by_title("run-summary", exact=True).wait_for()  # the version has loaded
        page.get_by_role("button", name="Create run").click()
        page.get_by_text("Specify parameters required by the pipeline").wait_for()

    def parameter_labels(self) -> list[str]:
        """The run form's parameter fields, as their labels read ("epochs - integer")."""
        labels = self.page.locator("label").all_inner_texts()
        return [
            t.strip()
            for t in labels
            if re.fullmatch(r"\w+ - (string|integer|double|boolean|list|dict)", t.strip())
        ]

    def fill_run_form(self, run_name: str, params: dict[str, str], experiment: str = "Default") -> None:
        page = self.page
        page.get_by_role("button", name="Choose").nth(2).click()  # Pipeline, Pipeline Version, Experiment
        page.get_by_role("dialog").get_by_text(experiment, exact=True).click()
        page.get_by_role("button", name="Use this experiment").click()
        # After the experiment: choosing one names the run afresh ("Run of <pipeline> (<hash>)").
        page.get_by_label("Run name").first.fill(run_name)
        for key, value in params.items():
            field = page.locator(f"label:text-matches('^{key} - ')").first
            page.get_by_label(field.inner_text().strip(), exact=True).fill(value)

    def make_recurring(self, name: str, every_minutes: int = 1, max_concurrent: int = 1) -> None:
        """Run Type: Recurring, a periodic trigger; the name field becomes "Recurring run config name"."""
        page = self.page
        page.get_by_role("radio", name="Recurring", exact=True).check()
        page.get_by_label("Recurring run config name").fill(name)
        page.get_by_label("Maximum concurrent runs").fill(str(max_concurrent))
        page.get_by_label("Catchup").uncheck()
        row = page.locator("span", has_text="Run every").last
        row.locator("input[type=number]").fill(str(every_minutes))
        row.get_by_role("combobox").click()
        page.get_by_role("option", name="Minutes").click()

    def start(self) -> str:
        """Press Start; the run's (or recurring run's) page, and its id from the URL."""
        page = self.page
        page.get_by_role("button", name="Start").click()
        page.wait_for_url(re.compile(r"#/(runs|recurringrun|experiments)/details/"))
        return page.url.rsplit("/", 1)[-1]

    # -- a run's page ----------------------------------------------------------------------
    def open_run(self, run_id: str) -> None:
        self.open(f"/runs/details/{run_id}")
        self.page.get_by_title("run-summary", exact=True).wait_for()

    def run_status(self, run_id: str) -> str:
        """What the status icon beside the run's name says when a person hovers it (pages/StatusV2.tsx)."""
        self.open_run(run_id)
        status = "Unknown status"
        for _ in range(20):  # the icon says "Unknown status" until the run's record has loaded
            self.page.mouse.move(0, 0)
            icon = self.page.get_by_test_id("node-status-sign")
            if not icon.count():
                # Running and Canceling draw upstream's RunningIcon, which drops the data-testid; the
                # other states' icons keep it. Hover it through its tooltip's wrapper next to the name.
                self.page.wait_for_timeout(500)
                continue
            icon.first.hover()
            status = self.page.get_by_role("tooltip").first.inner_text().splitlines()[0]
            if status != "Unknown status":
                return status
            self.page.wait_for_timeout(500)
        return "Running" if status == "Unknown status" and not icon.count() else status

    def expand(self, group: str) -> None:
        """Open a group of the DAG (a sub-DAG node) with its expand button, as a person double-checks."""
        node = self.page.get_by_role("button", name=group, exact=True)
        for _ in range(3):  # React Flow animates a new layer into view; a click mid-animation can miss
            self.page.get_by_role("button", name="Fit View").click()  # the canvas's own control
            self.page.wait_for_timeout(500)
            node.get_by_test_id("expand-button").click()
            try:
                node.wait_for(state="detached", timeout=10_000)  # the layer inside replaces this one
                return
            except PlaywrightTimeout:
                continue
        raise AssertionError(f"the DAG's group {group!r} did not open")

    def open_steps(self, run_id: str, groups: tuple[str, ...]) -> None:
        self.open_run(run_id)
        for group in groups:
            self.expand(group)

    def step_icons(self, steps: list[str]) -> dict[str, list[str]]:
        """The icons drawn on each step node of the open layer (one of DONE_ICONS when it is green)."""
        icons = {}
        for step in steps:
            node = self.page.locator(f"div.container[title='{step}']")
            icons[step] = [s.get_attribute("data-testid") or "" for s in node.locator("svg").all()]
        return icons

    def open_node(self, title: str, tab: str, index: int = 0) -> None:
        """Click a node of the DAG (the index-th of that title) and a tab of its side panel.

        The panel already open is closed first, so the tab clicked is the new node's.
        """
        close = self.page.get_by_role("button", name="close", exact=True)
        if close.count():
            close.first.click()
        self.page.get_by_title(title, exact=True).nth(index).click()
        self.page.get_by_role("button", name=tab, exact=True).click()

    def side_panel_text(self) -> str:
        return self.page.locator("body").inner_text()

    def wait_for_text(self, text: str | re.Pattern, timeout_s: float) -> None:
        """Wait until the page shows the text, and scroll it into view (the log viewer starts at its end)."""
        found = self.page.get_by_text(text).first
        found.wait_for(timeout=timeout_s * 1000)
        found.scroll_into_view_if_needed()

    def poll(self, what: str, check, timeout_s: float, interval_s: float = 10.0):
        """Reload-and-look until check() returns something truthy, as a person refreshes a page.

        A page that does not finish loading within its wait (the API server slow under a loaded
        machine: CI once waited 30 s for a run's summary) is looked at again at the next refresh,
        as a person would; only the whole `timeout_s` decides, and its failure names the last miss.
        """

        misses: list[str] = []

        def look():
            try:
                return check()
            except PlaywrightTimeout as slow:
                misses.append(str(slow).splitlines()[0])
                return None

        try:
            return wait_until(f"{what} (in the UI)", look, timeout_s=timeout_s, interval_s=interval_s)
        except AssertionError as late:
            raise AssertionError(
                f"{late}; pages that did not load: {len(misses)}, last: {misses[-1:]}"
            ) from None
