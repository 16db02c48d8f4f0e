#!/bin/bash

# Parameters
#SBATCH --cpus-per-task=1
#SBATCH --error=/tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4/job_%j/%j_0_log.err
#SBATCH --job-name=lab-hang_monitor_op_mismatch_rank1
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --open-mode=append
#SBATCH --output=/tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4/job_%j/%j_0_log.out
#SBATCH --requeue
#SBATCH --signal=USR2@90
#SBATCH --time=5
#SBATCH --wckey=submitit

# setup
export PYTHONPATH=/work/main${PYTHONPATH:+:$PYTHONPATH}
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE NODE_RANK GROUP_RANK ROLE_RANK ROLE_WORLD_SIZE TORCHELASTIC_RUN_ID DDPSLURM_PREEMPTED
# srun runs under ddpslurm's batch-step supervisor: it requeues the job after a preemption or
# time-limit signal, once every rank has left its exit record or the grace time ran out.
srun() { /root/.pyenv/versions/3.11.7/bin/python3 -m ddpslurm.launch.batch --folder /tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4 --world-size 4 --grace 75 --max-requeues 3 --hang-timeout 30 -- srun "$@"; }

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output /tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4/job_%j/%j_%t_log.out --error /tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4/job_%j/%j_%t_log.err --kill-on-bad-exit=1 /root/.pyenv/versions/3.11.7/bin/python3 -u -m submitit.core._submit /tmp/lab-hang_monitor_op_mismatch_rank1-mfr4r0t4/job_%j
