"""ZeRO-1 over ``torch.distributed`` (FSDP2 needs nothing from here). Imports PyTorch."""

from optimisers.distributed.zero import broadcast_, owners, setup, update_

__all__ = ["setup", "update_", "broadcast_", "owners"]
