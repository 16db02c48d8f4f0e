#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=10
#SBATCH --error=/home/akira/ddpslurm_jobs/job_2208871/%j_0_log.err
#SBATCH --gpus-per-node=4
#SBATCH --job-name=ddpslurm
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --open-mode=append
#SBATCH --output=/home/akira/ddpslurm_jobs/job_2208871/%j_0_log.out
#SBATCH --partition=h100
#SBATCH --signal=USR2@90
#SBATCH --time=720
#SBATCH --wckey=submitit

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /home/akira/ddpslurm_jobs/job_2208871/%j_%t_log.out --error /home/akira/ddpslurm_jobs/job_2208871/%j_%t_log.err --kill-on-bad-exit=1 /opt/venv/bin/python -u -m submitit.core._submit /home/akira/ddpslurm_jobs/job_2208871

