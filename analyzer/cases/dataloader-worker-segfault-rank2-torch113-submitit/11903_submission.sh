#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=10
#SBATCH --error=/home/ab/jobs/11903/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --job-name=ddpslurm
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/home/ab/jobs/11903/%j_0_log.out
#SBATCH --partition=gpu
#SBATCH --signal=USR2@90
#SBATCH --time=240
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /home/ab/jobs/11903/%j_%t_log.out --error /home/ab/jobs/11903/%j_%t_log.err --kill-on-bad-exit=1 /opt/venv/bin/python -u -m submitit.core._submit /home/ab/jobs/11903

