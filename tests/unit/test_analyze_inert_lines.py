"""Lines remembered as saying nothing (MatchCaches.inert_lines, scan.py `note_inert`): skipping the next lines of
their shape never changes what a file's scan finds, whatever those lines' digits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse import file_scan, file_state, line_recipes, scan
from ddpslurm.analyze.rules.loading import load_signatures
from ddpslurm.analyze.rules.signatures import build_set

CASES = Path(__file__).resolve().parents[2] / "analyzer" / "cases"
#: a sample of the corpus's logs (all of them take 40 s)
LOGS = random.Random(5).sample(sorted(p for p in CASES.rglob("*") if p.is_file() and p.stat().st_size < 256 << 10
                                      and p.suffix in (".out", ".err", ".log", ".txt")), 400)


def _redrawn(data: bytes, rng: random.Random) -> bytes:
    """The same bytes with every ASCII digit drawn again: every line keeps its shape."""
    return bytes(rng.randrange(48, 58) if 48 <= b <= 57 else b for b in data)


def write_twins(logs: list[Path], folder: Path, rng: random.Random) -> list[Path]:
    """Each log's twin in `folder`: its digits drawn again, its lines' shapes kept."""
    twins = []
    for i, path in enumerate(logs):
        twin = folder / f"{i}{path.suffix}"
        twin.write_bytes(_redrawn(path.read_bytes(), rng))
        twins.append(twin)
    return twins


def _scan(path: Path, sigs) -> tuple:
    source = SourceFile(path=str(path), display=path.name, size=path.stat().st_size)
    events, summary = scan.scan_file(source, sigs, 2024)
    return events, (summary.lines, summary.ranks_seen, summary.torchrun, summary.last_line, summary.tail)


def test_skipping_remembered_shapes_changes_no_scan_of_the_corpus(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    twins = write_twins(LOGS, tmp_path, random.Random(1))
    warmed = load_signatures()
    for twin in twins:  # the memo learns from the twins' lines, then meets the originals' own digits
        _scan(twin, warmed)
    assert len(warmed.caches.inert_lines) > 100
    assert any(sensitive for _offset, sensitive in warmed.caches.inert_lines.values())

    skipped = 0
    still_inert = file_state.FileState.still_inert
    monkeypatch.setattr(file_scan, "BULK", None)  # the pure path: the bulk one passes plainly inert lines over unasked

    def counting(self, raw: bytes, offset: int, sensitive: tuple[int, ...]) -> bool:
        nonlocal skipped
        answer = still_inert(self, raw, offset, sensitive)
        skipped += answer
        return answer

    monkeypatch.setattr(file_state.FileState, "still_inert", counting)
    with_memo = [_scan(path, warmed) for path in LOGS]
    monkeypatch.setattr(line_recipes, "MAX_INERT", 0)
    without = [_scan(path, load_signatures()) for path in LOGS]
    assert skipped > 300
    for path, got, want in zip(LOGS, with_memo, without, strict=True):
        assert got == want, path


def _without_rank_map_comm():
    """The shipped signatures less NCCL's `comm ... rank` map: the scanner's own `Init` reading is then the only
    one that reads an init line."""
    return build_set([s for s in load_signatures().signatures if s.id != "nccl-rank-map-comm"])


@pytest.mark.parametrize(("twin", "line", "signatures"), [
    ("SystemExit: 144 (signal)", "SystemExit: 143 (signal)", load_signatures),  # a digit-sensitive signature
    ("got signal 12 in worker", "got signal 11 in worker", load_signatures),  # a literal holding a digit
    ("comm 5x7f3a rank 3 nranks 8 cudaDev 0 busId 1 - Init START",  # NCCL's `0x`: a digit decides
     "comm 0x7f3a rank 3 nranks 8 cudaDev 0 busId 1 - Init START", _without_rank_map_comm),
    ("[rank5]: WARN nothing to see", "[rank3]: WARN nothing to see", load_signatures),  # each line tells its rank
    ("2124-05-08 10:00:00 3: WARN nothing", "2024-05-08 10:00:00 3: WARN nothing", load_signatures),  # `19|20`
    ("WARN torchrun launching 8 processes", "WARN torchrun launching 9 processes", load_signatures),  # torchrun's
])
def test_a_line_whose_digits_decide_is_read_after_its_twin(tmp_path: Path, twin: str, line: str, signatures) -> None:
    """Each guard of `note_inert`: the twin (same shape, other digits) says nothing; the line itself does."""
    (tmp_path / "twin.log").write_text(f"{twin}\n")
    (tmp_path / "line.log").write_text(f"{line}\n")
    warmed = signatures()
    _scan(tmp_path / "twin.log", warmed)
    assert not _scan(tmp_path / "twin.log", signatures())[0]
    fresh = _scan(tmp_path / "line.log", signatures())
    assert fresh[0] or fresh[1][1] or fresh[1][2], "the line itself must say something"
    assert _scan(tmp_path / "line.log", warmed) == fresh
