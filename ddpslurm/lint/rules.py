"""The rules as data: id, level, one-line message, why it breaks under DDP on Slurm, the fix, and the matcher.

Levels: `error` breaks the job (a deadlock, a crash, training that silently goes wrong), `warn` wastes the
allocation or leaves a trap, `info` is advice. `ddpslurm lint` exits 1 on an error-level finding.
"""

from __future__ import annotations

from collections.abc import Iterator

from ddpslurm.lint.checks.collectives import check_rank_zero_collectives
from ddpslurm.lint.checks.data import check_loader_without_sampler, check_sampler_set_epoch
from ddpslurm.lint.checks.device import check_device_from_global_rank, check_init_before_set_device
from ddpslurm.lint.checks.env import check_env_overrides, check_spawn
from ddpslurm.lint.checks.patterns import DDP_CLASS, INIT, check_wrapper_state_dict, keyword_is, keyword_missing
from ddpslurm.lint.checks.sync import check_no_sync
from ddpslurm.lint.model import ERROR, INFO, WARN, Hit, Rule
from ddpslurm.lint.project import Project

#: the pseudo-rule of a file that does not parse
SYNTAX_RULE = "DDP000"


def _none(project: Project) -> Iterator[Hit]:
    return iter(())


RULES: tuple[Rule, ...] = (
    Rule(SYNTAX_RULE, "syntax-error", ERROR, "the file does not parse",
         "Python stops at the syntax error before any rank trains: every rank of the job fails at once, after the "
         "job waited in the queue.",
         "Fix the syntax error (`python -m py_compile FILE` shows it).", _none),
    Rule("DDP001", "sampler-without-set-epoch", WARN, "DistributedSampler without set_epoch(epoch)",
         "DistributedSampler shuffles with seed + epoch, and the epoch stays 0 until set_epoch() changes it: every "
         "epoch visits the data in the same order on every rank (and drop_last drops the same samples).",
         "Call `sampler.set_epoch(epoch)` (or `loader.sampler.set_epoch(epoch)`) at the start of every epoch, "
         "before iterating the loader.", check_sampler_set_epoch),
    Rule("DDP002", "rank-zero-collective", ERROR, "collective reached by rank 0 only",
         "A collective (barrier, all_reduce, broadcast, ...) returns only when every rank of the group calls it. "
         "Inside `if rank == 0:` the other ranks never call it, or call the next collective instead: rank 0 waits "
         "until the process-group timeout and the job dies of a watchdog timeout, or the ranks mismatch.",
         "Call it on every rank: after the `if` block (rank 0 saves, then every rank meets at the barrier), or give "
         "the other ranks the same call in the `else:` branch.", check_rank_zero_collectives),
    Rule("DDP003", "no-sync-misuse", ERROR, "no_sync() that skips every gradient all-reduce",
         "Inside `with ddp_model.no_sync():` backward only accumulates local gradients; DDP all-reduces at the "
         "first backward outside it. With every backward inside no_sync(), each rank steps with its own gradients "
         "and the replicas drift apart without an error; a bare `ddp_model.no_sync()` call does nothing at all.",
         "Skip the sync on accumulation steps only: `ctx = model.no_sync() if (step + 1) % accum else "
         "contextlib.nullcontext()` then `with ctx: loss.backward()`, so the last micro-batch syncs.",
         check_no_sync),
    Rule("DDP004", "launcher-env-override", ERROR, "launcher variable overwritten",
         "srun (through `ddpslurm submit`) and torchrun set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and "
         "LOCAL_RANK on every rank. A script that assigns them (MASTER_ADDR=localhost, RANK from its own argument) "
         "sends other nodes' ranks to the wrong host or gives ranks duplicate numbers, and a fixed MASTER_PORT "
         "collides with another job on the node: the rendezvous fails or times out.",
         "Keep the launcher's values: `os.environ.setdefault(\"MASTER_ADDR\", \"localhost\")`, or assign only "
         "under `if \"MASTER_ADDR\" not in os.environ:` (a single-process fallback).", check_env_overrides),
    Rule("DDP005", "device-from-global-rank", ERROR, "CUDA device chosen with the global rank",
         "The global rank counts over all nodes (0 to world_size-1) while each node has its own GPUs 0 to N-1: on "
         "the second node `cuda:{rank}` is cuda:8 or more (invalid device ordinal), or ranks of a node share a GPU.",
         "Use the local rank: `local_rank = int(os.environ[\"LOCAL_RANK\"])`, then "
         "`torch.cuda.set_device(local_rank)` and `device_ids=[local_rank]`.", check_device_from_global_rank),
    Rule("DDP006", "nccl-before-set-device", WARN, "NCCL set up before the rank's GPU is chosen",
         "Until torch.cuda.set_device() runs, the current device is cuda:0 on every rank. torch creates NCCL "
         "communicators lazily, so what breaks is a use of the current device before set_device: an object "
         "collective (all_gather_object, broadcast_object_list), `.cuda()`, `.to(\"cuda\")` or "
         "torch.cuda.current_device() puts every rank of a node on GPU 0 (a CUDA context and memory on GPU 0 per "
         "rank, NCCL's \"Duplicate GPU detected\", or a hang).",
         "Call `torch.cuda.set_device(local_rank)` before `init_process_group`, or pass "
         "`device_id=torch.device(\"cuda\", local_rank)` to it where your torch has that argument.",
         check_init_before_set_device),
    Rule("DDP007", "loader-without-sampler", WARN, "DataLoader without a distributed sampler in a DDP script",
         "DistributedDataParallel averages gradients but does not split the data: a DataLoader without a "
         "DistributedSampler gives every rank the whole dataset, so each epoch does world_size times the work "
         "and, without shuffling, every rank computes the same batches.",
         "Pass `sampler=DistributedSampler(dataset)` (shuffle through the sampler) or shard the dataset per "
         "rank; a loader that only rank 0 reads (evaluation) is fine.", check_loader_without_sampler),
    Rule("DDP008", "find-unused-parameters", WARN, "find_unused_parameters=True",
         "DDP then walks the autograd graph from the outputs after every forward to mark the parameters that take "
         "no part: an extra pass each iteration, spent for nothing when every parameter gets a gradient (torch "
         "warns when it found none).",
         "Drop it, or make it a flag, unless some parameters really get no gradient in some iterations; if the "
         "same ones are unused every iteration, `static_graph=True` is cheaper.",
         keyword_is(frozenset({DDP_CLASS}), "find_unused_parameters", True,
                    "`{call}(..., find_unused_parameters=True)` searches the autograd graph on every iteration")),
    Rule("DDP009", "wrapper-state-dict", WARN, "state_dict() of the DDP wrapper saved",
         "DistributedDataParallel holds the model as `.module`, so the wrapper's state_dict() keys start with "
         "`module.`: the checkpoint does not load into the plain model (evaluation, one GPU, a run without DDP) "
         "without renaming every key.",
         "Save `ddp_model.module.state_dict()`; keep a handle such as `model_without_ddp = ddp_model.module`.",
         check_wrapper_state_dict),
    Rule("DDP010", "no-timeout", INFO, "init_process_group without timeout=",
         "A hung collective then waits torch's default before the watchdog ends the job: 10 minutes with NCCL "
         "(torch 2.2 and later; 30 before), 30 minutes with gloo, on every GPU of the job. `ddpslurm submit` passes "
         "DDPSLURM_PG_TIMEOUT (600 s) when the script gives none; torchrun and plain sbatch keep torch's.",
         "Pass `timeout=datetime.timedelta(seconds=...)` sized to the slowest collective (a checkpoint barrier "
         "included).",
         keyword_missing(frozenset({INIT}), "timeout", 2,
                         "`{call}()` has no timeout=: a hung collective waits the default timeout")),
    Rule("DDP011", "spawn-under-launcher", ERROR, "torch.multiprocessing.spawn inside a launched rank",
         "srun (one task per GPU, ddpslurm's default) and torchrun already start one process per GPU; "
         "mp.spawn in each of them starts nprocs more: N x N processes on the same GPUs, with ranks and a "
         "world size that no longer match what the launcher set.",
         "Under srun or torchrun call the worker function directly, with RANK and LOCAL_RANK from the "
         "environment; keep mp.spawn for runs without a launcher (`if \"LOCAL_RANK\" not in os.environ:`).",
         check_spawn),
)

BY_ID = {rule.id: rule for rule in RULES}
