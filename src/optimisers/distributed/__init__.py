"""Training across processes with ``torch.distributed``: ZeRO-1 for replicated parameters.

FSDP2's sharded parameters need nothing from here: ``optimisers.setup`` and ``update_``
shard their state as the parameters are (``backends/dtensor.py``). Import this package by
name (``import optimisers.distributed``): it imports PyTorch.
"""

from optimisers.distributed.zero import broadcast_, owners, setup, update_

__all__ = ["setup", "update_", "broadcast_", "owners"]
