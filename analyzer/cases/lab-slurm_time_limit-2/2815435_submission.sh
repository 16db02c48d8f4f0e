#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=1
#SBATCH --error=/tmp/lab-time_limit_slurm_kill-cjsz4ig_/job_%j/%j_0_log.err
#SBATCH --job-name=lab-time_limit_slurm_kill
#SBATCH --no-requeue
#SBATCH --nodes=3
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/tmp/lab-time_limit_slurm_kill-cjsz4ig_/job_%j/%j_0_log.out
#SBATCH --signal=USR2@30
#SBATCH --time=2
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /tmp/lab-time_limit_slurm_kill-cjsz4ig_/job_%j/%j_%t_log.out --error /tmp/lab-time_limit_slurm_kill-cjsz4ig_/job_%j/%j_%t_log.err --kill-on-bad-exit=1 --wait=60 /root/.pyenv/versions/3.11.7/bin/python3 -u -m submitit.core._submit /tmp/lab-time_limit_slurm_kill-cjsz4ig_/job_%j
