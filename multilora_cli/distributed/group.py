"""Process groups for a data-parallel run, from PyTorch's own runtime only (no launcher or socket code here).

Two ways in:
- `multilora run --data-parallel N` (one machine): this process is rank 0 and starts ranks 1..N-1 with
  `torch.multiprocessing.start_processes(start_method="spawn")`; rendezvous through a `file://` store in a
  private temporary directory.
- `torchrun ... -m multilora_cli run ...`: torchrun started every rank and set RANK / WORLD_SIZE / LOCAL_RANK /
  MASTER_ADDR / MASTER_PORT; rendezvous is `env://`.

The default group is gloo on CPU and `cpu:gloo,cuda:nccl` when workers run on GPUs (NCCL for any tensor
collective). Requests and results are CPU objects, so they travel over gloo: one 2-rank gloo group per worker
and direction (`down[r]`: rank 0 -> r, `up[r]`: r -> rank 0), so each group is used by exactly one thread on
each side and a dead worker shows up as an error on exactly its own channels.
"""

from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_ENV = "MULTILORA_DIST_TIMEOUT"  # seconds a channel may wait for a message (default 2 hours)


def torchrun_env() -> tuple[int, int, int] | None:
    """(rank, world size, local rank) when started by torchrun with more than one process, else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world <= 1:
        return None
    return int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0"))


def pin_device(index: str | int | None) -> bool:
    """Make GPU `index` (an entry of the visible list) this process's only visible device, cuda:0, so no thread
    of this process can create a context on another worker's GPU. Only before CUDA is initialised (at process
    start, which is when this is called); returns whether it applied."""
    if index is None:
        return False
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return True


def pin_local_rank(local_rank: int) -> bool:
    """torchrun: pin this rank to the local_rank-th visible GPU when there is one. The GPU count comes from
    NVML, which does not start CUDA (after CUDA starts, the visible list can no longer change)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        entries = [d.strip() for d in env.split(",") if d.strip()]
        return local_rank < len(entries) and pin_device(entries[local_rank])
    try:
        import torch

        count = torch.cuda._device_count_nvml()  # -1 when NVML cannot tell
    except Exception:  # noqa: BLE001 - no NVML: leave the devices as they are
        return False
    return 0 <= local_rank < count and pin_device(local_rank)


def visible_devices(count: int) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return [d.strip() for d in env.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, 7200)))


class Channel:
    """One direction between rank 0 and a worker: whole pickled objects over a 2-rank gloo group."""

    def __init__(self, group: Any, peer: int):
        self.group = group
        self.peer = peer

    def send(self, obj: Any) -> None:
        import torch.distributed as dist

        dist.send_object_list([obj], dst=self.peer, group=self.group)

    def recv(self) -> Any:
        import torch.distributed as dist

        box = [None]
        dist.recv_object_list(box, src=self.peer, group=self.group)
        return box[0]


@dataclass(slots=True)
class DistContext:
    """This process's place in the run. On rank 0 `down` / `up` hold every worker's channels; on worker r
    only its own (keyed by r). `procs` is the spawn context (rank 0 of a --data-parallel run only)."""

    rank: int
    world: int
    local_rank: int
    launcher: str  # "spawn" | "torchrun"
    cuda: bool  # workers run on GPUs
    device_index: int = 0  # this rank's GPU (0 when pin_device made it the only visible one)
    down: dict[int, Channel] = field(default_factory=dict)
    up: dict[int, Channel] = field(default_factory=dict)
    procs: Any = None
    store_dir: str | None = None

    @property
    def workers(self) -> range:
        """Ranks other than 0."""
        return range(1, self.world)


def init_groups(
    rank: int,
    world: int,
    local_rank: int,
    launcher: str,
    cuda: bool,
    init_method: str = "env://",
    device_index: int = 0,
) -> DistContext:
    """Join the default group and build the per-worker channels (collective: every rank calls this)."""
    import torch.distributed as dist

    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world, timeout=timeout())
    ctx = DistContext(rank, world, local_rank, launcher, cuda, device_index)
    for r in range(1, world):  # same order on every rank: new_group is collective
        down = dist.new_group([0, r], backend="gloo", timeout=timeout())
        up = dist.new_group([0, r], backend="gloo", timeout=timeout())
        if rank == 0:
            ctx.down[r], ctx.up[r] = Channel(down, r), Channel(up, r)
        elif rank == r:
            ctx.down[r], ctx.up[r] = Channel(down, 0), Channel(up, 0)
    return ctx


def new_store_dir() -> str:
    """A private directory for the file:// rendezvous of a --data-parallel run."""
    return tempfile.mkdtemp(prefix="multilora-dp-")


def store_url(store_dir: str) -> str:
    return f"file://{os.path.join(store_dir, 'store')}"


def destroy(ctx: DistContext | None) -> None:
    """Leave the process group and remove the rendezvous directory (never raises)."""
    import torch.distributed as dist

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - a peer may already be gone; nothing is left to tear down
        pass
    if ctx is not None and ctx.store_dir:
        shutil.rmtree(ctx.store_dir, ignore_errors=True)
