"""Worker pieces: requeue rule, records, interface choice, env defaults, script outcomes, fd-level tee."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ddpslurm import jobfolder
from ddpslurm.launch import records
from ddpslurm.launch.plan import WorkerConfig, package_setup
from ddpslurm.launch.requeue import CAP_REACHED_EXIT, PREEMPTION, TIME_LIMIT, decide, is_time_limit
from ddpslurm.launch.worker import (
    apply_defaults,
    apply_interface,
    config_from_env,
    config_to_env,
    ignore_late_preemption_signal,
    local_dist_env,
    run_script,
    torchrun_child_dist_env,
    version_tuple,
    versions_and_nccl_defaults,
)
from ddpslurm.netif import pick_interface, route_peer


@pytest.mark.parametrize(("elapsed", "limit", "delay", "expected"), [
    (20, 60, 40, True),         # a 1-minute job signalled 40 s early: the time limit
    (22, 300, 90, False),       # 22 s into a 5-minute job: a preemption (submitit would say time limit)
    (215, 300, 90, True),       # 85 s before the end of a 5-minute job
    (100, 300, 90, True),       # Slurm may signal up to 60 s early, and the worker starts late
    (80, 300, 90, False),
    (2880, 3600, 90, True),     # 0.8 T of an hour
    (1000, 3600, 90, False),
    (3450, 3600, 90, True),
])
def test_is_time_limit(elapsed: float, limit: float, delay: float, expected: bool) -> None:
    assert is_time_limit(elapsed, limit, delay) is expected


@pytest.mark.parametrize(("attempt", "max_requeues", "can", "requeue", "code"), [
    (0, 3, True, True, 0), (2, 3, True, True, 0), (3, 3, True, False, CAP_REACHED_EXIT),
    (0, 0, True, False, CAP_REACHED_EXIT), (0, 3, False, False, CAP_REACHED_EXIT),
])
def test_decide_caps_requeues(attempt: int, max_requeues: int, can: bool, requeue: bool, code: int) -> None:
    decision = decide(elapsed_s=10, limit_s=3600, signal_delay_s=90, attempt=attempt, max_requeues=max_requeues,
                      can_requeue=can)
    assert (decision.requeue, decision.exit_code, decision.reason) == (requeue, code, PREEMPTION)


def test_decide_reports_time_limit() -> None:
    assert decide(elapsed_s=3590, limit_s=3600, signal_delay_s=90, attempt=0, max_requeues=1).reason == TIME_LIMIT


@pytest.mark.parametrize(("hosts", "node_rank", "peer"), [
    (("a",), 0, None), (("a", "b"), 0, "b"), (("a", "b"), 1, "a"), (("a", "b", "c"), 2, "a"),
])
def test_route_peer(hosts: tuple[str, ...], node_rank: int, peer: str | None) -> None:
    assert route_peer(hosts, node_rank) == peer


@pytest.mark.parametrize(("ip", "addresses", "name"), [
    ("10.0.0.2", {"lo": "127.0.0.1", "eth0": "10.0.0.2"}, "eth0"),
    ("127.0.0.1", {"lo": "127.0.0.1", "eth0": "10.0.0.2"}, "lo"),
    ("10.9.9.9", {"lo": "127.0.0.1", "eth0": "10.0.0.2"}, None),
    ("192.168.1.5", {"ib0": "192.168.1.5", "eth0": "10.0.0.2"}, "ib0"),
])
def test_pick_interface(ip: str, addresses: dict[str, str], name: str | None) -> None:
    assert pick_interface(ip, addresses) == name


def _config(**changes: object) -> WorkerConfig:
    base = dict(script="/x/train.py", script_args=("a b", "$(x)"), launcher="srun", folder="/jobs", nodes=2,
                tasks_per_node=2, max_requeues=3, time_limit_s=3600, signal_delay_s=90, grace_s=45,
                interface=None, env_defaults=(("NCCL_DEBUG", "INFO"), ("DDPSLURM_PG_TIMEOUT", "600")))
    base.update(changes)
    return WorkerConfig(**base)  # type: ignore[arg-type]


def test_config_round_trips_through_the_environment() -> None:
    cfg = _config()
    assert config_from_env(config_to_env(cfg)) == cfg


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, {"NCCL_DEBUG": "INFO", "DDPSLURM_PG_TIMEOUT": "600"}),
    ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG": "WARN", "DDPSLURM_PG_TIMEOUT": "600"}),
])
def test_defaults_never_override_the_person(environ: dict[str, str], expected: dict[str, str]) -> None:
    apply_defaults(_config().env_defaults, environ)
    assert environ == expected


@pytest.mark.parametrize(("cfg_iface", "environ", "expected"), [
    ("ib0", {"GLOO_SOCKET_IFNAME": "eth1"}, ("ib0", "ib0")),   # --interface wins
    (None, {"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "eth2"}, ("eth2", "eth1")),
])
def test_interface_precedence(cfg_iface: str | None, environ: dict[str, str], expected: tuple[str, str]) -> None:
    apply_interface(_config(interface=cfg_iface), None, environ)
    assert (environ["NCCL_SOCKET_IFNAME"], environ["GLOO_SOCKET_IFNAME"]) == expected


def test_routed_interface_goes_to_gloo_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL picks its own interface unless --interface says otherwise: the routed one is often the
    management NIC."""
    import ddpslurm.netif as netif

    monkeypatch.setattr(netif, "choose_interface", lambda hosts, node_rank, master: "eth9")
    dist = SimpleNamespace(hostnames=("a", "b"), node_rank=1, master_addr="a")
    environ: dict[str, str] = {}
    apply_interface(_config(), dist, environ)
    assert environ == {"GLOO_SOCKET_IFNAME": "eth9"}


