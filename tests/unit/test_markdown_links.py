"""`analyze --format markdown` pasted into a ticket: log text never becomes a live link or markup, as GitHub's own
renderer (cmark-gfm, its autolink, table and strikethrough extensions) reads the report."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddpslurm import sanitize

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
LINKS = ("https://evil.example/run?a=*b*&c=_d_", "www.evil.example/x", "bob@corp.example", "ftp://files.example/a",
         "mailto:ops@corp.example", "xmpp:bot@chat.example", "s3://bucket.example/ckpt")
#: markup elements that log text must never produce
MARKUP = {"a", "em", "strong", "del", "img", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol", "li",
          "input", "script", "b", "i"}


def gfm_html(text: str) -> str:
    try:
        import cmarkgfm
        from cmarkgfm.cmark import Options
    except ImportError:
        if IN_CI:
            pytest.fail("cmarkgfm is required in CI (the test extra installs it)")
        pytest.skip("cmarkgfm is not installed: pip install -e '.[test]'")
    return cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE)


class Elements(HTMLParser):
    """Each element's tag and the text of the `code` elements."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.code: list[str] = []
        self.texts: list[str] = []
        self._in_code = 0
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_code += tag == "code"
        if tag == "code":
            self.code.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_code -= tag == "code"

    def handle_data(self, data: str) -> None:
        self.texts.append(data)
        if self._in_code:
            self.code[-1] += data


@pytest.mark.parametrize("link", LINKS)
def test_a_bare_link_in_one_line_field_is_a_code_span_not_a_link(link: str) -> None:
    shown = Elements(gfm_html(f"| a | b |\n|---|---|\n| x | {sanitize.markdown(f'see {link}, then *retry*')} |\n"))
    assert not set(shown.tags) & MARKUP, shown.tags
    assert any(link in code for code in shown.code), shown.code
    assert "*retry*" in "".join(shown.texts)  # the markup characters shown as they were written


def test_text_without_links_is_escaped_as_before() -> None:
    assert sanitize.markdown("node01.cluster.example *x* _y_") == r"node01.cluster.example \*x\* \_y\_"


def report_of(tmp_path: Path, message: str) -> str:
    """`ddpslurm analyze --format markdown` of a log whose failing rank raised with `message`."""
    log = tmp_path / "slurm-77.out"
    log.write_text("0: step 10 loss 0.5\n1: Traceback (most recent call last):\n"
                   "1:   File \"train.py\", line 10, in <module>\n1:     raise ValueError(msg)\n"
                   f"1: ValueError: {message}\nsrun: error: node02: task 1: Exited with exit code 1\n")
    done = subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", str(log), "--format", "markdown"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_report_of_a_log_full_of_links_renders_without_a_live_link(tmp_path: Path) -> None:
    message = " ".join(LINKS) + " <https://angle.example> [click](https://md.example) **loud** ~~gone~~"
    report = report_of(tmp_path, message)
    assert "https://evil.example" in report  # the report carries the line
    shown = Elements(gfm_html(report))
    plain = Elements(gfm_html(report_of(tmp_path, "plain words")))
    assert "table" in shown.tags and "pre" in shown.tags  # the rank table and the evidence fence
    assert "a" not in shown.tags
    # the report's own headings, bold labels and lists, and nothing more than code spans
    assert Counter(t for t in shown.tags if t != "code") == Counter(t for t in plain.tags if t != "code")
    assert any("https://evil.example" in code for code in shown.code)


@pytest.mark.parametrize(("text", "code"), [
    ("see [here](http://e.example/x).", "http://e.example/x"),
    ("docs (https://w.example/a_(b)), then", "https://w.example/a_(b)"),
    ("mail ops@site.example, now", "ops@site.example"),
])
def test_a_links_closing_parenthesis_and_full_stop_stay_outside_its_code_span(text: str, code: str) -> None:
    shown = Elements(gfm_html(f"| a |\n|---|\n| {sanitize.markdown(text)} |\n"))
    assert shown.code == [code] and not set(shown.tags) & MARKUP, (shown.code, shown.tags)
