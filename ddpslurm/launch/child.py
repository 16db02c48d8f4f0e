"""Entry point of every torchrun child (`python -m ddpslurm.launch.child SCRIPT ARGS...`).

The per-node agent puts the worker configuration in DDPSLURM_WORKER_CONFIG; the child runs the
script like an srun rank does (records, per-rank log, preemption), with its global rank from torchrun.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    from ddpslurm.launch.worker import CONFIG_ENV, config_from_env, run_rank

    text = os.environ.get(CONFIG_ENV)
    if not text:
        print(f"ddpslurm: {CONFIG_ENV} is not set: this entry point is started by `ddpslurm submit "
              "--launcher torchrun`, not by hand", file=sys.stderr)
        sys.exit(2)
    sys.exit(run_rank(config_from_env(text), "torchrun"))


if __name__ == "__main__":
    main()