def test_versions_never_initialize_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that sets CUDA_VISIBLE_DEVICES at its top must be obeyed: no CUDA probe before it."""
    import torch

    def probe() -> bool:
        raise AssertionError("torch.cuda.is_available() called before the script")

    monkeypatch.setattr(torch.cuda, "is_available", probe)
    monkeypatch.setattr(torch.cuda, "device_count", probe)
    environ: dict[str, str] = {}
    found = versions_and_nccl_defaults(environ)
    assert found["torch"] == torch.__version__
    assert environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
    assert "NCCL_ASYNC_ERROR_HANDLING" not in environ and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in environ


@pytest.mark.parametrize(("nccl", "stamped"), [((2, 28, 9), True), ((2, 23, 0), True), ((2, 21, 5), False)])
def test_nccl_timestamps_on_every_level(monkeypatch: pytest.MonkeyPatch, nccl: tuple[int, ...], stamped: bool) -> None:
    """NCCL >= 2.23 stamps only WARN lines by default (seen on an H100 with NCCL 2.28.9): the worker asks for every
    level, and leaves a person's own choice alone."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: nccl)
    environ: dict[str, str] = {"NCCL_DEBUG_TIMESTAMP_FORMAT": "[%T] "}
    found = versions_and_nccl_defaults(environ)
    assert found["nccl"] == ".".join(map(str, nccl))
    assert environ["NCCL_DEBUG_TIMESTAMP_FORMAT"] == "[%T] "
    assert environ.get("NCCL_DEBUG_TIMESTAMP_LEVELS") == ("ALL" if stamped else None)


def test_local_launcher_uses_loopback() -> None:
    environ: dict[str, str] = {}
    apply_interface(_config(launcher="local"), None, environ)
    assert environ == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def test_local_dist_env() -> None:
    dist = local_dist_env({"SUBMITIT_LOCAL_JOB_ID": "4321", "SUBMITIT_LOCAL_NTASKS": "4",
                           "SUBMITIT_LOCAL_GLOBALID": "3", "SUBMITIT_LOCAL_LOCALID": "3"})
    assert (dist.rank, dist.local_rank, dist.world_size, dist.node_rank) == (3, 3, 4, 0)
    assert dist.master_addr == "127.0.0.1" and dist.master_port == 10000 + 4321 % 20000


def test_torchrun_child_dist_env() -> None:
    dist = torchrun_child_dist_env({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2",
                                    "GROUP_RANK": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "29500",
                                    "SLURM_STEP_NODELIST": "n[1-3]", "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"})
    assert (dist.rank, dist.node_rank, dist.hostnames, dist.job_id) == (5, 2, ("n1", "n2", "n3"), "77")


@pytest.mark.parametrize(("raw", "expected"), [((2, 23, 4), (2, 23, 4)), (2708, (2, 7, 8)), (21803, (21, 8, 3)),
                                                (None, ())])
def test_version_tuple(raw: object, expected: tuple[int, ...]) -> None:
    assert version_tuple(raw) == expected


