"""`ddpslurm doctor`: pre-flight checks that name a bad node in seconds, before a job hangs in init.

`probe` runs on every node (one task per node) and writes one JSON record per node into the job folder
(`<folder>/job_<id>/doctor/node_<host>.json`); `judge` turns the records into checks (pure); `command`
runs the probe through srun (the one shell-out place) and renders the verdict.
"""
