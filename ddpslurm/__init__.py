"""ddpslurm: launch PyTorch DDP scripts on Slurm, and tell why a multi-node job failed.

Importing the package is cheap: no torch, pandas or submitit. The one API a training script needs is
`ddpslurm.preemption_requested()`, true once Slurm has sent the preemption / time-limit signal;
`ddpslurm.heartbeat()` reports a step to the hang monitor (`submit --hang-timeout`).
"""

from ddpslurm._version import __version__
from ddpslurm.launch.heartbeat import heartbeat
from ddpslurm.preemption import preemption_requested

__all__ = ["__version__", "heartbeat", "preemption_requested"]
