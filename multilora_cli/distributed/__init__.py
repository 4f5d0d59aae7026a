"""Data parallel `multilora run`: one run over several GPUs / processes / nodes with PyTorch's own runtime.

launch.py (spawn or torchrun) -> group.py (process group + per-worker gloo channels) -> rank 0:
coordinator.py (DistributedEngine: scan.py first pass, shard.py adapter-affinity sharding, routing, merged
stats.py) and ranks > 0: worker.py. protocol.py is what they say to each other.
"""
