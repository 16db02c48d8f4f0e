"""The long fuzz run of issue 16, and the issue's reproducers measured one by one.

    python benchmarks/fuzz_long.py [--examples 2000] [--only reproducers|properties|mutations]

1. reproducers: every one-command reproducer of issue 16 items 1-5 (and 13), run through the CLI in a fresh
   process capped at MEMORY_LIMIT address space; prints its exit code, wall time, peak RSS (os.wait4) and
   whether it behaved (exit code, answer, no injected line). The issue's target: < 200 MB and seconds, the
   right answer where the data allows.
2. properties: tests/unit/test_fuzz.py with --examples random (not derandomized) examples per property.
3. mutations: tests/corpus/test_mutations.py on every case with every mutation (CI runs 16 of them).

Prints figures only; the pass/fail gate is the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BARRIER = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: k "
           "(world_size=99999999999, worker_count=1, timeout=0:30:00)")
OOM = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
EXIT = {"rank": 1, "host": "n1", "pid": 7, "unix": 1763000000.5, "status": "error",
        "exception": {"type": "ValueError", "message": "bad batch"}}


def _log(folder: Path, *lines: str) -> list[str]:
    (folder / "slurm-1.out").write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    return ["analyze", "--json", str(folder)]


def _record(folder: Path, text: str, name: str = "rank_1.exit.json") -> list[str]:
    (folder / name).write_text(text, encoding="utf-8", errors="surrogatepass")
    (folder / "rank_1.log").write_text("step 1\n")
    return ["analyze", "--json", str(folder)]


def _undecodable(folder: Path) -> list[str]:
    with open(os.path.join(os.fsencode(folder), b"slurm-1\xff.out"), "w") as log:
        log.write(OOM + "\n")
    return ["analyze", "--json", str(folder)]


def _submit(folder: Path, *flags: str) -> list[str]:
    (folder / "train.py").write_text("print(1)\n")
    return ["submit", str(folder / "train.py"), *flags, "--dry-run"]


#: name -> (build the input in a folder and return the CLI arguments, expected exit code, expected cause)
REPRODUCERS: dict[str, tuple[Callable[[Path], list[str]], int, str | None]] = {
    "1 store barrier world_size=1e11": (lambda d: _log(d, BARRIER), 0, None),
    "1 1/99999999999 clients joined": (lambda d: _log(d, "torch.distributed.DistStoreError: Timed out after 901 "
                                                      "seconds waiting for clients. 1/99999999999 clients joined."),
                                       0, None),
    "1 NCCL nranks 1e11": (lambda d: _log(d, "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 99999999999 cudaDev 0 "
                                             "busId 1000 - Init COMPLETE", OOM), 0, "cuda_oom"),
    "1 [rank99999999999]: prefix": (lambda d: _log(d, "[rank99999999999]: RuntimeError: boom"), 0, None),
    "1 start record world_size 1e11": (lambda d: _record(d, '{"rank": 0, "world_size": 1e11, "unix": 1763000000}',
                                                         "rank_0.start.json"), 0, None),
    "1 srun task list, 400 big ranges": (lambda d: _log(d, "srun: error: n1: tasks " + ",".join(
        f"{i * 10**9}-{i * 10**9 + 10**8}" for i in range(400)) + ": Exited with exit code 1"), 0, None),
    "2 --partition with a newline": (lambda d: _submit(d, "--partition", "gpu\ntouch /tmp/PWNED #"), 2, None),
    "2 --mem 16G\\n": (lambda d: _submit(d, "--mem", "16G\n"), 2, None),
    "2 --mem with Arabic-Indic digits": (lambda d: _submit(d, "--mem", "\u0666\u0664G"), 2, None),
    "3 rank -5 (rank 1 by its file name)": (lambda d: _record(d, json.dumps({**EXIT, "rank": -5})), 0,
                                             "user_code_exception@1"),
    "3 unix 1e300": (lambda d: _record(d, json.dumps({**EXIT, "unix": 1e300})), 0, "user_code_exception"),
    "3 unix NaN": (lambda d: _record(d, json.dumps({**EXIT, "unix": float("nan")})), 0, "user_code_exception"),
    "3 unix -Infinity": (lambda d: _record(d, json.dumps({**EXIT, "unix": float("-inf")})), 0, "user_code_exception"),
    "3 JSON nested 100,000 deep": (lambda d: _record(d, "[" * 100_000 + "]" * 100_000), 0, None),
    "3 lone surrogate in a message": (lambda d: _record(d, json.dumps(
        {**EXIT, "exception": {"type": "ValueError", "message": "x\ud800y"}})), 0, "user_code_exception"),
    "3 3 MB exception message": (lambda d: _record(d, json.dumps(
        {**EXIT, "exception": {"type": "ValueError", "message": "bad value " * 300_000}})), 0, "user_code_exception"),
    "4 non-UTF-8 file name": (_undecodable, 0, "cuda_oom"),
    "5 16 KB 'NCCL error' line before an OOM": (lambda d: _log(d, "NCCL error " * 1500, OOM), 0, "cuda_oom"),
    "13 analyze --jobs 1000000": (lambda d: ["analyze", "--jobs", "1000000", str(d)], 2, None),
}


#: RLIMIT_AS of each reproducer: the code before issue 16 grew past 20 GB on item 1 (measured); a blow-up
#: must end in MemoryError, not take the machine
MEMORY_LIMIT = 2 << 30


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_reproducer(name: str, build: Callable[[Path], list[str]], code: int, cause: str | None) -> str:
    """One reproducer in a fresh process: exit code, wall seconds, peak RSS in MB, and the verdict."""
    with tempfile.TemporaryDirectory() as tmp:
        args = build(Path(tmp))
        env = dict(os.environ, PYTHONPATH=str(REPO), LC_ALL="C.UTF-8")
        start = time.perf_counter()
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen([sys.executable, "-m", "ddpslurm.cli", *args], stdout=out,
                                    stderr=subprocess.DEVNULL, env=env, preexec_fn=_limit_memory)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - start
            out.seek(0)
            stdout = out.read()
    verdict = _verdict(proc.returncode, stdout, code, cause)
    return f"{name:42} exit {proc.returncode:>3}  {wall:6.2f} s  {usage.ru_maxrss / 1024:7.1f} MB  {verdict}"


def _verdict(returncode: int, stdout: bytes, code: int, cause: str | None) -> str:
    if returncode != code:
        return f"WRONG (expected exit {code})"
    if b"touch" in stdout or b"PWNED" in stdout:
        return "WRONG (injected line)"
    if code == 0 and stdout.lstrip().startswith(b"{"):
        try:
            found = json.loads(stdout.decode("utf-8"))["cause"]
        except (UnicodeDecodeError, ValueError) as bad:
            return f"WRONG (output: {type(bad).__name__})"
        report = json.loads(stdout.decode("utf-8"))
        found = f"{found}@{report['first_failing_rank']}" if cause and "@" in cause else found
        if cause is not None and found != cause:
            return f"WRONG (cause {found}, expected {cause})"
        return f"ok ({found})"
    return "ok"


def run_pytest(title: str, path: str, env: dict[str, str]) -> None:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider",
                           "-W", "ignore::DeprecationWarning"], cwd=REPO, env=dict(os.environ, **env),
                          capture_output=True, text=True)
    tail = [ln for ln in done.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
    failed = [ln for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
    print(f"{title}: {tail[0]} ({time.perf_counter() - start:.0f} s wall)")
    for line in failed[:20]:
        print(f"  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="random examples per property")
    parser.add_argument("--only", choices=["reproducers", "properties", "mutations"], default=None)
    args = parser.parse_args()
    if args.only in (None, "reproducers"):
        print("issue 16 reproducers (exit, wall, peak RSS, verdict):")
        for name, (build, code, cause) in REPRODUCERS.items():
            print("  " + run_reproducer(name, build, code, cause), flush=True)
    if args.only in (None, "properties"):
        run_pytest(f"properties, {args.examples} random examples each", "tests/unit/test_fuzz.py",
                   {"DDPSLURM_FUZZ_EXAMPLES": str(args.examples), "DDPSLURM_FUZZ_RANDOM": "1"})
    if args.only in (None, "mutations"):
        run_pytest("mutation corpus, every case x every mutation", "tests/corpus/test_mutations.py",
                   {"DDPSLURM_FUZZ_CASES": "all"})


if __name__ == "__main__":
    main()
