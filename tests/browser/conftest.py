"""Browser tests: the real app served in a subprocess, driven by Playwright with Debian's chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config, items):
    if Path(CHROMIUM).is_file():
        return
    skip = pytest.mark.skip(reason=f"browser tests need Debian's chromium at {CHROMIUM} (apt-get install chromium)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_served(url: str, process: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the app exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the app did not serve {url} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


class AppServer:
    """`launch(port, open_browser=False)` in a child process, with its own home, presets and runs folders."""

    def __init__(self, root: Path, presets: dict[str, str] | None = None):
        self.root = root
        self.home = root / "home"
        self.presets = root / "presets"
        self.presets.mkdir(parents=True, exist_ok=True)
        for name, text in (presets or {}).items():
            (self.presets / f"{name}.yaml").write_text(text)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = root / "server.log"
        self.process: subprocess.Popen | None = None

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            FINETUNE_APP_HOME=str(self.home),
            FINETUNE_APP_PRESETS=str(self.presets),
            HF_HUB_OFFLINE="1",
            GRADIO_ANALYTICS_ENABLED="False",
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )

    def start(self) -> AppServer:
        code = f"from finetune_app.gui.app import launch; launch(port={self.port}, open_browser=False)"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=self.root,
            env=self.env(),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until_served(self.url, self.process, self.log)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    yield page
    context.close()


def open_app(page, server: AppServer):
    page.goto(server.url)
    page.wait_for_selector("#budget-total[data-bytes]:not([data-bytes=''])", timeout=60_000)
    return page


@pytest.fixture
def make_server(tmp_path):
    servers: list[AppServer] = []

    def make(presets: dict[str, str] | None = None) -> AppServer:
        server = AppServer(tmp_path / f"app{len(servers)}", presets).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    """One app with the RunConfig defaults (no presets), shared by a module's read-mostly tests."""
    server = AppServer(tmp_path_factory.mktemp("default-app")).start()
    yield server
    server.stop()
