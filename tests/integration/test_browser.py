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
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, sync_playwright

from opsbook.sandbox import Sandbox

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
def executed(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExecutedNotebook]:
    """The preflight notebook opened in chromium, all cells run, screenshot saved."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (`make setup` does)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
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
