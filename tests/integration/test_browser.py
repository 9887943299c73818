"""00_preflight.ipynb in a real JupyterLab, driven in Debian's chromium as an operator would.

JupyterLab runs from this interpreter on a loopback port, on a copy of the notebooks (the
stored outputs in the repository are never touched), with the rehearsal host's deployment in
``OPSBOOK_DEPLOYMENT``. Playwright drives the system chromium (``/usr/bin/chromium``, never a
downloaded browser): Run → Run All Cells, then the rendered page is checked and a screenshot
is saved to ``test-output/browser/00_preflight.png``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Locator, Page, Playwright, sync_playwright

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal.sandbox import Sandbox
from tests.integration.conftest import rehearsal_host, stat_fields

pytestmark = [pytest.mark.integration, pytest.mark.browser]

REPOSITORY = Path(__file__).resolve().parents[2]
NOTEBOOK = "00_preflight.ipynb"
SCREENSHOT = REPOSITORY / "test-output" / "browser" / "00_preflight.png"
CHROMIUM = Path("/usr/bin/chromium")
# The machine's network is closed: without these chromium keeps dialling Google's services.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# JupyterLab settings for a quiet, fully rendered page: no news toast asking for consent over
# the outputs, and every cell attached to the DOM (the default windowing skips offscreen ones).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
}
GPU_NAME = "RTX PRO 6000"
GPU_COUNT = 8
SERVER_START_SECONDS = 30
PAGE_LOAD_MS = 30_000
RUN_ALL_MS = 120_000
ERROR_OUTPUT = '.jp-RenderedText[data-mime-type="application/vnd.jupyter.stderr"]'


@dataclass(frozen=True)
class Lab:
    """A running JupyterLab server.

    Args:
        process: the ``jupyter lab`` process.
        port: its loopback port.
        token: the access token.
        log: the file its output goes to.
    """

    process: subprocess.Popen[bytes]
    port: int
    token: str
    log: Path

    def url(self, path: str) -> str:
        """The address of ``path`` on the server, with the token."""
        query = urllib.parse.urlencode({"token": self.token})
        return f"http://127.0.0.1:{self.port}/{path}?{query}"

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's output, for failure messages."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class ExecutedNotebook:
    """The notebook page after Run All Cells.

    Args:
        page: the Playwright page showing it.
        lab: the server behind it.
    """

    page: Page
    lab: Lab


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_lab_settings(folder: Path) -> Path:
    """Write ``LAB_SETTINGS`` as JupyterLab user settings under ``folder``.

    Returns:
        The settings folder, for ``--LabApp.user_settings_dir``.
    """
    for plugin, values in LAB_SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return folder


def lab_environment(deployment: Path, home: Path) -> dict[str, str]:
    """The server's environment: the deployment, and Jupyter folders of its own.

    Separate config, data and runtime folders keep the operator's own Jupyter set-up (a user
    kernel spec pointing at another Python, say) out of the test.
    """
    env = dict(os.environ)
    env["OPSBOOK_DEPLOYMENT"] = str(deployment)
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        env[name] = str(home / name.lower())
    return env


def start_lab(root: Path, deployment: Path, work: Path) -> Lab:
    """Start ``jupyter lab`` on a free loopback port, serving ``root``.

    Args:
        root: the folder with the notebooks.
        deployment: the deployment file the notebooks read from ``OPSBOOK_DEPLOYMENT``.
        work: a folder for the server's settings, workspaces and log.

    Returns:
        The running server (not yet answering; see :func:`wait_until_up`).
    """
    port = free_port()
    token = secrets.token_hex(24)
    log = work / "jupyter-lab.log"
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--allow-root",
        "--ip=127.0.0.1",
        f"--port={port}",
        "--port-retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={write_lab_settings(work / 'settings')}",
        f"--LabApp.workspaces_dir={work / 'workspaces'}",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            cwd=root,
            env=lab_environment(deployment, work / "jupyter"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Lab(process, port, token, log)


def wait_until_up(lab: Lab, seconds: float = SERVER_START_SECONDS) -> None:
    """Poll ``/api/status`` until the server answers.

    Raises:
        AssertionError: the server exited or did not answer in time (with its log).
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise AssertionError(
                f"jupyter lab exited ({lab.process.returncode}):\n{lab.log_tail()}"
            )
        try:
            with urllib.request.urlopen(lab.url("api/status"), timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise AssertionError(f"jupyter lab did not answer in {seconds} s:\n{lab.log_tail()}")


def stop_lab(lab: Lab) -> None:
    """Stop the server by its PID: terminate, then kill if it does not exit."""
    if lab.process.poll() is not None:
        return
    lab.process.terminate()
    try:
        lab.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        lab.process.kill()
        lab.process.wait(timeout=5)


def wait_for_idle_kernel(page: Page, timeout_ms: float) -> None:
    """Wait until the notebook's kernel has started and is idle.

    The toolbar's execution indicator says idle before any kernel exists, so the status bar,
    which names the kernel and its state, decides.
    """
    page.wait_for_function(
        """() => {
            const status = document.querySelector('.jp-StatusBar-Left');
            const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return status !== null && /\\| Idle\\b/.test(status.innerText)
                && !status.innerText.includes('No Kernel')
                && indicator !== null && indicator.dataset.status === 'idle';
        }""",
        timeout=timeout_ms,
    )


def choose_from_menu(page: Page, menu: str, item: str) -> None:
    """Click ``menu`` in the main menu bar, then its entry ``item``."""
    page.locator(".lm-MenuBar-itemLabel", has_text=menu).first.click()
    page.get_by_role("menuitem", name=item, exact=True).click()


def run_all_cells_afresh(page: Page) -> None:
    """Clear the stored outputs, then Run → Run All Cells, as an operator would.

    Clearing first means every execution count and output on the page comes from this run.
    """
    choose_from_menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-CodeCell .jp-OutputArea-child').length === 0"
    )
    choose_from_menu(page, "Run", "Run All Cells")


