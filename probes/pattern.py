"""The byte pattern every copy moves, so the receiver can check what arrived.

Generated independently on each end from (size, seed): a wrong, stale or shifted byte fails the
check, and the check never relies on the link under test.
"""

from __future__ import annotations

import torch


def pattern(size_bytes: int, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`size_bytes` bytes (uint8) of a seed-dependent pattern; size must be a multiple of 4."""
    # a cheap hash per 4-byte word, in int64 and masked to 31 bits so that no step overflows and
    # every device computes the same bytes
    words = torch.arange(size_bytes // 4, dtype=torch.int64, device=device)
    words.mul_(40503).add_(seed * 2654435 + 12345).bitwise_and_(0x7FFFFFFF)
    return words.to(torch.int32).view(torch.uint8)


def matches(got: torch.Tensor, size_bytes: int, seed: int) -> bool:
    """True when the first `size_bytes` bytes of `got` are the pattern of (size, seed)."""
    return bool(torch.equal(got[:size_bytes], pattern(size_bytes, seed, got.device)))
