"""The byte pattern every copy moves, so the receiver can check what arrived.

Generated independently on each end from (size, seed): a wrong, stale or shifted byte fails the
check, and the check never relies on the link under test.
"""

from __future__ import annotations

import torch


def pattern(size_bytes: int, seed: int, device: torch.device | str | int = "cpu") -> torch.Tensor:
    """`size_bytes` bytes (uint8) of a seed-dependent pattern; size must be a multiple of 4."""
    # a cheap hash per 4-byte word, in int64 and masked to 31 bits so that no step overflows and
    # every device computes the same bytes
    words = torch.arange(size_bytes // 4, dtype=torch.int64, device=device)
    words.mul_(40503).add_(seed * 2654435 + 12345).bitwise_and_(0x7FFFFFFF)
    return words.to(torch.int32).view(torch.uint8)


def matches(got: torch.Tensor, size_bytes: int, seed: int) -> bool:
    """True when the first `size_bytes` bytes of `got` are the pattern of (size, seed)."""
    return bool(torch.equal(got[:size_bytes], pattern(size_bytes, seed, got.device)))


#: Seeds of one case: room for this many ends (GPU indices, flows); the last is the host end.
CASE_ENDS = 4096
HOST_END = CASE_ENDS - 1
_PART_BASE = {"p2p": 0, "concurrent": 1 << 16}


def case_seed(part: str, index: int, end: int) -> int:
    """The seed of what end `end` (a GPU index, a flow, or HOST_END) sends in case `index` of
    `part`: no other case or end of a run uses it, so a buffer holding an earlier case's bytes
    never holds what a later case expects. Seeds stay below 2**31, where distinct seeds give
    patterns that differ in every 4-byte word."""
    if not (0 <= end < CASE_ENDS and 0 <= index < 1 << 16):
        raise ValueError(f"case {index}, end {end}: out of the seed range")
    return 1 + (_PART_BASE[part] + index) * CASE_ENDS + end


def poison(t: torch.Tensor, size_bytes: int, seed: int) -> torch.Tensor:
    """Fill the first `size_bytes` of `t` with the bitwise complement of the pattern it should
    receive: every byte differs from the expected one, so a byte that is not written is caught."""
    return t[:size_bytes].copy_(pattern(size_bytes, seed, t.device)).bitwise_not_()
