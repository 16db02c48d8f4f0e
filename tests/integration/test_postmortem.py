"""The post-mortem writes itself, on the real local cluster (slurmdbd, EpilogSlurmctld as `slurm/cluster up`
configures it): a failed `ddpslurm submit` job gets diagnosis.json, `status` names the culprit, sacct holds the
one-line diagnosis; a plain sbatch job gets it through the epilog hook; `triage --sacct` aggregates them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddpslurm import jobfolder
from tests.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
FAULT = REPO / "tests" / "integration" / "scripts" / "fault.py"
#: What torch 2.1 prints when a GPU's memory has a double-bit error (analyzer/cases/gpu-hardware-uncorrectable-ecc-*).
ECC_LINES = ["Traceback (most recent call last):", '  File "/home/u/train.py", line 233, in step',
             "    loss.backward()", "RuntimeError: CUDA error: uncorrectable ECC error encountered",
             "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
             "might be incorrect."]
#: What torch 2.x prints when an allocation does not fit (the caching allocator's message).
OOM_LINES = ["Traceback (most recent call last):", '  File "/home/u/train.py", line 40, in <module>',
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
             "79.15 GiB of which 1.06 GiB is free. Of the allocated memory 75.20 GiB is allocated by PyTorch."]


def ddpslurm(cluster: SlurmCluster, *args: str, cwd: Path | None = None, timeout: float = 300
             ) -> subprocess.CompletedProcess:
    env = dict(cluster.env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "ddpslurm.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd) if cwd else None, check=False)


def accounting(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    out = cluster.run(["sacct", "-X", "-n", "-P", "--delimiter=\x1f", "-j", job_id,
                       "-o", "JobID,State,DerivedExitCode,AdminComment,Comment"]).stdout
    rows = [line.split("\x1f", 4) for line in out.splitlines() if line.count("\x1f") >= 4]
    return dict(zip(("JobID", "State", "DerivedExitCode", "AdminComment", "Comment"), rows[-1], strict=True)) \
        if rows else {}


def wait_for_comment(cluster: SlurmCluster, job_id: str, limit_s: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + limit_s
    while True:
        found = accounting(cluster, job_id)
        if "ddpslurm:" in found.get("Comment", "") or time.monotonic() > deadline:
            return found
        time.sleep(1)


def wait_ended(cluster: SlurmCluster, job_ids: list[str], limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while cluster.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i"], check=False).stdout.strip():
        assert time.monotonic() < deadline, f"jobs {job_ids} still queued after {limit_s}s"
        time.sleep(1)


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    conf = Path(slurm_cluster.env["SLURM_CONF"]).read_text()
    if "EpilogSlurmctld=" not in conf or "AccountingStoreFlags=job_comment" not in conf:
        pytest.fail(f"cluster {slurm_cluster.name} was brought up before slurm/cluster configured the epilog: "
                    f"`slurm/cluster --name {slurm_cluster.name} down` and up again")
    return slurm_cluster


def plain_job(cluster: SlurmCluster, folder: Path, lines: list[str], node: str, comment: str = "") -> str:
    script = folder / f"job-{len(list(folder.glob('job-*')))}.sh"
    body = "\n".join(lines)
    script.write_text(f"#!/bin/bash\ncat >&2 <<'EOF'\n{body}\nEOF\nexit 1\n")
    extra = [f"--comment={comment}"] if comment else []
    done = cluster.run(["sbatch", "--parsable", "-N1", "-n1", "-c1", f"-w{node}", f"--output={folder}/slurm-%j.out",
                        *extra, str(script)])
    return done.stdout.strip().split(";")[0]


def test_a_failed_ddpslurm_job_diagnoses_itself(cluster: SlurmCluster, tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    done = ddpslurm(cluster, "submit", str(FAULT), "--nodes", "2", "--tasks-per-node", "1", "--folder", str(root),
                    "--time", "5", "--wait", "--json", "--lint", "off", "--", "--mode", "raise", "--rank", "1",
                    "--at", "2", cwd=tmp_path)
    assert done.returncode != 0, done.stderr
    job_id = json.loads(done.stdout.splitlines()[-1])["job_id"]
    folder = root / f"job_{job_id}"
    diagnosis = json.loads((folder / "diagnosis.json").read_text())
    host = jobfolder.read_rank_records(folder / "attempt_0", "start")[1]["host"]  # node files or rank files
    assert (diagnosis["cause"], diagnosis["first_failing_rank"], diagnosis["first_failing_host"]) == (
        "user_code_exception", 1, host)
    assert "RuntimeError" in (folder / "diagnosis.md").read_text()
    shown = ddpslurm(cluster, "status", job_id, cwd=tmp_path)
    assert f"diagnosis: user_code_exception  culprit rank 1 on {host}" in shown.stdout, shown.stdout
    record = wait_for_comment(cluster, job_id)
    line = f"ddpslurm: cause=user_code_exception rank=1 node={host} confidence={diagnosis['confidence']}"
    assert record["State"] == "FAILED" and record["Comment"].startswith(line), record
    assert record["Comment"].endswith(f"where={folder}") and record["AdminComment"] == record["Comment"]
    # without the folder at hand, `status` reads it from the accounting record
    elsewhere = ddpslurm(cluster, "status", job_id, "--json", cwd=REPO / "slurm")
    assert json.loads(elsewhere.stdout)["diagnosis"]["rank"] == 1


def test_no_analyze_leaves_no_diagnosis(cluster: SlurmCluster, tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    done = ddpslurm(cluster, "submit", str(FAULT), "--nodes", "1", "--tasks-per-node", "2", "--folder", str(root),
                    "--time", "5", "--wait", "--json", "--lint", "off", "--no-analyze", "--", "--mode", "exit",
                    cwd=tmp_path)
    job_id = json.loads(done.stdout.splitlines()[-1])["job_id"]
    folder = root / f"job_{job_id}"
    assert "--no-analyze" in (folder / f"{job_id}_submission.sh").read_text()
    assert not (folder / "diagnosis.json").exists()
    assert "post-mortem" not in (folder / f"{job_id}_0_log.err").read_text()


def test_a_plain_sbatch_job_gets_its_diagnosis_from_the_epilog(cluster: SlurmCluster, tmp_path: Path) -> None:
    node = f"{cluster.name}-n02"
    job_id = plain_job(cluster, tmp_path, ECC_LINES, node, comment="my sweep 7")
    wait_ended(cluster, [job_id])
    ended = time.monotonic()
    record = wait_for_comment(cluster, job_id, limit_s=60)
    assert time.monotonic() - ended < 60
    assert record["Comment"].startswith("my sweep 7; ddpslurm: cause=gpu_hardware "), record  # the user's kept
    assert f"node={node} " in record["Comment"] and record["Comment"].endswith(f"where={tmp_path}/slurm-{job_id}.out")
    assert record["AdminComment"].startswith("ddpslurm: cause=gpu_hardware")
    log = Path(cluster.env["DDPSLURM_CLUSTER_LOGS"]) / "ddpslurm-epilog.log"
    entries = [json.loads(line) for line in log.read_text().splitlines() if f'"{job_id}"' in line]
    assert [e["outcome"] for e in entries] == ["detached", "diagnosed"], entries


def test_triage_sacct_lists_causes_and_the_node_to_drain(cluster: SlurmCluster, tmp_path: Path) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    bad, others = f"{cluster.name}-n03", [f"{cluster.name}-n01", f"{cluster.name}-n02"]
    ids = [plain_job(cluster, tmp_path, ECC_LINES, bad) for _ in range(4)]
    ids += [plain_job(cluster, tmp_path, OOM_LINES, others[i % 2]) for i in range(6)]
    ids += [plain_job(cluster, tmp_path, ["Segmentation fault (core dumped)"], others[0])]
    wait_ended(cluster, ids)
    for job_id in ids[:10]:
        assert "ddpslurm:" in wait_for_comment(cluster, job_id)["Comment"], job_id
    done = ddpslurm(cluster, "triage", "--sacct", "--since", since, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    mine = {row["job_id"]: row for row in result["jobs"] if row["job_id"] in ids}
    assert {mine[j]["cause"] for j in ids[:4]} == {"gpu_hardware"} and {mine[j]["cause"] for j in ids[4:10]} == {
        "cuda_oom"}
    assert result["by_cause"]["gpu_hardware"] >= 4 and result["by_cause"]["cuda_oom"] >= 6
    # n01 ran only jobs of causes that do not point at a node (n02 may hold another test's ECC job)
    assert bad in result["drain"] and others[0] not in result["drain"]
    text = ddpslurm(cluster, "triage", "--sacct", "--since", since).stdout
    drain_line = next(line for line in text.splitlines() if line.startswith("suggested drain list: "))
    assert bad in drain_line.split() and "from slurmdbd" in text


def test_the_epilog_reads_an_unprivileged_jobs_output_as_its_user(cluster: SlurmCluster, tmp_path: Path) -> None:
    shared = Path("/tmp") / f"ddpslurm-pm-{cluster.name}-{time.time_ns()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    try:
        script = shared / "job.sh"
        script.write_text("#!/bin/bash\ncat >&2 <<'EOF'\n" + "\n".join(OOM_LINES) + "\nEOF\nexit 1\n")
        script.chmod(0o755)
        done = cluster.run(["sbatch", "--parsable", "--uid=nobody", "--gid=nogroup", "-N1", "-n1", "-c1",
                            f"-D{shared}", f"--output={shared}/slurm-%j.out", str(script)])
        job_id = done.stdout.strip().split(";")[0]
        wait_ended(cluster, [job_id])
        record = wait_for_comment(cluster, job_id)
        assert record["Comment"].startswith("ddpslurm: cause=cuda_oom "), record
        assert (shared / f"slurm-{job_id}.out").stat().st_uid != 0  # the job's own file, read as its user
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def mailbox(cluster: SlurmCluster, recipient: str, needle: str, limit_s: float = 110) -> str:
    """The local spool's messages to `recipient` (slurm/cluster's MailProg), once one holds `needle`."""
    conf = Path(cluster.env["SLURM_CONF"]).read_text()
    if "MailProg=" not in conf:
        pytest.fail(f"cluster {cluster.name} was brought up before slurm/cluster configured MailProg: "
                    f"`slurm/cluster --name {cluster.name} down` and up again")
    box = Path(cluster.env["DDPSLURM_CLUSTER_LOGS"]) / "mail" / recipient
    deadline = time.monotonic() + limit_s
    while True:
        text = box.read_text(errors="replace") if box.is_file() else ""
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(1)


def test_a_plain_jobs_fail_mail_carries_the_epilogs_diagnosis(cluster: SlurmCluster, tmp_path: Path) -> None:
    """slurmctld mails at the job's end, while the epilog is still analyzing: the mail waits for its line."""
    node = f"{cluster.name}-n01"
    recipient = f"plain{time.time_ns() % 10**9}"
    script = tmp_path / "oom.sh"
    script.write_text("#!/bin/bash\ncat >&2 <<'EOF'\n" + "\n".join(OOM_LINES) + "\nEOF\nexit 1\n")
    job_id = cluster.run(["sbatch", "--parsable", "-N1", "-n1", "-c1", f"-w{node}", "--mail-type=FAIL",
                          f"--mail-user={recipient}", f"--output={tmp_path}/slurm-%j.out", str(script)]
                         ).stdout.strip().split(";")[0]
    wait_ended(cluster, [job_id])
    text = mailbox(cluster, recipient, "ddpslurm diagnosis:")
    assert f"Job_id={job_id} " in text and "[ddpslurm: cuda_oom]" in text, text
    assert f"ddpslurm diagnosis: cuda_oom, a rank on {node}" in text or f"on {node} (confidence" in text, text
    assert f"ddpslurm analyze {tmp_path}/slurm-{job_id}.out" in text


