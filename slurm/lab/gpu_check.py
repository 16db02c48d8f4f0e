"""The failure lab on one GPU machine, without Slurm: real CUDA and NCCL failures through `ddpslurm submit --local`.

The local cluster of `slurm/` has no GPU, so its lab (`lab.py`) only fails gloo jobs. This runner takes the
failures that need a GPU to a machine that has one (a workstation, a GPU node, a cloud VM; one GPU is enough) and
checks the launcher's NCCL path and the analyzer's reading of what the real libraries print there:

    python3 slurm/lab/gpu_check.py --out /tmp/gpu-lab           # every scenario
    python3 slurm/lab/gpu_check.py --list
    python3 slurm/lab/gpu_check.py --out /tmp/gpu-lab cuda_oom_rank1_gloo

Each scenario is one `ddpslurm submit --local --wait` of `examples/train.py` or `slurm/lab/ddp_fault.py` (submitit's
LocalExecutor, ranks as local processes, `--gpus-per-node` GPUs visible to each), then `ddpslurm analyze --json` on
its job folder. The expected answer comes from the injection, never from analyze. Every job folder is kept under
`OUT/cases/gpu-lab-<scenario>/` as an analyzer case (logs and records, no pickles or checkpoints) with a `label.json`
naming the torch, CUDA, NCCL and GPU it ran on. Prints one line per scenario and exits 1 when any answer is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAULT_SCRIPT = REPO / "slurm" / "lab" / "ddp_fault.py"
TRAIN_SCRIPT = REPO / "examples" / "train.py"
ON_GPU = ["--device", "cuda"]
KEPT_OUT = ("*.pkl", "checkpoints")


@dataclass(frozen=True)
class Scenario:
    """One GPU failure: how it is launched and what the answer must be."""

    name: str
    cause: str | None  # None: a healthy job, every rank must be judged ok
    culprit_rank: int | None
    tasks: int
    gpus: int
    script: Path
    script_args: tuple[str, ...]
    description: str
    host_named: bool = True  # the label names this machine's host (False: a job-wide failure names none)
    time: str = "3"  # --time: submitit's local executor ends a job that outlives it


SCENARIOS = (
    Scenario("healthy_nccl", None, None, 1, 1, TRAIN_SCRIPT, ("--epochs", "1", "--steps-per-epoch", "10"),
             "examples/train.py on one GPU: NCCL process group, DDP, checkpoints; it completes, so analyze must "
             "judge every rank ok whatever NCCL's INFO lines say."),
    Scenario("duplicate_gpu_nccl", "duplicate_gpu", None, 2, 1, FAULT_SCRIPT,
             ("--backend", "nccl", *ON_GPU, "--timeout", "60"),
             "Two ranks on the one GPU the node shows (cuda:LOCAL_RANK modulo 1): NCCL's communicator init finds "
             "both on the same bus id and refuses with ncclInvalidUsage; no rank is at fault, the node's GPU "
             "binding is."),
    Scenario("more_tasks_than_gpus", "rank_config_mismatch", 1, 2, 1, TRAIN_SCRIPT,
             ("--epochs", "1", "--steps-per-epoch", "10", "--timeout", "30"),
             "Two tasks on a node with one visible GPU: examples/train.py picks cuda:LOCAL_RANK, so rank 1 asks "
             "for cuda:1 and dies of 'invalid device ordinal' before init; rank 0 waits for it in the "
             "rendezvous until its timeout."),
    Scenario("cuda_oom_rank1_gloo", "cuda_oom", 1, 4, 1, FAULT_SCRIPT,
             ("--backend", "gloo", *ON_GPU, "--fault", "cuda-oom", "--fault-rank", "1", "--fault-step", "3",
              "--timeout", "25"),
             "Four ranks share the GPU (gloo on CUDA tensors); at step 3 rank 1 allocates 1 GiB blocks until the "
             "caching allocator raises torch.OutOfMemoryError; the others time out in the metric all_reduce."),
    Scenario("device_assert_rank2_gloo", "user_code_exception", 2, 4, 1, FAULT_SCRIPT,
             ("--backend", "gloo", *ON_GPU, "--fault", "device-assert", "--fault-rank", "2", "--fault-step", "3",
              "--timeout", "25"),
             "Four ranks share the GPU (gloo on CUDA tensors); at step 3 rank 2 indexes out of bounds inside a "
             "kernel ('device-side assert triggered', a bug in the script, not the GPU); the others time out."),
    Scenario("cuda_oom_nccl", "cuda_oom", 0, 1, 1, FAULT_SCRIPT,
             ("--backend", "nccl", *ON_GPU, "--fault", "cuda-oom", "--fault-rank", "0", "--fault-step", "3",
              "--timeout", "60"),
             "One rank on NCCL (its INFO lines, the NCCL communicator's own allocations) runs out of GPU memory at "
             "step 3."),
    Scenario("gpu_hang_rank2_gloo", "collective_timeout", 2, 4, 1, FAULT_SCRIPT,
             ("--backend", "gloo", *ON_GPU, "--fault", "gpu-hang", "--fault-arg", "60", "--fault-rank", "2",
              "--fault-step", "3", "--timeout", "25"),
             "Four ranks share the GPU (gloo on CUDA tensors); at step 3 rank 2 queues a kernel that spins for about "
             "60 s, so its step's collectives wait behind it (a stuck kernel); the others' gloo collectives time out "
             "after 25 s. Rank 2 comes back after the others are gone."),
    Scenario("nccl_watchdog_single", "collective_timeout", 0, 1, 1, FAULT_SCRIPT,
             ("--backend", "nccl", *ON_GPU, "--fault", "gpu-hang", "--fault-arg", "300", "--fault-rank", "0",
              "--fault-step", "3", "--timeout", "20"),
             "One rank on NCCL queues a kernel that spins for minutes before DDP's gradient all_reduce: the NCCL "
             "work never completes and ProcessGroupNCCL's watchdog times it out after 20 s and tears the process "
             "down (torch's own watchdog messages of this version)."),
)


def versions() -> dict[str, str]:
    """torch, CUDA and NCCL (`ddpslurm doctor`'s probe) and the GPU's name, asked from a child process (this
    runner never imports torch)."""
    probe = ("import json, torch; from ddpslurm.doctor.probe import software; found, gpus = software(); "
             "found.update(gpus=gpus, gpu=torch.cuda.get_device_name(0) if gpus else None); "
             "print(json.dumps(found))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env=with_this_checkout())
    if done.returncode:
        raise SystemExit(f"gpu_check: torch could not be asked for its versions: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)


def with_this_checkout() -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH (its ddpslurm, not an installed one)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}


def ddpslurm(*args: str) -> subprocess.CompletedProcess:
    """This checkout's `ddpslurm` CLI in a child process (output captured; at most 10 minutes)."""
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], capture_output=True, text=True,
                          timeout=600, env=with_this_checkout())


