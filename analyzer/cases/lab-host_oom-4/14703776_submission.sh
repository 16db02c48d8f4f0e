#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=1
#SBATCH --error=/tmp/lab-sigkill_rank1_2x1-17232pz_/job_%j/%j_0_log.err
#SBATCH --job-name=lab-sigkill_rank1_2x1
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=/tmp/lab-sigkill_rank1_2x1-17232pz_/job_%j/%j_0_log.out
#SBATCH --requeue
#SBATCH --signal=USR2@90
#SBATCH --time=5
#SBATCH --wckey=submitit

# setup
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /tmp/lab-sigkill_rank1_2x1-17232pz_/job_%j/%j_%t_log.out --error /tmp/lab-sigkill_rank1_2x1-17232pz_/job_%j/%j_%t_log.err --kill-on-bad-exit=1 --wait=60 /root/.pyenv/versions/3.11.7/bin/python -u -m submitit.core._submit /tmp/lab-sigkill_rank1_2x1-17232pz_/job_%j