def test_a_ddpslurm_jobs_fail_mail_names_the_culprit_from_its_comment(cluster: SlurmCluster, tmp_path: Path
                                                                      ) -> None:
    recipient = f"submit{time.time_ns() % 10**9}"
    root = tmp_path / "jobs"
    done = ddpslurm(cluster, "submit", str(FAULT), "--nodes", "2", "--tasks-per-node", "1", "--folder", str(root),
                    "--time", "5", "--wait", "--json", "--lint", "off", "--sbatch-arg", "mail-type=FAIL",
                    "--sbatch-arg", f"mail-user={recipient}", "--", "--mode", "raise", "--rank", "1", "--at", "2",
                    cwd=tmp_path)
    job_id = json.loads(done.stdout.splitlines()[-1])["job_id"]
    diagnosis = json.loads((root / f"job_{job_id}" / "diagnosis.json").read_text())
    text = mailbox(cluster, recipient, "ddpslurm diagnosis:")
    assert "[ddpslurm: user_code_exception]" in text, text
    assert f"user_code_exception, rank 1 on {diagnosis['first_failing_host']}" in text, text
    log = Path(cluster.env["DDPSLURM_CLUSTER_LOGS"]) / "ddpslurm-mail.log"
    entries = [json.loads(line) for line in log.read_text().splitlines() if f'"{job_id}"' in line]
    assert entries and entries[-1]["outcome"] == "diagnosed" and entries[-1]["delivered"] is True, entries