@pytest.mark.parametrize(("body", "status", "code", "exc_type"), [
    ("x = 1\n", "ok", 0, None),
    ("import sys\nsys.exit(0)\n", "ok", 0, None),
    ("import sys\nsys.exit()\n", "ok", 0, None),
    ("import sys\nsys.exit(7)\n", "exit", 7, None),
    ("import sys\nsys.exit('bad config')\n", "exit", 1, None),
    ("raise ValueError('boom')\n", "exception", 1, "ValueError"),
    ("import json\nraise json.JSONDecodeError('m', 'd', 0)\n", "exception", 1, "json.decoder.JSONDecodeError"),
    ("raise KeyboardInterrupt\n", "signal", 130, None),
])
def test_run_script_outcomes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, status: str, code: int,
                             exc_type: str | None) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "s.py"
    script.write_text(body)
    outcome = run_script(str(script), ())
    assert (outcome.status, outcome.exit_code) == (status, code)
    assert (outcome.exception or {}).get("type") == exc_type


def test_run_script_sees_argv_and_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "out.json"
    script = tmp_path / "s.py"
    script.write_text("import json, sys\nif __name__ == '__main__':\n"
                      f"    json.dump(sys.argv, open({str(out)!r}, 'w'))\n")
    assert run_script(str(script), ("a b", "$(x)", "")).status == "ok"
    assert json.loads(out.read_text()) == [str(script), "a b", "$(x)", ""]


def test_records_shape(tmp_path: Path) -> None:
    start = records.start_record(rank=1, local_rank=1, node_rank=0, world_size=2, local_world_size=2, host="h",
                                 pid=9, job_id="5", step_id="0", attempt=0, launcher="srun", master_addr="h",
                                 master_port=10005, unix=0.5, versions={"python": "3"}, env={"NCCL_DEBUG": "INFO"})
    assert start["time"] == "1970-01-01T00:00:00.500000+00:00" and start["kind"] == "start"
    end = records.exit_record(rank=1, host="h", pid=9, job_id="5", attempt=0, status="preempted", exit_code=0,
                              unix=1.0, reason="time_limit")
    assert end["reason"] == "time_limit" and end["signal"] is None and end["exception"] is None
    path = jobfolder.rank_paths(jobfolder.attempt_folder(jobfolder.job_folder(tmp_path, "5"), 0), 1)["exit"]
    jobfolder.write_json(path, end)
    assert path == tmp_path / "job_5" / "attempt_0" / "rank_1.exit.json"
    assert json.loads(path.read_text()) == end
    with pytest.raises(ValueError):
        records.exit_record(rank=0, host="h", pid=1, job_id="1", attempt=0, status="weird", exit_code=0, unix=0)


def test_selected_env() -> None:
    assert records.selected_env({"NCCL_A": "1", "PATH": "/x", "GLOO_B": "2", "TORCH_C": "3"}) == {
        "GLOO_B": "2", "NCCL_A": "1", "TORCH_C": "3"}


TEE_PROBE = """
import ctypes, os, sys
from pathlib import Path
from ddpslurm.launch.tee import FdTee
tee = FdTee(Path(sys.argv[1]))
tee.start()
print("python stdout")
print("python stderr", file=sys.stderr)
os.write(2, b"raw fd2\\n")
ctypes.CDLL(None).dprintf(2, b"from C on fd 2\\n")
tee.stop()
print("after stop")
"""