def wait_for_all_cells_executed(page: Page, timeout_ms: float) -> None:
    """Wait until every code cell shows an execution count and the kernel is idle again."""
    page.wait_for_function(
        """() => {
            const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
            const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return prompts.length > 0
                && prompts.every(p => /\\[\\d+\\]/.test(p.textContent))
                && indicator !== null && indicator.dataset.status === 'idle';
        }""",
        timeout=timeout_ms,
    )


def save_whole_notebook_screenshot(page: Page, path: Path) -> None:
    """Screenshot the notebook with every cell in view.

    The notebook scrolls inside its own panel, so a full-page screenshot alone would show one
    screen of it: the sidebar is closed and the window made as tall as the notebook instead.
    """
    page.keyboard.press("Escape")
    page.keyboard.press("Control+b")
    scroller = page.locator(".jp-NotebookPanel .jp-WindowedPanel-outer").first
    overflow = scroller.evaluate("element => element.scrollHeight - element.clientHeight")
    size = page.viewport_size or {"width": 1400, "height": 1000}
    page.set_viewport_size({"width": size["width"], "height": size["height"] + int(overflow)})
    # Run All leaves the last cell active and the panel scrolled to it.
    scroller.evaluate("element => element.scrollTo(0, 0)")
    page.wait_for_timeout(500)
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


def cell_output(page: Page, source_fragment: str) -> Locator:
    """The output area of the code cell whose source contains ``source_fragment``."""
    cell = page.locator(".jp-CodeCell", has=page.locator(".cm-content", has_text=source_fragment))
    return cell.locator(".jp-OutputArea")


