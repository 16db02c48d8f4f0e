"""Issue 16, items 4, 7 and 8: whatever the logs and file names hold, the report is valid UTF-8, strict
JSON, free of terminal escapes, and a single-line field cannot forge a report line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpslurm.analyze.model import Diagnosis, Evidence, RankRow
from ddpslurm.analyze.report.text import to_json, to_markdown
from ddpslurm.sanitize import code_text, json_dumps, json_pieces, markdown, terminal

REPO = Path(__file__).resolve().parents[2]
RAW_CONTROLS = [chr(c) for c in [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]]
OOM = b"[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"


def _analyze(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", "analyze", *args], env=full_env,
                          capture_output=True, timeout=120)


@pytest.fixture()
def undecodable_names(tmp_path: Path) -> Path:
    folder = os.path.join(os.fsencode(tmp_path), b"job\xfe")
    os.mkdir(folder)
    with open(os.path.join(folder, b"slurm-1\xff.out"), "wb") as log:
        log.write(OOM)
    return tmp_path


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
@pytest.mark.parametrize("env", [{"LC_ALL": "C.UTF-8"}, {"PYTHONIOENCODING": "utf-8:strict"},
                                 {"PYTHONIOENCODING": "ascii:strict"}])
def test_non_utf8_file_names_give_valid_utf8(undecodable_names: Path, fmt: str, env: dict[str, str]) -> None:
    done = _analyze(str(undecodable_names), "--format", fmt, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode("utf-8")  # strict: raises on a raw 0xFF
    assert "slurm-1\\xff.out" in (out if fmt != "json" else out.replace("\\\\", "\\"))
    if fmt == "json":
        report = json.loads(out)
        assert report["cause"] == "cuda_oom"
        assert any(ev["file"].endswith("job\\xfe/slurm-1\\xff.out") for ev in report["evidence"])


HOSTILE = ["\x1b[2J\x1b]0;pwned\x07", "\u009b31m", "\u0090dcs\u009c", "a\nCause: cuda_oom   confidence: high",
           "b\r\nFirst failing rank: 0", "c\u2028d\u0085e", "\u202eevil", "x\udcffy", "| [link](http://e) <b> `code`"]


def _hostile_diagnosis(text: str) -> Diagnosis:
    return Diagnosis(
        cause="cuda_oom", first_failing_rank=1, first_failing_host=f"node{text}", confidence="high",
        summary=f"Rank 1 {text}", advice=[f"do {text}"],
        evidence=[Evidence(f"/jobs/{text}.log", 3, 1, None, f"OOM {text}```")],
        ranks=[RankRow(1, f"node{text}", "culprit", f"err {text}"), RankRow(0, "n0", "victim", None)],
        retry="stop", exclude_nodes=[f"node{text}"], notes=[f"note {text}"])


@pytest.mark.parametrize("text", HOSTILE)
def test_markdown_carries_no_escape_no_forged_line_no_markup(text: str) -> None:
    out = to_markdown(_hostile_diagnosis(text))
    assert not any(ch in out for ch in [*RAW_CONTROLS, "\u2028", "\u202e"]), ascii(out)
    out.encode("utf-8")
    assert not any(line.startswith(("Cause:", "First failing rank:")) for line in out.splitlines())
    exclude = next(line for line in out.splitlines() if "**Exclude nodes:**" in line)
    assert "](" not in exclude.replace("\\](", "") and "<b>" not in exclude
    assert out.count("```") == 2  # the evidence fence is never closed early


@pytest.mark.parametrize("text", HOSTILE)
def test_json_is_strict_utf8_and_escapes_c1(text: str) -> None:
    out = to_json(_hostile_diagnosis(text))
    assert not any(ch in out for ch in RAW_CONTROLS if ch != "\n"), ascii(out)
    out.encode("utf-8")
    report = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert report["first_failing_host"].startswith("node")


def test_json_keeps_the_data_it_escapes() -> None:
    assert json.loads(json_dumps({"t": "a\u009bb\x1bc"})) == {"t": "a\u009bb\x1bc"}
    assert json.loads(json_dumps({"t": "x\udcffy"})) == {"t": "x\\xffy"}
    assert json.loads(json_dumps({"t": float("nan")})) == {"t": None}


@pytest.mark.parametrize("size", [1, 7, 64, 1 << 16])
def test_json_written_in_pieces_is_the_same_text_and_escapes_across_their_edges(size: int) -> None:
    """A 65k-rank report is written piece by piece: the pieces make the same text, every risky character escaped
    wherever a piece ends, and none is much bigger than asked."""
    value = {"ranks": [{"rank": r, "first_error": f"x\u009b[2J\u202e{r}\u2028\x7f" * 3} for r in range(40)],
             "nan": float("nan"), "bytes": "\udcff"}
    pieces = list(json_pieces(value, size=size))
    assert "".join(pieces) == json_dumps(value)
    assert not any(ch in piece for piece in pieces for ch in "\u009b\u202e\u2028\x7f")
    assert len(pieces) > 1 if size < 1 << 16 else len(pieces) == 1
    assert max(map(len, pieces)) < size + 200


@pytest.mark.parametrize(("text", "shown"), [
    ("red \x1b[31mX\x1b[0m", "red X"), ("8-bit \u009b2Jcsi", "8-bit csi"), ("osc \x1b]8;;http://e\x07link", "osc link"),
    ("two\nlines", "two lines"), ("cr\rline", "cr line"), ("bell\x07", "bell"), ("bidi \u202etxt", "bidi txt"),
    ("bytes \udcff\udcfe", "bytes \\xff\\xfe"), ("lone \ud800", "lone \\ud800"), ("tab\there", "tab here"),
])
def test_terminal(text: str, shown: str) -> None:
    assert terminal(text) == shown


def test_multi_line_text_keeps_newlines_only() -> None:
    assert terminal("a\r\nb\x0bc\x1b[1m", single_line=False) == "a\nb\nc"


def test_markdown_and_code_text() -> None:
    assert markdown("a|b [x](y) <s> `c` *d* _e_") == "a\\|b \\[x\\](y) \\<s\\> \\`c\\` \\*d\\* \\_e\\_"
    assert code_text("x ``` y\nz") == "x ''' y z"


def test_markdown_says_how_many_rank_groups_it_leaves_out() -> None:
    from ddpslurm.analyze.report.text import MAX_ROWS

    rows = [RankRow(r, f"n{r}", "victim" if r % 2 else "unknown", None) for r in range(MAX_ROWS + 7)]
    d = Diagnosis(cause="unknown", first_failing_rank=None, first_failing_host=None, confidence="low",
                  summary="s", advice=[], evidence=[], ranks=rows, retry="unknown", exclude_nodes=[], notes=[])
    table = [line for line in to_markdown(d).splitlines() if line.startswith("| ")]
    assert len(table) == 1 + MAX_ROWS + 1  # the header, the rows shown, the line saying what is not
    assert table[-1] == "| ... | | 7 more groups | see `--json` |"
    few = Diagnosis(**{**d.__dict__, "ranks": rows[:3]})
    assert not any("more groups" in line for line in to_markdown(few).splitlines())
