"""Write sys.argv (as received) and the environment ddpslurm sets to $DDPSLURM_JOB_FOLDER/argv_<RANK>.json."""

import json
import os
import socket
import sys

rank = os.environ["RANK"]
interfaces = sorted(name for _, name in socket.if_nameindex())
out = {"argv": sys.argv[1:], "rank": int(rank), "host": socket.gethostname(), "interfaces": interfaces,
       "env": {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "MASTER_ADDR",
                                             "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "DDPSLURM_ATTEMPT")}}
with open(os.path.join(os.environ["DDPSLURM_JOB_FOLDER"], f"argv_{rank}.json"), "w") as handle:
    json.dump(out, handle)
print("echo_args done", flush=True)
