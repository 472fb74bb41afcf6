"""The training job's processes: one place that joins torchrun's group, names the leader and moves
state from it.

Under torchrun (WORLD_SIZE set) every process joins the default group (NCCL on GPUs, gloo on CPUs)
through the rendezvous torchrun ran (c10d across hosts, or `--standalone` on one); alone, nothing is
initialised and every collective below is the identity.

The *leader* keeps the run's state: the data manifest, the checkpoints, the drafter, the lint report
and the evaluation. In a multi-node job it is local rank 0 of the host started with `--leader` (the
inventory's rank-0 host, which also hosts the rendezvous): c10d orders nodes by address, so that
host is not always global rank 0. Without `--leader` anywhere it is global rank 0. Hosts need not
share a filesystem: a resume loads the leader's checkpoint there and broadcasts it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# rank-local stages (regenerating responses, extracting features) may keep the others at a barrier
TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class Job:
    rank: int
    world: int
    local_rank: int
    local_world: int
    leader: int  # the leader's global rank
    device: torch.device

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    @property
    def host_first(self) -> bool:
        """This host's first process: the one that writes the host's shared files."""
        return self.local_rank == 0


def join(device: str, leader_host: bool = False) -> Job:
    """Join torchrun's group when launched by it; `device` "cuda" becomes this process's GPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # NCCL and DDP use the current device
    if world == 1:
        return Job(0, 1, 0, 1, 0, dev)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=TIMEOUT)
    rank = dist.get_rank()
    flags: list[Any] = [None] * world
    dist.all_gather_object(flags, leader_host and local_rank == 0)
    leaders = [r for r, f in enumerate(flags) if f]
    if len(leaders) > 1:
        raise ValueError(
            f"ranks {leaders} were all started with --leader (fix: pass --leader on one host only)"
        )
    return Job(rank, world, local_rank, local_world, leaders[0] if leaders else 0, dev)


def leave() -> None:
    """Leave torchrun's group before the process exits: a gloo group still alive at interpreter exit
    tears its threads down unjoined, which aborts the process now and then ("terminate called
    without an active exception") after the run itself succeeded."""
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> None:
    """End the process with `code`; under torchrun, past the interpreter's teardown. Even with the
    group destroyed (`leave`), a gloo rank still aborted now and then at exit ("terminate called
    without an active exception": 1 run in 6 of tests/train/test_pipeline.py on a 2-core box) after
    its run had finished and closed every file it wrote."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def barrier(job: Job) -> None:
    if job.world > 1:
        dist.barrier()


def gather(job: Job, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order."""
    if job.world == 1:
        return [obj]
    out: list[Any] = [None] * job.world
    dist.all_gather_object(out, obj)
    return out


def from_leader(job: Job, obj: Any) -> Any:
    """The leader's `obj` on every rank (small, picklable values)."""
    if job.world == 1:
        return obj
    box = [obj if job.is_leader else None]
    dist.broadcast_object_list(box, src=job.leader, device=job.device if job.device.type == "cuda" else None)
    return box[0]


def total(job: Job, values: Tensor) -> Tensor:
    """The sum over ranks of `values` (a float tensor on the job's device)."""
    if job.world > 1:
        values = values.clone()
        dist.all_reduce(values)
    return values


class _Slot:
    """Where the i-th broadcast tensor goes back into a state's structure."""

    def __init__(self, index: int) -> None:
        self.index = index


def _map(x: Any, leaf: Any) -> Any:
    """`x` with every leaf (anything but a dict, list or tuple) replaced by `leaf(it)`."""
    if isinstance(x, dict):
        return {k: _map(v, leaf) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, leaf) for v in x)
    return leaf(x)


def state_from_leader(job: Job, state: dict[str, Any] | None) -> dict[str, Any] | None:
    """The leader's `state` (a checkpoint: nested dicts/lists of tensors and small values, or None)
    on every rank, its tensors on the job's device. Tensors travel one by one as collectives, so a
    multi-GB optimizer state is never pickled whole."""
    if job.world == 1:
        return state
    tensors: list[Tensor] = []

    def strip(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        tensors.append(x)
        return _Slot(len(tensors) - 1)

    stripped = _map(state, strip) if job.is_leader else None
    shapes = [(t.shape, t.dtype) for t in tensors]
    skeleton, shapes = from_leader(job, (stripped, shapes))
    if skeleton is None:
        return None
    moved = []
    for i, (shape, dtype) in enumerate(shapes):
        if job.is_leader:
            t = tensors[i].to(job.device).contiguous()
        else:
            t = torch.empty(shape, dtype=dtype, device=job.device)
        dist.broadcast(t, src=job.leader)
        moved.append(t)
    return _map(skeleton, lambda x: moved[x.index] if isinstance(x, _Slot) else x)
