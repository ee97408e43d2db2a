"""Sizes as people read them: 8 B, 12 KiB, 768 KiB, 64 MiB (binary units, as nccl-tests prints)."""

from __future__ import annotations

#: Bytes in one GiB: the one unit memory is shown in.
GIB = float(1 << 30)


def size_label(n: float) -> str:
    """Bytes as `8 B`, `12 KiB`, `1.5 KiB`, `64 MiB`."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"
