"""Nothing is left out silently: every file is read, and what is not read is named, with the confidence lowered.

Real files in tmp_path; the only stand-ins are a read that fails with EIO and a stat that fails with EACCES (a disk
error, or a file root cannot stat, cannot be made on demand); discovery's listings are watched through `os.scandir`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.parse import file_scan
from ddpslurm.analyze.read import discover as discover_mod
from ddpslurm.analyze.read import files
from ddpslurm.analyze.read.discover import discover_all
from ddpslurm.analyze.rules import loading, signatures
from ddpslurm.errors import AnalyzeInputError

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB\n"
WATCHDOG = ("[rank{r}]:[E612 10:24:03.2 ProcessGroupNCCL.cpp:1] [PG ID 0 PG GUID 0(default_pg) Rank {r}] failure "
            "detected by watchdog at work sequence id: 9 PG status: last enqueued work: 9, last completed work: 8\n")


def job(folder: Path, culprit: int, ranks: int = 4, culprit_text: str = OOM) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        (folder / f"77_{r}_log.err").write_text(culprit_text if r == culprit else WATCHDOG.format(r=r))
    return folder


def test_more_than_twenty_thousand_files_are_all_found(tmp_path: Path) -> None:
    for i in range(20_005):
        (tmp_path / f"9_{i}_log.out").touch()
    found = discover_all([tmp_path])
    assert len(found.sources) == 20_005 and not found.skipped


def test_pickles_by_name_are_counted_per_folder_without_lowering_confidence(tmp_path: Path) -> None:
    job(tmp_path, culprit=2)
    for r in range(4):
        (tmp_path / f"77_{r}_result.pkl").write_bytes(b"\x80\x04")
    got = analyze_paths([tmp_path]).to_dict()
    assert got["skipped"] == [{"path": str(tmp_path / "*.pkl"), "reason": "binary by its name, 4 file(s)"}]
    assert (got["cause"], got["first_failing_rank"], got["confidence"]) == ("cuda_oom", 2, "high")


def test_symlink_leaving_the_folder_is_not_followed_and_is_named(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("RuntimeError: the secret contents of another user's file\n")
    folder = job(tmp_path / "job", culprit=1)
    (folder / "77_9_log.err").symlink_to(secret)
    (folder / "inside.log").symlink_to(folder / "77_0_log.err")  # inside the tree: read once, by its real name
    found = discover_all([folder])
    assert [s.path for s in found.skipped] == [str(folder / "77_9_log.err")]
    assert "leaving the analyzed folder" in found.skipped[0].reason
    assert len(found.sources) == 4
    got = analyze_paths([folder]).to_dict()
    assert "secret" not in str(got["evidence"]) and got["skipped"][0]["path"] == str(folder / "77_9_log.err")
    assert got["first_failing_rank"] == 1 and got["confidence"] == "medium"


def test_fifo_inside_a_folder_is_named_and_never_opened(tmp_path: Path) -> None:
    folder = job(tmp_path, culprit=3)
    os.mkfifo(folder / "77_8_log.out")
    start = time.monotonic()
    got = analyze_paths([folder]).to_dict()
    assert time.monotonic() - start < 30
    assert got["skipped"] == [{"path": str(folder / "77_8_log.out"),
                               "reason": "not a regular file (fifo, socket or device)"}]


def test_reader_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match="not a regular file"):
        files.Reader(str(tmp_path / "pipe"), 5.0)


def test_folder_deeper_than_the_limit_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(discover_mod, "MAX_DEPTH", 2)
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    (deep / "x.log").write_text(OOM)
    found = discover_all([tmp_path])
    assert not found.sources
    assert [(s.path, s.reason) for s in found.skipped] == [(str(deep), "folder nested deeper than 2 levels")]


def test_short_log_with_a_zero_filled_tail_is_read(tmp_path: Path) -> None:
    folder = job(tmp_path, culprit=2, culprit_text="step 10\n" + OOM + "\0" * 6000)
    got = analyze_paths([folder]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 2)
    assert not any("binary" in s["reason"] for s in got["skipped"])


@pytest.mark.parametrize("repeat", ["NCCL error ", "DistBackendError "])
def test_one_long_line_does_not_hide_the_rest_of_the_file(tmp_path: Path, repeat: str) -> None:
    folder = job(tmp_path, culprit=1, culprit_text=repeat * 1500 + "\n" + OOM)
    start = time.process_time()
    got = analyze_paths([folder]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 1)
    assert got["skipped"] == [] and time.process_time() - start < 5


def test_catastrophic_site_signature_skips_the_line_not_the_file(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signatures, "MATCH_TIMEOUT", 0.05)
    site = tmp_path / "site"
    site.mkdir()
    (site / "site.toml").write_text('[[signature]]\nid = "site-bad"\ncause = "gpu_hardware"\nrole = "culprit"\n'
                                    "pattern = '(x|xx)+\\d'\nprefilter = [\"xxxx\"]\n")
    folder = job(tmp_path / "job", culprit=2, culprit_text="x" * 40 + "=\n" + OOM)
    got = analyze_paths([folder], signature_dirs=[site]).to_dict()
    assert (got["cause"], got["first_failing_rank"]) == ("cuda_oom", 2)
    assert got["skipped"] == [{"path": str(folder / "77_2_log.err"), "reason": "1 line(s) where a signature's regex "
                               "ran past its timeout (that signature skipped on those lines)"}]
    assert got["confidence"] != "high"


def _failing_read(path_part: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of the files whose path holds `path_part` fails with EIO (a disk or network filesystem error)."""
    for name in ("head", "readinto"):
        real = getattr(files.Reader, name)

        def failing(self, *args, _real=real):
            if path_part in os.readlink(f"/proc/self/fd/{self.fd}"):
                raise OSError(errno.EIO, "Input/output error")
            return _real(self, *args)
        monkeypatch.setattr(files.Reader, name, failing)


