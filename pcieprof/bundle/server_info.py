"""serve/server_info.json: what an attached server's GET /get_server_info answered
(`serve-bench --url`), secrets masked (pcieprof.redact), kept as the server gave it.

The keys are the server's, not pcieprof's (SGLang answers with its server arguments, such as
`tp_size`, and internal states; other servers differ), so the document defines none of them: they
are all its `extra`, written back unchanged. serve-bench reads `tp_size` from it, tolerating
anything else there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from pcieprof.bundle.document import Document


@dataclass
class ServerInfo(Document):
    """The answer's JSON object (an answer that was not one is recorded as `{}`)."""

    FILE: ClassVar[str] = "serve/server_info.json"

    extra: dict[str, Any] = field(default_factory=dict)
