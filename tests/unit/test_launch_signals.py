"""The rank's signal handlers (they only take note) and the dispatcher thread that acts on their notes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

PROBE = """
import os, signal, sys, time
from ddpslurm import preemption
from ddpslurm.launch import signals
inbox = signals.Inbox()
signals.install(inbox)
pid = os.fork()
if pid == 0:  # a forked child (a DataLoader worker): the handler is inherited and only sets its flag
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    os._exit(0 if preemption.preemption_requested() and not inbox.arrivals else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert inbox.arrivals == [], inbox.arrivals  # nothing of the child's reached the rank's dispatcher
seen = []
dispatcher = signals.Dispatcher(inbox, lambda signum, unix: seen.append(signal.Signals(signum).name))
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGTERM)
dispatcher.start()  # started after the signals: they are handed over first, in order
deadline = time.time() + 20
while len(seen) < 2 and time.time() < deadline:
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGTERM)
while len(seen) < 3 and time.time() < deadline:
    time.sleep(0.01)
print(" ".join(seen), preemption.preemption_requested())
"""


def test_handlers_note_signals_for_the_dispatcher_and_only_flag_in_forked_children() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SIGUSR2", "SIGTERM", "SIGTERM", "True"]


def test_a_sigterm_never_kills_the_process_that_installed_the_handlers() -> None:
    code = ("import os, signal, time\nfrom ddpslurm.launch import signals\nsignals.install(signals.Inbox())\n"
            "print('ready', flush=True)\ntime.sleep(30)\n")
    probe = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
        for _ in range(3):
            probe.send_signal(signal.SIGTERM)
            time.sleep(0.1)
        assert probe.poll() is None
    finally:
        probe.kill()
        probe.wait()
