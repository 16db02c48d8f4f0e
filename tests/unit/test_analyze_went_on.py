"""A process that went on after an exception it logged did not fail of it (analyzer/went_on.toml): the exception
becomes a `went_on` fact when its own stream then shows the script's loop (a retry notice, progress, a checkpoint
saved); an agent's c10d store-bind notice is no failure when its workers ran. Each rule is tried under prefixes,
rank numbers, host names and noise lines, and each has its counter-case (the same lines where the process ended)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.model import SourceFile
from ddpslurm.analyze.parse.line_events import WATCH_OWN_LINES, WATCH_SHARED_LINES
from ddpslurm.analyze.parse.scan import scan_file
from ddpslurm.analyze.rules.loading import load_signatures, load_went_on
from ddpslurm.analyze.rules.signatures import shipped_dir
from ddpslurm.errors import AnalyzeInputError


@pytest.fixture(scope="module")
def sigs():
    return load_signatures(use_env=False)


def events_of(tmp_path: Path, sigs, text: str, name: str = "rank_3.log", rank: int | None = 3):
    path = tmp_path / name
    path.write_text(text)
    return scan_file(SourceFile(path=str(path), display=name, size=path.stat().st_size, rank=rank), sigs)[0]


def caught(exc: str = "PIL.UnidentifiedImageError: cannot identify image file '/data/x.JPEG'") -> list[str]:
    return ["Traceback (most recent call last):", '  File "/work/data.py", line 57, in __getitem__',
            "    img = Image.open(path).convert('RGB')", exc]


LIFE = ["Epoch: [3]  [ 400/1251]  eta: 0:04:02  lr: 0.1  loss: 3.1021 (3.2954)",
        "step 2300 loss 1.4421", "{'loss': 1.0412, 'learning_rate': 1.8e-05, 'epoch': 0.12}",
        "data loader stalled: recreating the iterator and retrying the batch",
        "Saving checkpoint to /scratch/run12/checkpoints/step_002000.pt",
        " iteration      100/  1000 | consumed samples: 800 | lm loss: 2.3E+00 |"]
NOT_LIFE = ["wandb: Network error (ConnectionError), entering retry loop.",
            "WARNING:torch.distributed.elastic.agent.server.api:[default] Worker group failed. Restarting workers",
            "srun: error: gpu-a07: task 3: Exited with exit code 1",
            "gpu-a07:31337:31400 [2] NCCL INFO comm 0x5 rank 3 nranks 8 - Abort COMPLETE, retrying",
            "wandb: Synced 5 W&B file(s), 0 media file(s)"]
PREFIXES = ("", "[rank3]:", "2024-05-08T08:47:31.1234567Z ", "[2026-11-27 12:35:54.383957] ")


def kinds(events) -> list[tuple[str, str | None]]:
    return [(e.kind, e.cause) for e in events if e.kind in ("exception", "went_on")]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("life", LIFE)
def test_an_exception_its_process_goes_on_after_is_a_fact(tmp_path, sigs, prefix, life):
    noise = ["some line the script prints"] * 5
    text = "\n".join(prefix + line for line in ["starting", *caught(), *noise, life, "more"]) + "\n"
    found = kinds(events_of(tmp_path, sigs, text))
    assert found == [("went_on", None)], found


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("after", [*NOT_LIFE, None])
def test_an_exception_nothing_of_the_script_follows_stays_the_failure(tmp_path, sigs, prefix, after):
    lines = ["starting", *caught(), *([after] if after else [])]
    found = kinds(events_of(tmp_path, sigs, "\n".join(prefix + line for line in lines) + "\n"))
    assert found and found[0] == ("exception", "user_code_exception"), found


def test_progress_past_the_stream_s_reach_says_nothing(tmp_path, sigs):
    far = ["still here"] * (WATCH_OWN_LINES + 1)
    found = kinds(events_of(tmp_path, sigs, "\n".join([*caught(), *far, LIFE[1]]) + "\n"))
    assert found == [("exception", "user_code_exception")]
    near = ["still here"] * (WATCH_OWN_LINES - 2)
    assert kinds(events_of(tmp_path, sigs, "\n".join([*caught(), *near, LIFE[1]]) + "\n")) == [("went_on", None)]


@pytest.mark.parametrize("rank", [0, 3, 17, 1023])
def test_another_rank_s_progress_does_not_save_a_rank_that_died(tmp_path, sigs, rank):
    other = 0 if rank else 1
    lines = [f"[rank{rank}]:{line}" for line in caught()] + [f"[rank{other}]:step 2300 loss 1.4421"]
    events = events_of(tmp_path, sigs, "\n".join(lines) + "\n", name="console.log", rank=None)
    assert [(e.kind, e.rank) for e in events if e.kind in ("exception", "went_on")] == [("exception", rank)]
    lines.append(f"[rank{rank}]:step 2300 loss 1.4421")
    events = events_of(tmp_path, sigs, "\n".join(lines) + "\n", name="console.log", rank=None)
    assert [(e.kind, e.rank) for e in events if e.kind in ("exception", "went_on")] == [("went_on", rank)]


def test_a_console_of_many_processes_takes_only_the_lines_right_after(tmp_path, sigs):
    near = "\n".join([*caught(), *["x"] * (WATCH_SHARED_LINES - 1), LIFE[1]]) + "\n"
    assert kinds(events_of(tmp_path, sigs, near, name="console.log", rank=None)) == [("went_on", None)]
    far = "\n".join([*caught(), *["x"] * (WATCH_SHARED_LINES + 1), LIFE[1]]) + "\n"
    found = kinds(events_of(tmp_path, sigs, far, name="console.log", rank=None))
    assert found == [("exception", "user_code_exception")]


def test_a_one_line_exception_the_process_survives(tmp_path, sigs):
    text = ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.wandb.ai', port=443): Max retries "
            "exceeded with url: /graphql\nwandb: Network error (ConnectionError), entering retry loop.\n"
            "{'loss': 1.0412, 'learning_rate': 1.8e-05, 'epoch': 0.12}\n")
    assert kinds(events_of(tmp_path, sigs, text)) == [("went_on", None)]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_the_unraisable_hook_s_report_is_no_failure_behind_any_prefix(tmp_path, sigs, prefix):
    lines = ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f8a2c3b1e50>",
             "Traceback (most recent call last):",
             '  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/dataloader.py", line 1478, in __del__',
             "    self._shutdown_workers()",
             '  File "/opt/conda/lib/python3.10/multiprocessing/process.py", line 160, in is_alive',
             "    assert self._parent_pid == os.getpid(), 'can only test a child process'",
             "AssertionError: can only test a child process"]
    events = events_of(tmp_path, sigs, "\n".join(prefix + line for line in lines) + "\n")
    assert not [e for e in events if e.cause is not None], events


def test_a_frame_s_source_line_without_its_indentation_stays_in_the_traceback(tmp_path, sigs):
    stamp = "[2026-11-27 12:35:54.383957] "
    lines = ["Traceback (most recent call last):", '  File "/work/train.py", line 9, in <module>', "    main()",
             '  File "/work/train.py", line 5, in main', "    raise ValueError('bad batch')", "ValueError: bad batch"]
    events = events_of(tmp_path, sigs, "\n".join(stamp + line for line in lines) + "\n")
    failures = [e for e in events if e.cause is not None]
    assert [(e.text, e.get("where")) for e in failures] == [("ValueError: bad batch", "/work/train.py:5 in main")]


BIND = ["[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29400 (errno: 98 - Address already "
        "in use).", "[E socket.cpp:472] [c10d] The server socket has failed to listen on any local network address."]


def _job(tmp_path: Path, agent: list[str], worker: list[str]) -> dict:
    (tmp_path / "torchrun.log").write_text("\n".join(["torchrun --nnodes 2 --nproc-per-node 8 train.py", *agent])
                                           + "\n")
    if worker:
        (tmp_path / "torchrun.err").write_text("\n".join(worker) + "\n")
    return analyze_paths([tmp_path], workers=1).to_dict()


@pytest.mark.parametrize("local", [0, 4, 7])
def test_an_agent_whose_workers_ran_survived_its_store_bind_notice(tmp_path, local):
    died = [f"ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: {local} "
            f"(pid: 24905) of binary: /usr/bin/python"]
    got = _job(tmp_path, BIND, died)
    assert got["cause"] != "port_in_use", got["cause"]


def test_an_agent_with_no_worker_after_its_store_bind_notice_failed_of_it(tmp_path):
    assert _job(tmp_path, BIND, [])["cause"] == "port_in_use"
    raised = ["torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
              "address. The server socket has failed to bind to [::]:29400 (errno: 98 - Address already in use)."]
    (tmp_path / "worker.log").write_text("[rank3]:step 2300 loss 1.4421\n")
    assert _job(tmp_path, [*BIND, *raised], [])["cause"] == "port_in_use"  # raised: the agent did not go on


@pytest.mark.parametrize("line, cause", [
    ("[W socket.cpp:558] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - Cannot "
     "assign requested address).", None),
    ("[W socket.cpp:558] [c10d] The client socket has failed to connect to [127.0.0.1]:29500 (errno: 99 - Cannot "
     "assign requested address).", None),
    ("[W508 08:47:31.204189023 socket.cpp:697] [c10d] The IPv6 network addresses of (gpu-a00, 29500) cannot be "
     "retrieved (gai error: -2 - Name or service not known).", None),
    ("[W socket.cpp:697] [c10d] The network addresses of (gpu-a00, 29500) cannot be retrieved (gai error: -2 - Name "
     "or service not known).", "network_unreachable"),
    ("[W socket.cpp:558] [c10d] The client socket has failed to connect to [gpu-a00]:29500 (errno: 113 - No route "
     "to host).", "network_unreachable"),
])
def test_c10d_s_per_address_family_notices_are_start_up_facts(tmp_path, sigs, line, cause):
    events = events_of(tmp_path, sigs, line + "\n")
    assert [e.cause for e in events if e.cause is not None] == ([cause] if cause else [])


@pytest.mark.parametrize("text, what", [
    ("[[went_on]]\nid = 'x'\npattern = '('\n", "bad pattern"),
    ("[[went_on]]\nid = 'Bad Id'\npattern = 'x'\n", "kebab-case"),
    ("[[went_on]]\nid = 'x'\npattern = 'x'\nweight = 2\n", "unknown key"),
    ("[[sometimes]]\nid = 'x'\npattern = 'x'\n", "unknown table"),
    ("[[went_on]]\nid = 'x'\npattern = 'x'\n[[never]]\nid = 'x'\npattern = 'y'\n", "twice"),
    ("[[agent_survives]]\nsignature = 'no-such-signature'\n", "unknown signature"),
])
def test_a_site_s_went_on_file_is_validated(tmp_path, text, what):
    (tmp_path / "went_on.toml").write_text(text)
    with pytest.raises(AnalyzeInputError, match=what):
        load_signatures([tmp_path], use_env=False)


def test_a_site_rule_adds_to_the_shipped_ones(tmp_path, sigs):
    (tmp_path / "went_on.toml").write_text("[[went_on]]\nid = 'lab-heartbeat'\npattern = '^lab: alive at '\n")
    rules = load_went_on([shipped_dir(), tmp_path])
    assert rules.says("lab: alive at 12:00") == "lab-heartbeat"
    assert rules.says("step 10 loss 1.0") == sigs.went_on.says("step 10 loss 1.0") == "training-progress"


def test_ddpslurm_s_own_notice_printed_into_a_traceback_is_not_its_exception(tmp_path, sigs):
    """The rank's signal thread may print its notice while the main thread prints a traceback: the notice is no
    exception line, and the traceback's own exception is still read."""
    lines = ["Traceback (most recent call last):",
             "ddpslurm: rank 5 got SIGTERM: the script should checkpoint and return (ddpslurm.preemption_requested())",
             '  File "/work/train.py", line 9, in <module>', "    main()",
             "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.3]:38018"]
    events = events_of(tmp_path, sigs, "\n".join(lines) + "\n", rank=5)
    assert [(e.signature, e.text[:12]) for e in events if e.cause is not None] == [("gloo-closed-by-peer",
                                                                                    "RuntimeError")]