@pytest.fixture(scope="module")
def lab(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """JupyterLab serving a copy of the notebooks, pointed at the rehearsal host."""
    work = tmp_path_factory.mktemp("browser")
    root = work / "notebooks"
    shutil.copytree(REPOSITORY / "notebooks", root)
    server = start_lab(root, Path(sandbox.deployment_path), work)
    try:
        wait_until_up(server)
        yield server
    finally:
        stop_lab(server)


@pytest.fixture(scope="module")
def driver() -> Iterator[Playwright]:
    """One Playwright driver for the module (its sync API allows one at a time)."""
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture(scope="module")
def executed(
    lab: Lab, driver: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ExecutedNotebook]:
    """The preflight notebook opened in chromium, all cells run, screenshot saved."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make setup` does)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    browser = driver.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(CHROMIUM),
        args=CHROMIUM_FLAGS,
        headless=True,
        viewport={"width": 1400, "height": 1000},
    )
    try:
        page = browser.pages[0] if browser.pages else browser.new_page()
        page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=PAGE_LOAD_MS)
        wait_for_idle_kernel(page, PAGE_LOAD_MS)
        run_all_cells_afresh(page)
        try:
            wait_for_all_cells_executed(page, RUN_ALL_MS)
            wait_for_idle_kernel(page, RUN_ALL_MS)
        finally:
            save_whole_notebook_screenshot(page, SCREENSHOT)
            print(f"screenshot: {SCREENSHOT}")
        yield ExecutedNotebook(page, lab)
    finally:
        browser.close()


def test_the_notebook_ran_against_the_rehearsal_host(
    executed: ExecutedNotebook, sandbox: Sandbox
) -> None:
    text = cell_output(executed.page, "stages.run_stage(").inner_text()
    assert f"{sandbox.user}@{sandbox.address}:{sandbox.port}" in text, text
    assert f"{GPU_COUNT} GPU(s)" in cell_output(executed.page, "fleet.show()").inner_text()


def test_the_gpu_table_lists_eight_blackwell_gpus(executed: ExecutedNotebook) -> None:
    table = cell_output(executed.page, "fleet.show()").locator(
        "table", has=executed.page.locator("th", has_text="compute capability")
    )
    rows = table.locator("tbody tr")
    texts = rows.all_inner_texts()
    assert len(texts) == GPU_COUNT, texts
    for text in texts:
        cells = text.split("\t")
        assert GPU_NAME in cells[1] and cells[2].strip() == "12.0", cells


def test_the_gpu_memory_chart_is_drawn_for_every_gpu(executed: ExecutedNotebook) -> None:
    output = cell_output(executed.page, "fleet.show()")
    image = output.locator('[data-mime-type="image/svg+xml"] img').first
    image.wait_for(state="visible")
    # JupyterLab shows SVG as an <img> of a data: URL; a width of 0 means it failed to decode.
    assert image.evaluate("img => img.complete && img.naturalWidth") > 0
    svg = urllib.parse.unquote(image.get_attribute("src") or "")
    assert svg.startswith("data:image/svg+xml,<svg"), svg[:80]
    for gpu in range(GPU_COUNT):
        assert f'data-gpu="{gpu}"' in svg, f"no bar for GPU {gpu}"


def test_the_verdict_and_findings_are_shown(executed: ExecutedNotebook) -> None:
    output = cell_output(executed.page, "stages.run_stage(")
    verdict = output.locator(".jp-RenderedHTMLCommon").first
    verdict.wait_for(state="visible")
    text = verdict.inner_text()
    assert "ok" in text and GPU_NAME in text and "compute capability 12.0" in text, text


def test_no_cell_raised(executed: ExecutedNotebook) -> None:
    errors = executed.page.locator(ERROR_OUTPUT).all_inner_texts()
    assert not [e for e in errors if "Traceback" in e or "Error" in e], errors
    assert "[*]" not in executed.page.locator(".jp-Notebook").inner_text()


def test_the_deployment_form_renders_as_widgets(executed: ExecutedNotebook, sandbox) -> None:
    widgets = executed.page.locator(".jp-OutputArea .jupyter-widgets")
    widgets.first.wait_for(state="visible")
    assert widgets.count() > 0
    picker = executed.page.locator(".jp-OutputArea .widget-dropdown select").first
    assert picker.input_value() == str(sandbox.deployment_path)
    assert executed.page.locator(".jp-OutputArea .widget-text input").count() >= 1


def test_the_screenshot_was_saved(executed: ExecutedNotebook) -> None:
    assert SCREENSHOT.stat().st_size > 10_000
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- clicks --------------------------------------------------------------------------------------
# The buttons of 02_config_patch and 04_launch clicked as an operator clicks them: after each
# click, without running a cell again, the page says what the host really has (checked on the
# host itself); the saved notebook and its HTML export show what was clicked, by whom and when;
# the session has a run folder with a journal; a secret on a foreign process's command line
# reaches no saved notebook; on a two-host deployment the buttons act on both hosts. Each
# notebook is a fresh copy, on rehearsal hosts of their own (127.0.5.x).

ADDRESS = "127.0.5.30"
FLEET_ADDRESS = "127.0.5.40"
CLICK_MS = 120_000
SHOTS = REPOSITORY / "test-output" / "browser"


@dataclass
class ClickSession:
    """A JupyterLab serving fresh copies of the notebooks, and a browser page on it."""

    lab: Lab
    root: Path
    page: Page
    context: BrowserContext
    confirmation: str = ""

    def open(self, notebook: str) -> None:
        """Open ``notebook`` in a tab of its own and run all its cells afresh."""
        self.page.close()
        self.page = self.context.new_page()
        # A workspace of its own: the notebooks opened before are not restored beside it.
        workspace = notebook.replace(".ipynb", "")
        self.page.goto(self.lab.url(f"lab/workspaces/{workspace}/tree/{notebook}") + "&reset")
        self.page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=PAGE_LOAD_MS)
        wait_for_idle_kernel(self.page, PAGE_LOAD_MS)
        run_all_cells_afresh(self.page)
        wait_for_all_cells_executed(self.page, RUN_ALL_MS)
        wait_for_idle_kernel(self.page, RUN_ALL_MS)

    def click(self, button: str, then: str, during: str = "", *, confirm: bool = True) -> str:
        """Click the button whose label starts with ``button``, then the confirmation it asks
        for (kept in ``confirmation``) when it asks; wait until the page shows ``during``
        (while the step runs) and ``then`` under it (the click is recorded after the step and
        the redraw)."""
        target = self._button(button)
        target.wait_for(state="visible")
        assert target.is_enabled(), f"{button!r} is disabled"
        count = "text => document.querySelector('.jp-Notebook').innerText.split(text).length - 1"
        before = self.page.evaluate(count, then)
        while_running = self.page.evaluate(count, during) if during else 0
        target.click()
        if confirm:
            asked = self.page.locator("button.jupyter-button", has_text=re.compile("^Confirm: "))
            asked.last.wait_for(state="visible")
            self.confirmation = asked.last.inner_text()
            asked.last.click()
        if during:
            self.page.wait_for_function(
                f"text => ({count})(text) > {while_running}", arg=during, timeout=CLICK_MS
            )
        # The step is recorded under the button once done, then what depends on it redrawn.
        self.page.wait_for_function(
            f"text => ({count})(text) > {before}", arg=then, timeout=CLICK_MS
        )
        wait_for_idle_kernel(self.page, CLICK_MS)
        self.page.wait_for_function(
            "() => ![...document.querySelectorAll('button.jupyter-button')]"
            ".some(b => b.innerText.includes('(running)'))",
            timeout=CLICK_MS,
        )
        record = self.page.locator(".jp-OutputArea-output", has_text=then)
        return record.last.inner_text()

    def button(self, label: str) -> tuple[bool, str]:
        """Whether the button is enabled, and its label."""
        found = self._button(label)
        found.wait_for(state="visible")
        return found.is_enabled(), found.inner_text()

    def tick(self, button: str, hosts: list[str]) -> None:
        """Tick exactly ``hosts`` among the boxes above the button whose label starts with
        ``button``."""
        gate = self.page.locator(".widget-vbox", has=self._button(button)).last
        boxes = gate.get_by_role("checkbox")
        for index in range(boxes.count()):
            box = boxes.nth(index)
            box.set_checked(self.box_host(box) in hosts)

    def ticked(self, button: str) -> list[str]:
        """The hosts ticked above the button whose label starts with ``button``."""
        gate = self.page.locator(".widget-vbox", has=self._button(button)).last
        boxes = gate.get_by_role("checkbox")
        return [self.box_host(b) for b in boxes.all() if b.is_checked()]

    @staticmethod
    def box_host(box: Locator) -> str:
        return box.locator("xpath=..").inner_text().strip()

    def _button(self, label: str) -> Locator:
        # By the start of its label: a confirmation ("Confirm: restore the original config")
        # names the step too.
        return self.page.locator(
            "button.jupyter-button", has_text=re.compile("^" + re.escape(label))
        ).last

    def save(self, notebook: str, shot: str) -> dict:
        path = self.root / notebook
        before = path.stat().st_mtime
        self.page.locator(".jp-NotebookPanel .jp-Notebook").first.click(position={"x": 5, "y": 5})
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("Control+s")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if path.stat().st_mtime > before:
                break
            time.sleep(0.5)
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / shot), full_page=True)
        return json.loads(path.read_text())

    def html_of(self, notebook: str) -> str:
        out = self.root.parent / "html"
        subprocess.run(
            [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--output-dir",
             str(out), str(self.root / notebook)],
            check=True, capture_output=True,
        )  # fmt: skip
        return (out / notebook.replace(".ipynb", ".html")).read_text()

    def runs(self, notebook: str) -> list[Path]:
        return sorted((self.root.parent / "runs").glob(f"*-session-{notebook}-*"))


def lab_session(deployment: Path, work: Path, driver: Playwright) -> Iterator[ClickSession]:
    root = work / "notebooks"
    shutil.copytree(REPOSITORY / "notebooks", root)
    lab = start_lab(root, deployment, work)
    try:
        wait_until_up(lab)
        if not CHROMIUM.exists():
            pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make setup` does)")
        browser = driver.chromium.launch_persistent_context(
            str(work / "chromium-profile"),
            executable_path=str(CHROMIUM),
            args=CHROMIUM_FLAGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            page = browser.pages[0] if browser.pages else browser.new_page()
            yield ClickSession(lab, root, page, browser)
        finally:
            browser.close()
    finally:
        stop_lab(lab)


@pytest.fixture(scope="module")
def click_box() -> Iterator[Sandbox]:
    with rehearsal_host("clicks", address=ADDRESS) as box:
        yield box


@pytest.fixture(scope="module")
def session(
    click_box: Sandbox, driver: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClickSession]:
    yield from lab_session(click_box.deployment_path, tmp_path_factory.mktemp("clicks"), driver)


def model_dir(click_box: Sandbox) -> Path:
    return Path(load_deployment(click_box.deployment_path).model_path)


def is_patched(click_box: Sandbox) -> bool:
    return "kv_cache_scheme" not in (model_dir(click_box) / "config.json").read_text()


def name_of(box: Sandbox) -> str:
    return f"{box.user}@{box.address}:{box.port}"


def health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=3) as reply:
            return int(reply.status)
    except (urllib.error.URLError, OSError):
        return None


def patch_and_upload(deployment: Path) -> None:
    """What 02 and 03 do before 04 can start a server: the config patched, the script there."""
    from opsbook import stages

    dep = load_deployment(deployment)
    for name in ("config-patch", "launch-script"):
        run = stages.run_stage(stages.get(name), dep, apply=True, on_result=None)
        assert run.ok, run.table()


def test_02_apply_then_restore_shows_what_the_host_has(
    session: ClickSession, click_box: Sandbox
) -> None:
    session.open("02_config_patch.ipynb")
    verdict = cell_output(session.page, 'widgets.live("verdict"').inner_text()
    assert "would change" in verdict, verdict
    assert not is_patched(click_box)
    enabled, _ = session.button("Restore the original config")
    assert not enabled  # nothing to restore yet
    assert "no host has a patched config to restore" in session.page.inner_text(".jp-Notebook")

    record = session.click("Apply the patch on 1 host(s)", "clicked Apply the patch")
    assert session.confirmation == f"Confirm: apply the patch on {name_of(click_box)}"
    assert is_patched(click_box)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\s+root\s+clicked", record), record
    verdict = cell_output(session.page, 'widgets.live("verdict"').inner_text()
    assert "would change" not in verdict and "\tok\t" in verdict, verdict
    assert not session.button("Apply the patch")[0]  # nothing left to apply
    assert session.button("Restore the original config on 1 host(s)")[0]

    record = session.click("Restore the original config", "clicked Restore the original config")
    assert session.confirmation == f"Confirm: restore the original config on {name_of(click_box)}"
    assert not is_patched(click_box)
    # The originals are back: done, not FAILED, whatever the prediction says of them.
    assert "restored the original config on 1 of 1 host(s)" in record, record
    assert "FAILED" not in record, record
    original = (model_dir(click_box) / "config.json.opsbook-orig").read_bytes()
    assert (model_dir(click_box) / "config.json").read_bytes() == original
    verdict = cell_output(session.page, 'widgets.live("verdict"').inner_text()
    assert "would change" in verdict and "will stop vLLM" in verdict, verdict
    journal = cell_output(session.page, 'widgets.live("journal"').inner_text()
    assert "probe configs" in journal, journal

    # Patched again for the launch test below (a 16-bit KV cache is what starts here).
    session.click("Apply the patch on 1 host(s)", "clicked Apply the patch")
    assert is_patched(click_box)
    saved = session.save("02_config_patch.ipynb", "02_config_patch-clicked.png")
    text = json.dumps(saved)
    assert "clicked 'Apply the patch on 1 host(s)'" in text
    assert "clicked 'Restore the original config on 1 host(s)'" in text
    assert "VBox(children" not in text and "IntProgress(value" not in text
    page = session.html_of("02_config_patch.ipynb")
    assert "clicked" in page and "Restore the original config" in page


def test_04_stop_and_start_follow_the_host(session: ClickSession, click_box: Sandbox) -> None:
    patch_and_upload(click_box.deployment_path)
    port = load_deployment(click_box.deployment_path).server_port
    session.open("04_launch.ipynb")
    assert health(port) is None
    enabled, _ = session.button("Stop the server")
    assert not enabled
    record = session.click("Start the server on 1 host(s)", "clicked Start the server")
    assert "smoke test passed" in record or "changed" in record, record
    assert health(port) == 200
    assert session.confirmation == f"Confirm: start the server on {name_of(click_box)}"
    verdict = cell_output(session.page, 'widgets.live("verdict"').inner_text()
    assert "already running and ready" in verdict, verdict
    # A healthy serving host is acted on only when ticked.
    assert not session.button("Restart the server on 0 host(s)")[0]
    assert not session.button("Stop the server on 0 host(s)")[0]
    session.tick("Restart the server", [name_of(click_box)])
    assert session.button("Restart the server on 1 host(s)")[0]
    session.tick("Stop the server", [name_of(click_box)])
    assert session.button("Stop the server on 1 host(s)")[0]

    session.click("Stop the server on 1 host(s)", "clicked Stop the server")
    assert health(port) is None
    verdict = cell_output(session.page, 'widgets.live("verdict"').inner_text()
    assert "would (re)start the server" in verdict, verdict
    assert not session.button("Stop the server")[0]
    saved = json.dumps(session.save("04_launch.ipynb", "04_launch-clicked.png"))
    assert "clicked 'Start the server on 1 host(s)'" in saved
    assert "clicked 'Stop the server on 1 host(s)'" in saved
    assert "VBox(children" not in saved and "IntProgress(value" not in saved


def test_each_session_files_a_run_folder_with_a_journal(session: ClickSession) -> None:
    for notebook in ("02_config_patch", "04_launch"):
        folders = session.runs(notebook)
        assert folders, list((session.root.parent / "runs").glob("*"))
        folder = folders[-1]
        header = json.loads((folder / "session.json").read_text())
        assert header["notebook"] == notebook and header["user"] == "root"
        journal = (folder / "journal.jsonl").read_text().splitlines()
        assert len(journal) > 3
        clicks = [json.loads(line) for line in (folder / "clicks.jsonl").read_text().splitlines()]
        assert {c["label"].split(" ")[0] for c in clicks} >= {"Stop", "Start"} or {
            c["label"].split(" ")[0] for c in clicks
        } >= {"Apply", "Restore"}
    session.click("File this run", "clicked File this run", confirm=False)
    folder = session.runs("04_launch")[-1]
    assert (folder / "summary.json").exists() and (folder / "index.html").exists()
    assert not (folder.stat().st_mode & 0o222)
    assert not session.button("File this run")[0]


@pytest.fixture
def planted(click_box: Sandbox) -> Iterator[str]:
    """A foreign process (root's, not the sandbox user's) that looks like a vLLM server, with
    an API key on its command line."""
    key = "sk-" + "".join(secrets.choice(string.ascii_letters) for _ in range(32))
    code = "import time; time.sleep(600)"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "vllm", "serve", "/models/other", "--api-key", key]
    )
    try:
        yield key
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_secret_on_a_foreign_command_line_reaches_no_saved_notebook(
    session: ClickSession, planted: str
) -> None:
    session.open("00_preflight.ipynb")
    page_text = session.page.inner_text(".jp-Notebook")
    assert "/models/other" in page_text  # the process was seen and shown
    assert planted not in page_text
    saved = json.dumps(session.save("00_preflight.ipynb", "00_preflight-planted.png"))
    assert "/models/other" in saved
    assert planted not in saved
    for path in (session.root.parent / "runs").rglob("*"):
        if path.is_file():
            assert planted not in path.read_text(errors="replace"), path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[fleets.Fleet]:
    folder = Path(tempfile.mkdtemp(prefix="opsbook-clicks-fleet-", dir="/tmp"))
    folder.chmod(0o755)  # the sandbox keeps an existing folder's mode; its user must enter
    try:
        yield fleets.up(folder, hosts=3, address=FLEET_ADDRESS)
    finally:
        fleets.down(folder)
        shutil.rmtree(folder, ignore_errors=True)


def server_pids(deployment: Path) -> dict[str, list[int]]:
    """Each host's processes of the server opsbook started, as the launch's dry run sees them."""
    from opsbook import stages
    from opsbook.stages import launch_server

    run = stages.run_stage(stages.get("launch"), load_deployment(deployment), on_result=None)
    return {
        name: [p.pid for p in report.server.processes if p.pid is not None]
        for name, report in run.reports.items()
        if isinstance(report, launch_server.LaunchReport)
    }


def start_healthy_and_crashed(deployment: Path, healthy: str, crashed: str) -> None:
    """A fleet with one healthy serving host, one whose server crashed (killed, as the OOM
    killer does) and one never started."""
    from opsbook import stages

    dep = load_deployment(deployment)
    run = stages.run_stage(
        stages.get("launch"), dep, hosts=[healthy, crashed], apply=True, on_result=None
    )
    assert run.ok, run.table()
    for pid in server_pids(deployment)[crashed]:
        os.kill(pid, signal.SIGKILL)


def test_a_fleet_restart_acts_on_the_broken_hosts_only(
    fleet: fleets.Fleet, driver: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> None:
    dep = load_deployment(fleet.deployment_path)
    patch_and_upload(fleet.deployment_path)
    names = [h.name for h in dep.hosts]
    healthy, never, crashed = names
    ports = [dep.for_host(h).server_port for h in dep.hosts]
    start_healthy_and_crashed(fleet.deployment_path, healthy, crashed)
    serving = server_pids(fleet.deployment_path)[healthy]
    assert serving and [health(p) for p in ports] == [200, None, None]
    started = {pid: stat_fields(pid)[19] for pid in serving}  # start time, in clock ticks
    for clicks in lab_session(fleet.deployment_path, tmp_path_factory.mktemp("fleet"), driver):
        clicks.open("04_launch.ipynb")
        # The default: the hosts the dry run would restart; the serving one only when ticked.
        assert clicks.ticked("Restart the server") == [never, crashed]
        assert clicks.ticked("Stop the server") == []
        clicks.click(
            "Restart the server on 2 host(s)",
            "clicked Restart the server on 2 host(s)",
            during="restarting",
        )
        assert clicks.confirmation == f"Confirm: restart the server on {never}, {crashed}"
        assert [health(p) for p in ports] == [200, 200, 200]
        assert server_pids(fleet.deployment_path)[healthy] == serving
        assert {pid: stat_fields(pid)[19] for pid in serving} == started
        verdict = cell_output(clicks.page, 'widgets.live("verdict"').inner_text()
        assert verdict.count("already running and ready") == 3, verdict
        # Nothing needs stopping: the operator ticks every host, and the stop acts on all.
        assert clicks.ticked("Stop the server") == []
        clicks.tick("Stop the server", names)
        clicks.click("Stop the server on 3 host(s)", "clicked Stop the server on 3 host(s)")
        assert clicks.confirmation == f"Confirm: stop the server on {', '.join(names)}"
        assert [health(p) for p in ports] == [None, None, None]
        verdict = cell_output(clicks.page, 'widgets.live("verdict"').inner_text()
        assert verdict.count("would (re)start the server") == 3, verdict


# -- a session is a record without a click on "File this run" -----------------------------------

SWITCH_ADDRESS = "127.0.5.50"


def switch_deployment(clicks: ClickSession, path: str) -> None:
    """Pick ``path`` in the form, then run the cells below it, as the README says."""
    form = cell_output(clicks.page, "widgets.DeploymentForm(")
    form.locator("select").first.select_option(label=path)
    below = clicks.page.locator(".jp-CodeCell", has=clicks.page.locator(
        ".cm-content", has_text="dep = form.load()"))  # fmt: skip
    below.locator(".jp-InputArea-prompt").first.click()
    choose_from_menu(clicks.page, "Run", "Run Selected Cell and All Below")
    clicks.page.wait_for_function(
        "() => document.querySelector('.jp-Notebook-ExecutionIndicator').dataset.status === 'busy'",
        timeout=PAGE_LOAD_MS,
    )
    wait_for_idle_kernel(clicks.page, RUN_ALL_MS)


def test_a_session_is_on_record_without_filing_after_its_tab_closes(
    click_box: Sandbox, driver: Playwright, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from opsbook.runner import records

    work = tmp_path_factory.mktemp("unfiled")
    with rehearsal_host("switch", address=SWITCH_ADDRESS) as other:
        for box in (click_box, other):
            patch_and_upload(box.deployment_path)
        (work / "deployments").mkdir()
        (work / "deployments" / "other.yml").symlink_to(other.deployment_path)
        first, second = name_of(click_box), name_of(other)
        for clicks in lab_session(click_box.deployment_path, work, driver):
            clicks.open("04_launch.ipynb")
            clicks.click("Start the server on 1 host(s)", "clicked Start the server")
            assert clicks.confirmation == f"Confirm: start the server on {first}"
            switch_deployment(clicks, "../deployments/other.yml")
            clicks.click("Start the server on 1 host(s)", "clicked Start the server")
            assert clicks.confirmation == f"Confirm: start the server on {second}"
            clicks.tick("Restart the server", [second])
            clicks.click("Restart the server on 1 host(s)", "clicked Restart the server")
            clicks.page.close()  # the tab, closed without "File this run"
            clicks.page = clicks.context.new_page()
            folders = clicks.runs("04_launch")
            assert len(folders) == 1, folders
            folder = folders[0]
            header = json.loads((folder / "session.json").read_text())
            assert header["deployments"] == [
                str(click_box.deployment_path.resolve()),
                str(other.deployment_path.resolve()),
            ]
            assert set(header["hosts"]) == {first, second}
            clicked = [
                json.loads(line) for line in (folder / "clicks.jsonl").read_text().splitlines()
            ]
            assert clicked[-1]["hosts"] == [second] and clicked[-1]["ok"]
            notebook = json.loads((folder / "session.ipynb").read_text())
            sources = [("".join(c["source"])) for c in notebook["cells"]]
            assert any("dep = form.load()" in s for s in sources)
            assert "clicked 'Restart the server on 1 host(s)'" in json.dumps(notebook)
            listed = opsbook_records(clicks.root.parent / "runs")
            row = next(line for line in listed.splitlines() if folder.name in line)
            assert "interactive, not filed" in row and " ok " in row, listed
            assert records.show_run(folder)["status"] == "ok"
        for box in (click_box, other):
            stop_servers(box.deployment_path)


def opsbook_records(runs: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "opsbook", "records", "list", "--runs-dir", str(runs)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout


def stop_servers(deployment: Path) -> None:
    from opsbook import stages

    dep = load_deployment(deployment)
    run = stages.run_stage(stages.STOP, dep, on_result=None)
    assert run.ok, run.table()
