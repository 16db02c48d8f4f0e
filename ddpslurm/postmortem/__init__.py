"""The post-mortem that writes itself: a failed job's diagnosis at its end, in its folder and in Slurm's accounting.

- `jobend`: the batch step's hook (`ddpslurm.launch.batch`): analyze the job folder, write `diagnosis.json` and
  `diagnosis.md`, put the one-line diagnosis in the job's Comment.
- `epilog`: `ddpslurm epilog`, a site hook (EpilogSlurmctld, `strigger --fini`) for jobs ddpslurm did not launch.
- `comment`: the one-line diagnosis as it goes into Slurm's Comment/AdminComment and is read back (pure).
- `sacct_triage`: `ddpslurm triage --sacct`: causes and blamed nodes from slurmdbd alone.
"""