def submit(scenario: Scenario, jobs: Path) -> dict:
    """Run the scenario's job to its end; the submit command's JSON result (job folder, state)."""
    done = ddpslurm("submit", str(scenario.script), "--local", "--wait", "--json", "--nodes", "1",
                    "--tasks-per-node", str(scenario.tasks), "--gpus-per-node", str(scenario.gpus),
                    "--time", scenario.time,
                    "--folder", str(jobs), "--", *scenario.script_args)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"gpu_check: submit of {scenario.name} printed no result: {done.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


def analyze(job_dir: Path) -> dict:
    """`ddpslurm analyze --json` of the job folder."""
    done = ddpslurm("analyze", "--json", str(job_dir))
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"gpu_check: analyze of {job_dir} gave no JSON: {done.stderr.strip()[-400:]}") from None


def expected(scenario: Scenario, host: str) -> dict:
    """The label: cause, rank and host from the injection."""
    return {"cause": scenario.cause, "first_failing_rank": scenario.culprit_rank,
            "first_failing_host": host if scenario.cause and scenario.host_named else None}


def judge(scenario: Scenario, want: dict, got: dict) -> list[str]:
    """What analyze got wrong (empty: right). A healthy job must have every rank judged ok."""
    if scenario.cause is None:
        failing = [r["rank"] for r in got.get("ranks", []) if r.get("role") != "ok"]
        return [f"ranks {failing} judged failing in a job that completed"] if failing else []
    return [f"{key}: expected {want[key]!r}, got {got.get(key)!r}" for key in want if got.get(key) != want[key]]


def keep_case(scenario: Scenario, job_dir: Path, cases: Path, want: dict, found: dict, launch: dict) -> Path:
    """Copy the job folder (no pickles, no checkpoints) into an analyzer case with its label."""
    case = cases / f"gpu-lab-{scenario.name.replace('_', '-')}"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(job_dir, case, ignore=shutil.ignore_patterns(*KEPT_OUT))
    gpu = f"{found['gpu']} (torch {found['torch']}, CUDA {found['cuda']}, NCCL {found['nccl']})"
    label = {**want, "source": f"lab: real failure on one {gpu} through ddpslurm submit --local "
                               f"(slurm/lab/gpu_check.py scenario {scenario.name})",
             "description": scenario.description, "launch": launch, "versions": found}
    if scenario.cause is None:
        label["healthy"] = True
    (case / "label.json").write_text(json.dumps(label, indent=2) + "\n", encoding="utf-8")
    return case


def run(selected: Sequence[Scenario], out: Path) -> int:
    found = versions()
    if not found.get("gpus"):
        raise SystemExit("gpu_check: torch sees no GPU here; run it on a machine with one (CUDA_VISIBLE_DEVICES?)")
    print(f"# {found['gpu']} x{found['gpus']}, torch {found['torch']}, CUDA {found['cuda']}, NCCL {found['nccl']}")
    host, wrong = socket.gethostname(), 0
    for scenario in selected:
        result = submit(scenario, out / "jobs")
        job_dir = Path(result["folder"])
        got, want = analyze(job_dir), expected(scenario, host)
        problems = judge(scenario, want, got)
        wrong += bool(problems)
        case = keep_case(scenario, job_dir, out / "cases", want, found,
                         {"tasks": scenario.tasks, "gpus_per_node": scenario.gpus, "state": result.get("state"),
                          "script": scenario.script.name, "script_args": list(scenario.script_args)})
        verdict = "RIGHT" if not problems else "WRONG: " + "; ".join(problems)
        print(f"{scenario.name:28} job {result.get('state', '?'):10} analyze {got.get('cause')}, rank "
              f"{got.get('first_failing_rank')}, host {got.get('first_failing_host')}: {verdict}  ({case})",
              flush=True)
    return 1 if wrong else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenarios", nargs="*", help="scenario names (default: all)")
    parser.add_argument("--out", type=Path, default=Path("gpu-lab"), help="jobs/ and cases/ go here")
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    args = parser.parse_args(argv)
    names = {s.name: s for s in SCENARIOS}
    unknown = [name for name in args.scenarios if name not in names]
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}; --list shows them")
    if args.list:
        for scenario in SCENARIOS:
            print(f"{scenario.name:28} {scenario.cause or 'healthy'}: {scenario.description}")
        return 0
    return run([names[n] for n in args.scenarios] or list(SCENARIOS), args.out.resolve())


if __name__ == "__main__":
    sys.exit(main())