def test_tee_captures_fd_level_output_and_passes_it_through(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    done = subprocess.run([sys.executable, "-c", TEE_PROBE, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    captured = log.read_text()
    for line in ("python stdout", "python stderr", "raw fd2", "from C on fd 2"):
        assert line in captured
    assert "after stop" not in captured
    assert "python stdout" in done.stdout and "after stop" in done.stdout
    assert "from C on fd 2" in done.stderr and "python stderr" in done.stderr


ABORT_PROBE = """
import ctypes, os, sys
from pathlib import Path
from ddpslurm.launch.tee import FdTee
FdTee(Path(sys.argv[1])).start()
ctypes.CDLL(None).dprintf(2, b"last words before abort\\n")
os.abort()
"""


def test_tee_keeps_the_last_words_of_a_rank_that_aborts(tmp_path: Path) -> None:
    log = tmp_path / "rank_0.log"
    done = subprocess.run([sys.executable, "-c", ABORT_PROBE, str(log)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    deadline = time.time() + 5  # the copier drains after the rank is gone
    while time.time() < deadline and "last words" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    assert "last words before abort" in log.read_text()
    assert "last words before abort" in done.stderr


@pytest.mark.parametrize(("parent", "expected"), [
    ("/usr/lib/python3/dist-packages", []),
    ("/opt/venv/lib/python3.11/site-packages", []),
    ("/work/main", ["export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}"]),
    ("/home/a b/src", ["export PYTHONPATH='/home/a b/src'${PYTHONPATH:+:$PYTHONPATH}"]),
])
def test_package_setup(parent: str, expected: list[str]) -> None:
    assert package_setup(parent) == expected


@pytest.mark.parametrize(("environ", "call", "expected_s"), [
    ({"DDPSLURM_PG_TIMEOUT": "7"}, ((), {}), 7),                                  # no timeout given: ours
    ({"DDPSLURM_PG_TIMEOUT": "7"}, ((), {"timeout": "theirs"}), "theirs"),       # the script's wins
    ({"DDPSLURM_PG_TIMEOUT": "7"}, (("gloo", None, "pos"), {}), "pos"),           # positional timeout wins
    ({"DDPSLURM_PG_TIMEOUT": "0"}, ((), {}), None),                              # 0: torch's default
    ({}, ((), {}), None),
])
def test_pg_timeout_default(monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], call: tuple,
                            expected_s: object) -> None:
    from datetime import timedelta

    import torch.distributed as tdist
    import torch.distributed.distributed_c10d as c10d

    from ddpslurm.launch.worker import patch_pg_timeout

    seen: list[object] = []

    def recorder(*args: object, **kwargs: object) -> None:
        seen.append(args[2] if len(args) > 2 else kwargs.get("timeout"))

    monkeypatch.setattr(c10d, "init_process_group", recorder)
    monkeypatch.setattr(tdist, "init_process_group", recorder)
    patch_pg_timeout(environ)
    args, kwargs = call
    tdist.init_process_group(*args, **kwargs)
    expected = timedelta(seconds=expected_s) if isinstance(expected_s, int) else expected_s
    assert seen == [expected]


@pytest.mark.parametrize(("value", "stack_expected"), [("1", True), ("", False)])
def test_faulthandler_from_the_default_puts_a_segfault_stack_in_the_log(value: str, stack_expected: bool) -> None:
    """PYTHONFAULTHANDLER set after start-up only works through enable_faulthandler()."""
    code = (
        "import ctypes, os\n"
        "from ddpslurm.launch.worker import enable_faulthandler\n"
        f"os.environ['PYTHONFAULTHANDLER'] = {value!r}\n"
        "print(enable_faulthandler(os.environ), flush=True)\n"
        "ctypes.string_at(0)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONFAULTHANDLER"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode != 0
    assert done.stdout.strip() == str(stack_expected)
    assert ("Fatal Python error: Segmentation fault" in done.stderr) is stack_expected


TERM_PROBE = """
import os, signal, sys, time
from pathlib import Path
from types import SimpleNamespace
from ddpslurm import preemption
from ddpslurm.launch import signals
from ddpslurm.launch.rank_state import RankState
folder, when = Path(sys.argv[1]), sys.argv[2]
inbox = signals.Inbox()
signals.install(inbox)
if when == "early":  # before the dispatcher (and the rank's folders) exist
    os.kill(os.getpid(), signal.SIGTERM)
    sent = time.time()
    time.sleep(0.5)
tee = SimpleNamespace(stop=lambda timeout=2.0: None)
paths = {"exit": folder / "rank_1.exit.json", "signal": folder / "rank_1.signal.json"}
state = RankState(SimpleNamespace(grace_s=30), SimpleNamespace(rank=1, job_id="7"), 0, paths, tee)
dispatcher = signals.Dispatcher(inbox, state.on_signal, state.on_wake)
dispatcher.start()

def handled(count):
    deadline = time.time() + 20
    while dispatcher.handled < count and time.time() < deadline:
        time.sleep(0.01)

if when == "ended":
    state.exit_record("preempted", 0)
    state.end_script(inbox.arrivals)
if when != "early":
    os.kill(os.getpid(), signal.SIGTERM)
handled(1)
if when == "saving":
    assert preemption.preemption_requested()  # the script reads the flag, then saves
if when in ("twice", "saving"):
    os.kill(os.getpid(), signal.SIGTERM)
    handled(2)
signal.alarm(0)
if when == "early":
    assert state.signal_unix < sent + 0.01, (state.signal_unix, sent)
(folder / "tail_done").write_text("submitit's result pickle")
"""


@pytest.mark.parametrize(("when", "code", "status", "tail_done", "later"), [
    ("running", 0, None, True, None),        # Slurm's preemption SIGTERM: the flag; the script goes on
    ("early", 0, None, True, None),          # the same before the rank's folders exist: noted, recorded later
    ("twice", 128 + 15, "signal", False, "ended the rank"),  # a second one, flag never read: exit at once
    ("saving", 0, None, True, "recorded, not obeyed: the script read the flag"),  # flag read: it is saving
    ("ended", 0, "preempted", True, None),   # the requeue's SIGTERM: let submitit finish its result file
])
def test_sigterm_before_during_and_after_the_script(tmp_path: Path, when: str, code: int, status: str | None,
                                                    tail_done: bool, later: str | None) -> None:
    done = subprocess.run([sys.executable, "-c", TERM_PROBE, str(tmp_path), when], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == code, done.stderr
    exit_record = tmp_path / "rank_1.exit.json"
    assert (json.loads(exit_record.read_text())["status"] if exit_record.exists() else None) == status
    assert (tmp_path / "tail_done").exists() == tail_done
    signal_record = tmp_path / "rank_1.signal.json"
    assert signal_record.exists() == (when != "ended")  # after the script: no signal record (no requeue)
    if when != "ended":
        record = json.loads(signal_record.read_text())
        assert record["signal"] == "SIGTERM" and "got SIGTERM" in done.stderr
        assert [e["action"] for e in record.get("later", [])] == ([later] if later else [])
    assert not list(tmp_path.glob(".*.tmp")), "a temporary record file was left behind"


def test_handlers_are_installed_before_any_io(monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's handlers are in place when the worker starts: until ddpslurm's replace them, a SIGTERM is
    ignored (the rank trains into SIGKILL) and a USR2 requeues the job from rank 0. They must be gone before
    the first file-system call (folder creation), however slow the shared filesystem is."""
    import signal as signals_module

    from ddpslurm.launch import worker
    from ddpslurm.launch.plan import WorkerConfig

    seen: dict[int, object] = {}

    class Stop(Exception):
        pass

    def first_io(*args: object, **kwargs: object) -> None:
        seen.update({s: signals_module.getsignal(s) for s in (signals_module.SIGTERM, signals_module.SIGUSR2,
                                                               signals_module.SIGALRM)})
        raise Stop

    previous = {s: signals_module.getsignal(s) for s in (signals_module.SIGTERM, signals_module.SIGUSR2,
                                                          signals_module.SIGALRM)}
    for name, value in {"SUBMITIT_LOCAL_JOB_ID": "9", "SUBMITIT_LOCAL_GLOBALID": "0",
                        "SUBMITIT_LOCAL_LOCALID": "0", "SUBMITIT_LOCAL_NTASKS": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(worker, "_job_dirs", first_io)
    cfg = WorkerConfig(script="x.py", script_args=(), launcher="local", folder="/nonexistent", nodes=1,
                       tasks_per_node=1, max_requeues=0, time_limit_s=60, signal_delay_s=30, grace_s=15,
                       interface=None, env_defaults=())
    try:
        with pytest.raises(Stop):
            worker.run_rank(cfg, "local")
    finally:
        for signum, handler in previous.items():
            signals_module.signal(signum, handler)
    term, usr2, alarm = (seen[s] for s in (signals_module.SIGTERM, signals_module.SIGUSR2, signals_module.SIGALRM))
    assert getattr(term, "__func__", None) is worker.signals.Inbox.handler and usr2 == term
    assert alarm is worker.on_alarm


LATE_SIGNAL_PROBE = """
import sys
from ddpslurm import preemption
from ddpslurm.launch.worker import ignore_late_preemption_signal
preemption.install_handler()
ignore_late_preemption_signal()
print("ready", flush=True)
"""


def test_a_preemption_signal_during_shutdown_does_not_kill_a_finished_rank() -> None:
    """Python puts SIG_DFL back at shutdown for the signals it handled; USR2 (Slurm's jittered signal,
    often just as the last attempt finishes) would then kill the rank with status 140."""
    import signal

    assert ignore_late_preemption_signal is not None
    probe = subprocess.Popen([sys.executable, "-c", LATE_SIGNAL_PROBE], stdout=subprocess.PIPE, text=True)
    assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
    deadline = time.time() + 30
    while probe.poll() is None and time.time() < deadline:
        with contextlib.suppress(ProcessLookupError):
            probe.send_signal(signal.SIGUSR2)
        time.sleep(0.002)
    assert probe.wait(timeout=30) == 0


def test_torchrun_agent_only_notes_sigterm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm SIGTERMs the agent with its ranks: the ranks decide (flag, save, or exit); the agent only notes it."""
    import signal as signals

    from torch.distributed.elastic.multiprocessing import api

    from ddpslurm import preemption
    from ddpslurm.launch.signals import Inbox
    from ddpslurm.launch.worker import keep_agent_through_sigterm

    # torch's own private handler is what keep_agent_through_sigterm wraps in place: it is the unit under test
    monkeypatch.setattr(api, "_terminate_process_handler", api._terminate_process_handler)
    inbox = Inbox()
    keep_agent_through_sigterm(inbox)
    keep_agent_through_sigterm(inbox)  # idempotent: not wrapped twice
    handler = api._terminate_process_handler
    preemption.reset()
    try:
        assert handler(signals.SIGTERM, None) is None and handler(signals.SIGTERM, None) is None
        assert [signum for signum, _ in inbox.arrivals] == [signals.SIGTERM, signals.SIGTERM]
        with pytest.raises(api.SignalException):
            handler(signals.SIGINT, None)
    finally:
        preemption.reset()


def test_the_grace_alarm_never_interrupts_a_script_that_read_the_flag(tmp_path: Path) -> None:
    """A script inside torch.save after reading the flag must finish; one that never looked is stopped,
    and the stop is recorded as an exception (GraceExpired), never as ok."""
    from ddpslurm import preemption
    from ddpslurm.launch.worker import GraceExpired, on_alarm

    preemption.reset()
    try:
        preemption.request(15)
        with pytest.raises(GraceExpired):
            on_alarm(14, None)
        assert preemption.preemption_requested()  # the script reads the flag ...
        assert on_alarm(14, None) is None  # ... and is left alone from then on
    finally:
        preemption.reset()
    script = tmp_path / "slow.py"
    script.write_text("from ddpslurm.launch.worker import GraceExpired\nraise GraceExpired()\n")
    outcome = run_script(str(script), ())
    assert outcome.status == "exception" and outcome.exception["type"].endswith("GraceExpired")


@pytest.mark.parametrize(("torch_version", "preset", "expected"), [
    ("2.13.0+cpu", {}, {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "ATTEMPT/nccl_trace_rank_",
                        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}),
    ("2.4.1", {}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
                   "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "ATTEMPT/nccl_trace_rank_", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}),
    # the person's own settings win, under either of torch's names
    ("2.13.0", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"},
     {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
      "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}),
    (None, {}, {}),  # no torch: nothing to set
])
def test_flight_recorder_is_on_by_default_and_dumps_into_the_attempt_folder(
        torch_version: str | None, preset: dict[str, str], expected: dict[str, str]) -> None:
    from ddpslurm.launch.worker import flight_recorder_defaults

    environ = dict(preset)
    flight_recorder_defaults(environ, Path("ATTEMPT"), torch_version)
    assert environ == expected


def test_a_sigterm_after_the_hang_record_leaves_no_signal_record(tmp_path):
    """The hang monitor's `hang` record seals the rank; srun's teardown SIGTERM that reaches it while its script
    unwinds (a peer left first) must not leave a signal record, which would make the batch step requeue."""
    from ddpslurm.launch.rank_state import RankState

    paths = {"exit": tmp_path / "rank_1.exit.json", "signal": tmp_path / "rank_1.signal.json"}
    state = RankState(SimpleNamespace(grace_s=30), SimpleNamespace(rank=1, job_id="7"), 0, paths,
                      SimpleNamespace(stop=lambda timeout=2.0: None))
    assert state.exit_record("hang", 124, final=True, reason="hang_monitor")
    assert state.end_script([(signal.SIGTERM, time.time())]) is False
    assert not paths["signal"].exists()
    assert json.loads(paths["exit"].read_text())["status"] == "hang"
