"""Server-style log lines, as SGLang prints them.

SGLang's lines read `[2026-03-11 13:53:23] message` from the server process and
`[2026-03-11 13:53:23 TP0] message` from a scheduler rank; the same shape here lets log readers
(serve-bench's crash classifier) treat both servers alike.
"""

from __future__ import annotations

import logging
import sys

SERVER = "pcieprof.refserver"
RANK = "pcieprof.refserver.rank"
_state = {"tp_rank": 0}


class _TagFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.tp = f" TP{_state['tp_rank']}" if record.name == RANK else ""
        return True


def configure(tp_rank: int, level: str = "info") -> None:
    """Send both loggers to stderr with SGLang's line shape; `tp_rank` tags rank lines."""
    _state["tp_rank"] = tp_rank
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s%(tp)s] %(message)s",
                                           datefmt="%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_TagFilter())
    for name in (SERVER, RANK):
        log = logging.getLogger(name)
        log.handlers[:] = [handler]
        log.setLevel(level.upper())
        log.propagate = False


server_log = logging.getLogger(SERVER)
rank_log = logging.getLogger(RANK)


def flush() -> None:
    for name in (SERVER, RANK):
        for h in logging.getLogger(name).handlers:
            h.flush()
    sys.stdout.flush()
    sys.stderr.flush()