def test_an_unreadable_file_named_on_the_command_line_is_an_input_error(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = job(tmp_path, culprit=0)
    _failing_read("77_0_log.err", monkeypatch)
    with pytest.raises(AnalyzeInputError, match=r"77_0_log.err: cannot be read \(Input/output error\)"):
        analyze_paths([folder / "77_0_log.err", folder / "77_1_log.err"])


def test_no_readable_log_in_a_folder_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = job(tmp_path, culprit=0)
    _failing_read("_log.err", monkeypatch)
    with pytest.raises(AnalyzeInputError, match="none of the 4 log file"):
        analyze_paths([folder])


def test_an_unreadable_file_in_a_folder_is_named_and_lowers_confidence(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = job(tmp_path, culprit=0)
    _failing_read("77_3_log.err", monkeypatch)
    got = analyze_paths([folder]).to_dict()
    assert got["skipped"] == [{"path": str(folder / "77_3_log.err"),
                               "reason": "read error (Input/output error; nothing read)"}]
    assert got["first_failing_rank"] == 0 and got["confidence"] == "medium"


def test_read_deadline_stops_a_file_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_scan, "READ_DEADLINE", -1.0)
    folder = job(tmp_path, culprit=0)
    with pytest.raises(AnalyzeInputError, match="still reading after"):
        analyze_paths([folder])


def test_shipped_signatures_are_fast_on_adversarial_short_lines() -> None:
    """Shipped patterns run untimed on lines up to UNTIMED_CHARS: each must stay fast on lines made of its own
    literals repeated (the shape that made two of them quadratic)."""
    sigs = loading.load_signatures()
    slow = []
    for sig in sigs.signatures:
        for lit in (*sig.prefilter, "NCCL error", "error", " "):
            line = ((lit + " ") * (signatures.UNTIMED_CHARS // (len(lit) + 1) + 1))[:signatures.UNTIMED_CHARS]
            start = time.process_time()
            sig.pattern.search(line, timeout=5)
            if time.process_time() - start > 0.02:
                slow.append((sig.id, lit))
    assert not slow


def test_an_empty_log_is_an_input_error_that_says_so(tmp_path: Path) -> None:
    log = tmp_path / "slurm-7.out"
    log.write_text("")
    with pytest.raises(AnalyzeInputError, match=f"{log} is empty: nothing to analyze"):
        analyze_paths([log], workers=1)


def test_a_job_of_empty_logs_says_so_and_one_empty_stderr_among_others_is_ordinary(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    for rank in range(3):
        (job / f"9_{rank}_log.out").write_text("")
        (job / f"9_{rank}_log.err").write_text("")
    with pytest.raises(AnalyzeInputError, match="all 6 logs are empty"):
        analyze_paths([job], workers=1)
    (job / "9_1_log.err").write_text("[rank1]: RuntimeError: boom\n")
    assert not any("empty" in n for n in analyze_paths([job], workers=1).notes)


def test_an_empty_file_named_beside_others_is_named(tmp_path: Path) -> None:
    empty, full = tmp_path / "a.log", tmp_path / "b.log"
    empty.write_text("")
    full.write_text("Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nKeyError: 'x'\n")
    assert f"empty, nothing to read: {empty}" in analyze_paths([empty, full], workers=1).notes


def _mixed_tree(root: Path) -> Path:
    """Files to read in two folders, and what discovery leaves out: hidden and binary names, a symlink leaving the
    tree, a fifo, a symlinked folder inside it."""
    outside = root / "outside.log"
    outside.write_text("x\n")
    tree = root / "job"
    for folder in (tree, tree / "attempt_1"):
        folder.mkdir(parents=True)
        for r in range(7):
            (folder / f"5_{r}_log.out").write_text(f"line {r}\n")
        (folder / ".hidden").write_text("x\n")
        (folder / "model.pt").write_bytes(b"\x80\x04")
    (tree / "leaving.log").symlink_to(outside)
    (tree / "inside.log").symlink_to(tree / "5_0_log.out")
    (tree / "again").symlink_to(tree / "attempt_1")
    os.mkfifo(tree / "pipe.log")
    return tree


class _Watched:
    """A directory entry the walk met, whose stat asks are noted (by which thread); one of the watch's `failing` names
    cannot be stat-ed (EACCES), as an entry that cannot be examined."""

    def __init__(self, entry: os.DirEntry, watch: _Watch) -> None:
        self.entry, self.watch, self.name, self.path = entry, watch, entry.name, entry.path

    def is_symlink(self) -> bool:
        return self.entry.is_symlink()

    def is_dir(self, follow_symlinks: bool = True) -> bool:
        found = self.entry.is_dir(follow_symlinks=follow_symlinks)
        if found and threading.current_thread() is threading.main_thread():
            self.watch.examined(self.path)
        return found

    def stat(self, follow_symlinks: bool = True) -> os.stat_result:
        self.watch.stats.append((threading.current_thread().name, self.name))
        if self.name in self.watch.failing:
            raise PermissionError(errno.EACCES, "Permission denied")
        return self.entry.stat(follow_symlinks=follow_symlinks)


class _Watch:
    """`os.scandir` as discovery meets it, noted: which thread listed each folder and asked each entry's stat, and
    the folders found listed by the time the walk examined their entry (listed ahead); where `wait_s`, the walk waits
    that long for a folder whose parent a thread listed, the time the thread may take to list it too."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, failing: tuple[str, ...] = (), wait_s: float = 0.0) -> None:
        self.failing, self.wait_s = failing, wait_s
        self.listed: list[tuple[str, str]] = []  # (thread, folder)
        self.stats: list[tuple[str, str]] = []  # (thread, entry name)
        self.ahead: list[str] = []  # the names of the folders listed ahead
        self.changed = threading.Condition()
        real = os.scandir

        @contextlib.contextmanager
        def scandir(folder: str | os.PathLike[str]) -> Iterator[list[_Watched]]:
            with self.changed:
                self.listed.append((threading.current_thread().name, os.fspath(folder)))
                self.changed.notify_all()
            with real(folder) as entries:
                yield [_Watched(entry, self) for entry in entries]
        monkeypatch.setattr(os, "scandir", scandir)

    def by_thread(self, path: str) -> str | None:
        return next((thread for thread, folder in self.listed if folder == path), None)

    def examined(self, path: str) -> None:
        parent = self.by_thread(os.path.dirname(path))
        with self.changed:
            if self.wait_s and parent is not None and parent != threading.main_thread().name:
                self.changed.wait_for(lambda: self.by_thread(path) is not None, self.wait_s)
            if self.by_thread(path) is not None:
                self.ahead.append(os.path.basename(path))

    def asked_ahead(self) -> list[str]:
        """The names whose stats the walk's threads asked, sorted."""
        return sorted(name for thread, name in self.stats if thread.startswith("ddpslurm-stat"))


@pytest.mark.parametrize("slow", [False, True])
def test_files_stat_ed_side_by_side_where_stats_are_slow_are_found_as_one_by_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    """Where the first stats take a round trip each (NFS, Lustre), the next entries' stats are asked by threads side
    by side; what is found and what is left out, and their order, are those of a walk that stats one by one."""
    tree = _mixed_tree(tmp_path)
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", float("inf"))
    alone = discover_all([tree])
    monkeypatch.setattr(discover_mod, "TIMED_STATS", 2)
    monkeypatch.setattr(discover_mod, "STAT_AHEAD", 3)
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", -1.0 if slow else float("inf"))
    watch = _Watch(monkeypatch)
    found = discover_all([tree])
    assert [s.path for s in found.sources] == [s.path for s in alone.sources]
    assert found.skipped == alone.skipped and len(found.sources) == 14  # inside.log is 5_0_log.out, read once
    assert {Path(s.path).name for s in found.skipped} >= {"leaving.log", "pipe.log"}
    logs = [f"5_{r}_log.out" for r in range(7)]
    # the first two files' stats timed one by one; where they were slow, every later file's asked ahead (the second
    # folder's by the thread that listed it), never a symlink's, a folder's or one skipped by its name
    assert watch.asked_ahead() == (sorted([*logs[2:], "pipe.log", *logs]) if slow else [])


@pytest.mark.parametrize(("count", "seconds", "slow"), [(0, 0.0, False), (63, 1.0, False), (64, 64 * 60e-6, True),
                                                      (64, 64 * 3e-6, False), (500, 1.0, True)])
def test_stats_are_slow_where_the_first_files_took_a_round_trip_each(count: int, seconds: float, slow: bool) -> None:
    assert discover_mod.round_trips(count, seconds, timed=discover_mod.TIMED_STATS) is slow


@pytest.mark.parametrize("slow", [False, True])
def test_a_walk_times_its_first_stats_one_by_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    """The first TIMED_STATS files are stat-ed by the walk itself, timed; where they took any time at all (the
    threshold here), the threads ask the next ones', else the walk goes on alone."""
    monkeypatch.setattr(discover_mod, "TIMED_STATS", 3)
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", 0.0 if slow else float("inf"))
    for r in range(5):
        (tmp_path / f"5_{r}_log.out").write_text("x\n")
    watch = _Watch(monkeypatch)
    assert len(discover_all([tmp_path]).sources) == 5
    assert watch.asked_ahead() == (["5_3_log.out", "5_4_log.out"] if slow else [])


def test_a_stat_asked_ahead_that_fails_is_left_for_the_walk_to_report(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's stat that fails is passed over quietly: the walk asks it again, and names the file it cannot
    examine."""
    monkeypatch.setattr(discover_mod, "TIMED_STATS", 1)
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", -1.0)
    for r in range(3):
        (tmp_path / f"5_{r}_log.out").write_text("x\n")
    watch = _Watch(monkeypatch, failing=("5_2_log.out",))
    found = discover_all([tmp_path])
    assert [Path(s.path).name for s in found.sources] == ["5_0_log.out", "5_1_log.out"]
    assert [(Path(s.path).name, s.reason) for s in found.skipped] == [
        ("5_2_log.out", "cannot be examined (Permission denied)")]
    asked_by = [thread for thread, name in watch.stats if name == "5_2_log.out"]
    assert len(asked_by) == 2 and asked_by[0].startswith("ddpslurm-stat") and asked_by[1] == "MainThread"


@pytest.mark.parametrize(("stack_ahead", "held"), [(64, 8192), (1, 8192), (1, 2)])
def test_folders_listed_ahead_where_stats_are_slow_are_walked_as_one_by_one(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            stack_ahead: int, held: int) -> None:
    """torchrun --log-dir: a folder per worker. Where stats are slow, the walk's threads list the next folders of
    its stack and the subfolders of those they list, and stat their few files; the walk still examines each folder,
    and each entry, in order, however few listings may wait."""
    monkeypatch.setattr(discover_mod, "LIST_AHEAD", stack_ahead)
    monkeypatch.setattr(discover_mod, "LISTED_AHEAD", held)
    for node in range(3):
        for local in range(4):
            worker = tmp_path / f"none_{node:08d}" / "attempt_0" / str(local)
            worker.mkdir(parents=True)
            (worker / "stdout.log").write_text(f"out {node} {local}\n")
            (worker / "stderr.log").write_text(f"err {node} {local}\n")
    (tmp_path / "none_00000001" / "attempt_0" / "2" / "core.gz").write_bytes(b"\x1f\x8b")
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", float("inf"))
    alone = discover_all([tmp_path])
    monkeypatch.setattr(discover_mod, "TIMED_STATS", 2)
    monkeypatch.setattr(discover_mod, "SLOW_METADATA_SECONDS", -1.0)
    watch = _Watch(monkeypatch, wait_s=5.0 if held >= 8 else 0.0)
    found = discover_all([tmp_path])
    assert [s.path for s in found.sources] == [s.path for s in alone.sources] and len(found.sources) == 24
    assert found.skipped == alone.skipped and len(found.skipped) == 1  # the core dump, by its name
    assert [s.local_rank for s in found.sources[:4]] == [0, 0, 1, 1]
    listed_by = [thread for thread, _ in watch.listed]
    # the root, its run folders, their attempt folders and worker folders, each listed once: one by one until two
    # stats were timed (in the first worker folder: the threads start at the second), then by the threads
    assert len(listed_by) == 1 + 3 + 3 + 3 * 4 and listed_by[:5] == ["MainThread"] * 5
    assert all(name.startswith("ddpslurm-stat") for name in listed_by[5:]) or held < 8
    # a listed folder's subfolders are asked for by the thread that listed it, before the walk comes to them (the
    # walk asks only for the folders of its stack): granted while few listings wait
    assert {"attempt_0", "0", "3"} <= set(watch.ahead) or held < 8
