"""Signatures match their library's own message shape: the same words from another library, a warning, or an error
the process says it retries, decide nothing; the library's real lines still match (each pair below can fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpslurm.analyze.api import analyze_paths
from ddpslurm.analyze.parse.attribution import strip_prefixes
from ddpslurm.analyze.rules.loading import load_signatures

SIGS = load_signatures()


def matched(line: str) -> str | None:
    found = SIGS.match(strip_prefixes(line).text)
    return found[0].id if found else None


@pytest.mark.parametrize(("line", "signature"), [
    ("[enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to find address "
     "for: ib0", "gloo-unable-to-find-address"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/device.cc:208] getifaddrs: No such device",
     "gloo-unable-to-find-address"),
    ("RuntimeError: CUDA error: unknown error", "gpu-fell-off-bus"),
    ("torch.AcceleratorError: CUDA error: unknown error", "gpu-fell-off-bus"),
    ("gpu-c01:61000:61061 [0] init.cc:611 NCCL WARN Mismatched NCCL version detected : rank 8 version 21903 rank 0 "
     "version 21805", "nccl-version-mismatch"),
    ("[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - Address already in "
     "use).", "port-in-use"),
    ("OSError: [Errno 98] Address already in use", "port-in-use"),
    ("[E socket.cpp:860] [c10d] The client socket has failed to connect to any network address of (node01, 29500).",
     "client-connect-failed"),
    ("ConnectionRefusedError: [Errno 111] Connection refused", "client-connect-failed"),
    ("socket.gaierror: [Errno -2] Name or service not known", "client-connect-failed"),
    ("[E pair.cc:598] Read error [10.0.0.2]:44512: Connection reset by peer", "gloo-reset-by-peer"),
    ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.", None),  # its own family, not these
])
def test_a_librarys_own_line_still_matches(line: str, signature: str | None) -> None:
    if signature is None:
        assert matched(line) not in ("python-exception", "client-connect-failed")
    else:
        assert matched(line) == signature


@pytest.mark.parametrize(("line", "not_signature"), [
    ("ip: SIOCGIFFLAGS: No such device", "gloo-unable-to-find-address"),
    ("cat: /sys/class/net/ib1/operstate: No such device", "gloo-unable-to-find-address"),
    ("/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py:128: UserWarning: CUDA initialization: CUDA error: "
     "unknown error, retrying", "gpu-fell-off-bus"),
    ("UserWarning: The detected CUDA version (12.4) has a minor version mismatch with the version that was used to "
     "compile PyTorch (12.1). Most likely this shouldn't be a problem.", "nccl-version-mismatch"),
    ("zlib version mismatch!", "nccl-version-mismatch"),
    ("RuntimeError: DataLoader timed out after 300 seconds, retrying", "python-exception"),
    ("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='api.wandb.ai', port=443): Max retries exceeded "
     "(Caused by NewConnectionError('<urllib3.connection.HTTPSConnection>: Failed to establish a new connection: "
     "[Errno 111] Connection refused'))", "client-connect-failed"),
    ("WARNING:urllib3.connectionpool:Retrying (Retry(total=4)) after connection broken by "
     "'ProtocolError('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))'",
     "gloo-reset-by-peer"),
    ("<p>One of the most common errors raised when listening is <code>EADDRINUSE</code>.</p>", "port-in-use"),
])
def test_the_same_words_from_elsewhere_do_not(line: str, not_signature: str) -> None:
    assert matched(line) != not_signature


def test_a_python_exception_class_is_not_a_host_prefix() -> None:
    assert strip_prefixes("urllib3.exceptions.MaxRetryError: HTTPSConnectionPool(host='x')").host is None
    assert strip_prefixes("node02: [rank3]: RuntimeError: boom").host == "node02"


UNRAISABLE = """Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2a1c1e5ee0>
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1479, in __del__
    self._shutdown_workers()
  File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1443, in _shutdown_workers
    if self._persistent_workers or self._workers_status[worker_id]:
AssertionError: can only test a child process
"""
RAISED = """Traceback (most recent call last):
  File "/home/me/train.py", line 88, in <module>
    main()
  File "/home/me/train.py", line 61, in main
    check(batch)
AssertionError: can only test a child process
"""


def test_an_exception_python_reports_as_ignored_is_no_failure_and_a_raised_one_is(tmp_path: Path) -> None:
    """CPython cannot raise out of `__del__`: it prints `Exception ignored in:` and the process goes on."""
    ignored, raised = tmp_path / "rank0.log", tmp_path / "rank1.log"
    ignored.write_text("step 10 loss 1.0\n" + UNRAISABLE + "step 11 loss 0.9\n")
    raised.write_text("step 10 loss 1.0\n" + RAISED)
    assert analyze_paths([ignored], workers=1).cause == "unknown"
    got = analyze_paths([raised], workers=1)
    assert (got.cause, got.first_failing_rank) == ("user_code_exception", 1)
