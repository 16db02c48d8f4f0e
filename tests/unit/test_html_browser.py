"""`analyze --html` in a real headless Chromium: every lab case renders with its culprit marked, in a 700 px window.

Chromium (Debian's `chromium`, installed by scripts/setup) loads each report from a file, runs its
parser, and hands back the DOM it built (`--dump-dom`), the boxes its layout gave the timeline's elements
(getBoundingClientRect) and screenshots; the assertions read that DOM, those boxes and the screenshots' pixels.
"""

from __future__ import annotations

import base64
import itertools
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

    def window(self, width: int, height: int = 900) -> None:
        """Lay the page out as in a window `width` px wide."""
        self.call("Emulation.setDeviceMetricsOverride", session=self.session, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def screenshot(self, x: float, y: float, width: float, height: float) -> bytes:
        """A PNG of the page's area at (x, y) (document pixels), which the window shows (the page laid out as it
        is: a capture beyond the window would lay it out again, taller and without a scroll bar)."""
        shot = self.call("Page.captureScreenshot", session=self.session, format="png", captureBeyondViewport=False,
                         clip={"x": x, "y": y, "width": width, "height": height, "scale": 1})
        return base64.b64decode(shot["data"])

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


#: what the page script hands back: the window, the page's width, the SVG's box, and each drawn element's box, its
#: class, its time (data-time) and the role of its run
GEOMETRY = """JSON.stringify((() => {
  const box = e => { const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top + scrollY, bottom: r.bottom + scrollY, width: r.width,
            height: r.height, cx: r.left + r.width / 2, cy: r.top + scrollY + r.height / 2}; };
  const svg = document.querySelector('svg.timeline');
  const timed = [...svg.querySelectorAll('[data-time]')].map(e => ({...box(e), cls: e.getAttribute('class') || '',
    tag: e.tagName, time: parseFloat(e.dataset.time), role: (e.closest('g.run') || {dataset: {}}).dataset.role}));
  const culprit = document.getElementById('culprit');
  const label = svg.querySelector('text.culprit-label');
  return {inner: innerWidth, page: document.documentElement.scrollWidth, svg: box(svg), timed,
          marks: [...svg.querySelectorAll('.mark')].map(e => ({...box(e), id: e.id})),
          culprit: culprit && box(culprit), label: label && {...box(label), text: label.textContent},
          guide: [...svg.querySelectorAll('.culprit-guide')].map(box),
          hosts: [...svg.querySelectorAll('.host-event')].map(e => ({...box(e), host: e.dataset.host})),
          rows: [...svg.querySelectorAll('g.node')].map(e => ({...box(e), host: e.dataset.host})),
          breaks: [...svg.querySelectorAll('.axis-break')].map(e => ({...box(e), idle: parseFloat(e.dataset.idle)})),
          ticks: [...svg.querySelectorAll('text.tick')].map(e => ({...box(e), text: e.textContent}))};
})())"""
NARROW = 700


def geometry(browser: Browser) -> dict:
    """The page script's answer, the timeline scrolled into the window first (where a screenshot sees it)."""
    browser.evaluate("document.querySelector('svg.timeline').scrollIntoView({block: 'start'})")
    return json.loads(browser.evaluate(GEOMETRY))


def anchor(element: dict) -> float:
    """The x its time is drawn at: a dot's or a diamond's middle, a bar's left end (its earliest time)."""
    return element["left"] + 2.5 if element["tag"] == "rect" else element["cx"]


def check_layout(shape: dict, culprit_rank: int | None) -> None:
    """What every report must show in a 700 px window: nothing wider than the window, times left to right, the
    culprit's mark the biggest, named beside it, and its rule where it is."""
    assert shape["inner"] == NARROW and shape["page"] <= NARROW, shape["page"]
    assert shape["svg"]["left"] >= 0 and shape["svg"]["right"] <= NARROW
    timed = sorted(shape["timed"], key=lambda e: e["time"])
    xs = [anchor(e) for e in timed]
    assert all(b >= a - 3 for a, b in itertools.pairwise(xs)), [(e["time"], anchor(e)) for e in timed]
    assert all(shape["svg"]["left"] <= x <= shape["svg"]["right"] for x in xs)
    ticks = shape["ticks"]
    assert all(a["right"] <= b["left"] for a, b in itertools.pairwise(ticks)), ticks  # no label overlaps
    if culprit_rank is None:
        return
    culprit, label = shape["culprit"], shape["label"]
    others = [m for m in shape["marks"] if m["id"] != "culprit"]
    assert culprit["height"] >= 16 and all(culprit["height"] > m["height"] for m in others)
    assert label["text"] == f"rank {culprit_rank}" or label["text"].startswith(f"rank {culprit_rank}-")
    assert abs(label["cy"] - culprit["cy"]) < 6 and min(abs(label["left"] - culprit["right"]),
                                                        abs(culprit["left"] - label["right"])) < 12
    for rule in shape["guide"]:
        assert abs(rule["cx"] - culprit["cx"]) < 1.5 and rule["height"] > culprit["height"]


@pytest.mark.parametrize("case", LAB_CASES, ids=[c.name for c in LAB_CASES])
def test_every_lab_case_renders_in_chromium_with_its_culprit_marked(case: Path, tmp_path: Path,
                                                                    browser: Browser) -> None:
    diagnosis = diagnosis_of(case)
    page = tmp_path / "report.html"
    write_html(diagnosis, page)
    browser.window(NARROW)
    dom = Dom(browser.dom(page))
    (svg,) = dom.select("svg", "timeline")
    assert len(dom.select("g", "node")) == len(hosts_drawn(diagnosis))
    assert {e["attrs"]["data-host"] for e in dom.select("g", "node")} == hosts_drawn(diagnosis)
    assert dom.by_id("cause")[0]["text"] == diagnosis.cause
    check_layout(geometry(browser), diagnosis.first_failing_rank)
    culprit = dom.by_id("culprit")
    if diagnosis.first_failing_rank is None:
        assert culprit == [] and dom.by_id("first-failing-rank")[0]["text"] == "none (no single rank)"
        return
    (mark,) = culprit
    assert svg in mark["parents"] and "role-culprit" in mark["classes"]
    (run,) = [p for p in mark["parents"] if "run" in p["classes"]]
    assert diagnosis.first_failing_rank in rank_span(run["attrs"]["data-ranks"])
    assert dom.by_id("first-failing-rank")[0]["text"] == str(diagnosis.first_failing_rank)


def rgb_at(png: bytes, x: float, y: float) -> tuple[int, int, int]:
    """The colour of the pixel at (x, y) of a PNG (8-bit RGB or RGBA, not interlaced, as Chromium writes them)."""
    width, height, raw = png_pixels(png)
    channels = {2: 3, 6: 4}[png[25]]
    assert png[24] == 8 and png[28] == 0
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for row in range(min(height, int(y) + 1)):
        kind, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(line)
        previous = line
    at = int(x) * channels
    return tuple(rows[int(y)][at:at + 3])


CULPRIT_RGB, VICTIM_RGB = (0xd3, 0x2f, 0x2f), (0xf3, 0x9c, 0x12)


def screenshot_colours(browser: Browser, shape: dict, points: list[dict]) -> list[tuple[int, int, int]]:
    svg = shape["svg"]
    png = browser.screenshot(svg["left"], svg["top"], svg["width"], svg["height"])
    return [rgb_at(png, p["cx"] - svg["left"], p["cy"] - svg["top"]) for p in points]


def drawn_narrow(case: Path, tmp_path: Path, browser: Browser) -> tuple[Diagnosis, dict]:
    """A case's diagnosis and the geometry of its report drawn in a narrow window."""
    diagnosis = diagnosis_of(case)
    write_html(diagnosis, tmp_path / "report.html")
    browser.window(NARROW)
    browser.dom(tmp_path / "report.html")
    return diagnosis, geometry(browser)


def test_a_straggler_culprit_shows_first_in_a_screenshot_of_a_narrow_window(tmp_path: Path, browser: Browser) -> None:
    """lab-collective_timeout-1: rank 4 sleeps while the others' collectives time out; its only failure line is the
    teardown's SIGTERM. It is drawn where it fell silent, left of every rank that timed out waiting for it, and the
    screenshot shows the culprit's red at its place and the victims' orange at theirs."""
    case = REPO / "analyzer" / "cases" / "lab-collective_timeout-1"
    diagnosis, shape = drawn_narrow(case, tmp_path, browser)
    check_layout(shape, diagnosis.first_failing_rank)
    victims = [e for e in shape["timed"] if e.get("role") == "victim" and "mark" in e["cls"].split()]
    assert victims and all(shape["culprit"]["right"] < v["left"] for v in victims)
    assert shape["culprit"]["cx"] - shape["svg"]["left"] < shape["svg"]["width"] / 2
    colours = screenshot_colours(browser, shape, [shape["culprit"], *victims])
    assert colours[0] == CULPRIT_RGB and all(c == VICTIM_RGB for c in colours[1:]), colours


def test_an_xid_before_the_failure_is_on_the_culprits_node_row_past_a_human_break(tmp_path: Path,
                                                                                    browser: Browser) -> None:
    """A journal's `NVRM: Xid 79 ... fallen off the bus` ten minutes before the watchdogs fire: a diamond on the
    culprit node's row, a break labelled in minutes between it and the ranks' failures, and the culprit (whose CUDA
    error has no time) still the biggest mark, red in the screenshot, named beside it."""
    case = REPO / "analyzer" / "cases" / "gpu-hardware-xid79-fell-off-bus-rank12-journal-srun-label"
    diagnosis, shape = drawn_narrow(case, tmp_path, browser)
    check_layout(shape, diagnosis.first_failing_rank)
    (row,) = [r for r in shape["rows"] if r["host"] == diagnosis.first_failing_host]
    assert shape["hosts"] and all(row["top"] <= h["cy"] <= row["bottom"] for h in shape["hosts"])
    victims = [e for e in shape["timed"] if e.get("role") == "victim" and "mark" in e["cls"].split()]
    (cut,) = shape["breaks"]
    assert cut["idle"] > 600 and all(h["cx"] < cut["cx"] < min(v["left"] for v in victims) for h in shape["hosts"])
    assert row["top"] <= shape["culprit"]["cy"] <= row["bottom"]
    assert shape["ticks"][0]["text"] == "+0" and all("min" in t["text"] for t in shape["ticks"][1:])
    (colour,) = screenshot_colours(browser, shape, [shape["culprit"]])
    assert colour == CULPRIT_RGB


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
