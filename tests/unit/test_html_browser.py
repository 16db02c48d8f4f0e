"""`analyze --html` in a real headless Chromium: every lab case renders with its culprit marked.

Chromium (Debian's `chromium`, installed by scripts/setup) loads each report from a file, runs its
parser, and hands back the DOM it built (`--dump-dom`) and a screenshot; the assertions read that DOM.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import struct
import subprocess
import sys
import time
import zlib
from functools import cache
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import Diagnosis
from ddpslurm.analyze.report.html import write_html

REPO = Path(__file__).resolve().parents[2]
LAB_CASES = sorted(p for p in (REPO / "analyzer" / "cases").glob("lab-*") if (p / "label.json").is_file())
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "wbr", "area", "base", "source"}


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if IN_CI:
            pytest.fail("chromium is required in CI (scripts/setup installs Debian's chromium)")
        pytest.skip("chromium is not installed: run scripts/setup (apt-get install chromium)")
    return path


def browse(page: Path, profile: Path, *extra: str) -> str:
    """Load `page` in headless Chromium with no network; return what it printed (the DOM for --dump-dom)."""
    argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
            "--proxy-server=127.0.0.1:9", "--window-size=1200,900", *extra, page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(profile)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Browser:
    """One headless Chromium driven over its DevTools pipe (fd 3 in, fd 4 out, NUL-separated JSON):
    each page is loaded in the same tab and its DOM read back, instead of one browser start per page."""

    def __init__(self, profile: Path) -> None:
        to_browser, self._to = os.pipe()
        self._from, from_browser = os.pipe()

        def wire() -> None:  # in the child: the pipe ends where Chromium expects them
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        argv = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--remote-debugging-pipe", f"--user-data-dir={profile}", "--proxy-server=127.0.0.1:9", "about:blank"]
        self.process = subprocess.Popen(argv, preexec_fn=wire, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env={**os.environ, "HOME": str(profile)})
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._next_id, self.events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=self.session)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._from, 1 << 20) if ready else b""
            assert chunk, "Chromium did not answer on its DevTools pipe"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: str | None = None, **params: object) -> dict:
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params}
        if session:
            request["sessionId"] = session
        os.write(self._to, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + 60
        while (message := self._message(deadline)).get("id") != self._next_id:
            self.events.append(message)
        assert "error" not in message, message
        return message["result"]

    def dom(self, page: Path) -> str:
        """Load `page` and return the DOM Chromium built (what `--dump-dom` prints)."""
        self.events.clear()
        self.call("Page.navigate", session=self.session, url=page.as_uri())
        deadline = time.monotonic() + 60
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._message(deadline))
        return f"<!DOCTYPE html>{self.evaluate('document.documentElement.outerHTML')}"

    def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the loaded page."""
        result = self.call("Runtime.evaluate", session=self.session, returnByValue=True, expression=expression)
        return result["result"].get("value")

    def close(self) -> None:
        os.close(self._to)
        self.process.terminate()
        self.process.wait(timeout=30)
        os.close(self._from)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    chromium()
    running = Browser(tmp_path_factory.mktemp("chromium"))
    yield running
    running.close()


