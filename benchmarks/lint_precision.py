#!/usr/bin/env python3
"""Precision of `ddpslurm lint` on real public DDP training scripts: every finding, its verdict, a table per rule.

The scripts are named in benchmarks/lint_precision.toml (`[[script]]`: repo, path, commit) and fetched into a
cache outside git (default .bench/lint/, git-ignored): from `--mirror DIR` (bare git folders named
`owner+name` or `owner+name/repo`), else cloned from GitHub. Only the repository's *.py files at that commit
are kept; no code of theirs enters this repository. The verdicts (`[[judgement]]`: repo, file, line, rule,
verdict, reason) were made by reading the code; a finding without one is printed as `?`.

    python3 benchmarks/lint_precision.py --mirror /path/to/mirrors        # findings + precision table
    python3 benchmarks/lint_precision.py --folder ~/src/my_scripts          # ad hoc: every DDP script under a folder
    python3 benchmarks/lint_precision.py --strict                           # exit 1 on unjudged or stale verdicts
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from ddpslurm.lint.engine import lint_script  # noqa: E402
from ddpslurm.lint.model import INFO, Finding  # noqa: E402
from ddpslurm.lint.rules import RULES  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DEFAULT_TOML = Path(__file__).with_suffix(".toml")
DEFAULT_CACHE = REPO_ROOT / ".bench" / "lint"
_DDP_WORDS = ("DistributedDataParallel", "init_process_group")


def _git_dir(repo: str, mirror: Path | None, cache: Path) -> Path:
    """A git folder holding `repo`'s history: the mirror's copy, or a blobless clone in the cache."""
    folder = repo.replace("/", "+")
    if mirror is not None:
        for candidate in (mirror / folder / "repo", mirror / folder):
            if (candidate / ".git").is_dir():
                return candidate / ".git"
            if (candidate / "HEAD").is_file():
                return candidate
    clone = cache / "git" / folder
    if not (clone / "HEAD").is_file():
        clone.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "clone", "--bare", "--filter=blob:none", "--quiet",
                        f"https://github.com/{repo}.git", str(clone)], check=True)
    return clone


def materialize(repo: str, commit: str, mirror: Path | None, cache: Path) -> Path:
    """The repository's *.py files at `commit`, under cache/owner+name@commit (made once). Blobs are read one
    by one, so a snapshot that lacks its large data files still gives its sources."""
    target = cache / f"{repo.replace('/', '+')}@{commit[:12]}"
    done = target / ".complete"
    if done.is_file():
        return target
    git = _git_dir(repo, mirror, cache)
    listing = subprocess.run(["git", "--git-dir", str(git), "ls-tree", "-r", "-z", commit],
                             check=True, capture_output=True).stdout.decode("utf-8", "surrogateescape")
    wanted = []
    for entry in filter(None, listing.split("\0")):
        meta, _, name = entry.partition("\t")
        mode, kind, sha = meta.split()
        parts = Path(name).parts
        if kind == "blob" and mode != "120000" and name.endswith(".py") and ".." not in parts and parts[0] != "/":
            wanted.append((sha, name))
    batch = subprocess.run(["git", "--git-dir", str(git), "cat-file", "--batch"], check=True, capture_output=True,
                           input="".join(f"{sha}\n" for sha, _ in wanted).encode()).stdout
    offset = 0
    for _, name in wanted:
        header_end = batch.index(b"\n", offset)
        header = batch[offset:header_end].split()
        offset = header_end + 1
        if len(header) < 3 or header[1] == b"missing":
            continue
        size = int(header[2])
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(batch[offset:offset + size])
        offset += size + 1
    target.mkdir(parents=True, exist_ok=True)
    done.write_text(commit + "\n")
    return target


def _key(repo: str, file: str, line: int, rule: str) -> tuple[str, str, int, str]:
    return (repo, file, int(line), rule)


def run_corpus(data: dict, mirror: Path | None, cache: Path, only: str | None) -> tuple[list, set]:
    """Lint every script of the TOML; returns rows (repo, file, finding, verdict, reason) and the keys seen."""
    verdicts = {_key(j["repo"], j["file"], j["line"], j["rule"]): (j["verdict"], j.get("reason", ""))
                for j in data.get("judgement", [])}
    rows, seen = [], set()
    for script in data.get("script", []):
        repo, path, commit = script["repo"], script["path"], script["commit"]
        if only and only not in repo:
            continue
        tree = materialize(repo, commit, mirror, cache)
        roots = [tree / r for r in script.get("roots", [])]
        report = lint_script(tree / path, roots=roots)
        print(f"{repo}:{path} @ {commit[:12]}: {len(report.findings)} findings, {len(report.files)} files read")
        for finding in report.findings:
            file = finding.path.relative_to(tree).as_posix()
            key = _key(repo, file, finding.line, finding.rule)
            if key in seen:
                continue  # a module two scripts of the repository import
            seen.add(key)
            verdict, reason = verdicts.get(key, ("?", ""))
            rows.append((repo, file, finding, verdict, reason))
            print(f"  {file}:{finding.line}:{finding.column} {finding.rule} {finding.level:<5} {verdict:<5} "
                  f"{finding.message}" + (f"\n      -> {reason}" if reason else ""))
    stale = set(verdicts) - seen
    return rows, stale


def table(rows: Iterable[tuple[str, str, Finding, str, str]]) -> str:
    """Per rule: findings, true, false, unjudged, precision (true / judged)."""
    counts: dict[str, Counter] = {rule.id: Counter() for rule in RULES}
    for _, _, finding, verdict, _ in rows:
        counts[finding.rule][verdict] += 1
    lines = [f"{'rule':<8}{'findings':>9}{'true':>6}{'false':>7}{'?':>4}{'precision':>11}"]
    total: Counter = Counter()
    above_info: Counter = Counter()
    levels = {rule.id: rule.level for rule in RULES}
    for rule, counted in counts.items():
        total.update(counted)
        if levels[rule] != INFO:
            above_info.update(counted)
        lines.append(_row(rule, counted))
    lines.append(_row("all", total))
    lines.append(_row("no info", above_info) + "   (without the info-level rules)")
    return "\n".join(lines)


def _row(name: str, counted: Counter) -> str:
    judged = counted["true"] + counted["false"]
    precision = f"{counted['true'] / judged:.0%}" if judged else "-"
    found = sum(counted.values())
    return f"{name:<8}{found:>9}{counted['true']:>6}{counted['false']:>7}{counted['?']:>4}{precision:>11}"


def lint_folder(folder: Path) -> None:
    """Every .py file under `folder` that looks like a DDP script, linted as an entry script."""
    for path in sorted(folder.rglob("*.py")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        if not any(word in text for word in _DDP_WORDS):
            continue
        report = lint_script(path)
        for finding in report.findings:
            print(f"{finding.path}:{finding.line}:{finding.column} {finding.rule} {finding.level} {finding.message}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--toml", type=Path, default=DEFAULT_TOML)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the scripts are fetched to")
    parser.add_argument("--mirror", type=Path, default=None, help="folder of bare git mirrors (owner+name)")
    parser.add_argument("--folder", type=Path, default=None, help="lint the DDP scripts under this folder instead")
    parser.add_argument("--only", default=None, help="only repositories whose name holds this text")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a finding is unjudged or a verdict stale")
    args = parser.parse_args(argv)
    if args.folder is not None:
        lint_folder(args.folder)
        return 0
    data = tomllib.loads(args.toml.read_text())
    rows, stale = run_corpus(data, args.mirror, args.cache, args.only)
    scripts = len([s for s in data.get("script", []) if not args.only or args.only in s["repo"]])
    print(f"\n{scripts} scripts from {len({s['repo'] for s in data.get('script', [])})} repositories")
    print(table(rows))
    for key in sorted(stale) if not args.only else ():
        print(f"stale verdict (no such finding now): {key}")
    unjudged = sum(1 for row in rows if row[3] == "?")
    return 1 if args.strict and (unjudged or (stale and not args.only)) else 0


if __name__ == "__main__":
    sys.exit(main())
