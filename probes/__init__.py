"""Code that runs inside the measured processes (torchrun workers): it measures and writes rows.

- plan: the measurement plan (dataclasses shared with the runner and the sim backend).
- variants: the all-reduce variant table, groups and ring orders.
- p2p_worker: copies between devices (P2P matrix, host-staged, h2d/d2h, concurrent traffic).
- allreduce_worker: the all-reduce sweep of one variant over one group.
- rows: how workers hand rows and heartbeat events to the runner (per-rank JSONL), test hooks.
- pattern: the byte pattern every copy moves and the receiver checks.
"""