class Dom(HTMLParser):
    """The elements of a dumped DOM, each with its class list, attributes, ancestors and text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self.stack: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = {"tag": tag, "attrs": dict(attrs), "classes": (dict(attrs).get("class") or "").split(),
                   "parents": list(self.stack), "text": ""}
        self.elements.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop()["tag"] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for element in self.stack:
            element["text"] += data

    def select(self, tag: str, cls: str | None = None, **attrs: str) -> list[dict]:
        return [e for e in self.elements if e["tag"] == tag and (cls is None or cls in e["classes"])
                and all(e["attrs"].get(k) == v for k, v in attrs.items())]

    def by_id(self, ident: str) -> list[dict]:
        return [e for e in self.elements if e["attrs"].get("id") == ident]


@cache
def diagnosis_of(case: Path) -> Diagnosis:
    return analyze_paths([case])


def hosts_drawn(diagnosis: Diagnosis) -> set[str]:
    return {row.host or "?" for row in [*diagnosis.ranks, *(getattr(diagnosis, "timeline", None) or [])]}


def rank_span(label: str) -> range:
    low, _, high = label.partition("-")
    return range(int(low), int(high or low) + 1)


@pytest.mark.parametrize("case", LAB_CASES, ids=[c.name for c in LAB_CASES])
def test_every_lab_case_renders_in_chromium_with_its_culprit_marked(case: Path, tmp_path: Path,
                                                                    browser: Browser) -> None:
    diagnosis = diagnosis_of(case)
    page = tmp_path / "report.html"
    write_html(diagnosis, page)
    dom = Dom(browser.dom(page))
    (svg,) = dom.select("svg", "timeline")
    assert len(dom.select("g", "node")) == len(hosts_drawn(diagnosis))
    assert {e["attrs"]["data-host"] for e in dom.select("g", "node")} == hosts_drawn(diagnosis)
    assert dom.by_id("cause")[0]["text"] == diagnosis.cause
    culprit = dom.by_id("culprit")
    if diagnosis.first_failing_rank is None:
        assert culprit == [] and dom.by_id("first-failing-rank")[0]["text"] == "none (no single rank)"
        return
    (mark,) = culprit
    assert svg in mark["parents"] and "role-culprit" in mark["classes"]
    (run,) = [p for p in mark["parents"] if "run" in p["classes"]]
    assert diagnosis.first_failing_rank in rank_span(run["attrs"]["data-ranks"])
    assert dom.by_id("first-failing-rank")[0]["text"] == str(diagnosis.first_failing_rank)


def png_pixels(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the inflated scanlines of a PNG (enough to tell a drawn page from a blank one)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    chunks, at = [], 8
    while at < len(data):
        (size,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        if kind == b"IDAT":
            chunks.append(data[at + 8:at + 8 + size])
        at += 12 + size
    return width, height, zlib.decompress(b"".join(chunks))


def test_the_cli_writes_a_report_chromium_draws(tmp_path: Path) -> None:
    case = REPO / "analyzer" / "cases" / "lab-user_code_exception-1"
    page = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(case), "--json", "--html", str(page)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cause"] == diagnosis_of(case).cause
    shot = tmp_path / "shot.png"
    browse(page, tmp_path / "profile", f"--screenshot={shot}")
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1200, 900)
    assert len(set(pixels)) > 50  # a blank or failed page is a handful of byte values


def test_an_html_target_in_a_missing_folder_is_one_line_and_exit_1(tmp_path: Path) -> None:
    case = REPO / "analyzer" / "cases" / "lab-user_code_exception-1"
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(case), "--html",
                           str(tmp_path / "no" / "r.html")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "cannot write the HTML report" in done.stderr


HOSTILE = ("<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
           "</title></svg><iframe src='http://127.0.0.1:9/'><b>bold</b>")


def test_hostile_log_text_stays_text_in_the_browser(tmp_path: Path, browser: Browser) -> None:
    log = tmp_path / "slurm-9.out"
    log.write_text("0: step 10 loss 0.5\n3: Traceback (most recent call last):\n"
                   "3:   File \"train.py\", line 10, in <module>\n3:     raise ValueError(msg)\n"
                   f"3: ValueError: {HOSTILE}\nsrun: error: node<b>02</b>: task 3: Exited with exit code 1\n")
    diagnosis = analyze_paths([log])
    assert diagnosis.first_failing_rank == 3
    page = tmp_path / "report.html"
    write_html(diagnosis, page)
    browser.dom(page)
    assert browser.evaluate("document.querySelectorAll('script, img, iframe, b, foreignObject').length") == 0
    assert browser.evaluate("document.title") == f"ddpslurm: {diagnosis.cause}"
    shown = browser.evaluate("document.querySelector('#evidence').textContent")
    assert "<script>document.title='pwned'</script>" in shown
    tooltip = browser.evaluate("document.querySelector('#culprit').parentNode.querySelector('title').textContent")
    assert "<img src=x" in tooltip
