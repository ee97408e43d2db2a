"""manifest.json: what a bundle is (schema, command, provenance, per-part status, its files).

One typed document, read and written in one way: `Manifest.from_json` checks the JSON types a
reader relies on (a wrong one is refused in one line naming the key), fills what older manifests
lack (the upgrade: every part gets the bundle's source and backend) and refuses a schema newer
than this pcieprof's; `Manifest.to_json` writes the same keys manifest.json always had (docs/
bundle.md), so the schema version is unchanged. Its version tag is `schema_version`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pcieprof.bundle.document import Document
from pcieprof.bundle.model import ModelRecord
from pcieprof.bundle.nodes import NodeLayout
from pcieprof.errors import BadInput
from pcieprof.schema import SCHEMA_VERSION, Status

FILE = "manifest.json"


@dataclass
class Part:
    """One part's record (`discovery`, `p2p`, `allreduce`, `serve`, ...).

    Attributes:
        status: `running`, `ok`, `partial`, `failed` or `interrupted`.
        why: the reason for anything but `ok`.
        source, backend: this part's provenance (the bundle's unless it differs).
        updated: when it was last recorded (ISO 8601, UTC).
        extra: the part's own facts (counts, `rows_in`, an import's `files` and `rows`).
    """

    status: str | None = None
    why: str | None = None
    source: str | None = None
    backend: str | None = None
    updated: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


#: Keys written only when they have a value (docs/bundle.md: `why?`, `nodes?`, `model?`).
_OPTIONAL = ("why", "nodes", "model")


@dataclass
class Manifest(Document):
    """manifest.json. Defaults are what a manifest older than a key is read as."""

    FILE = FILE
    FORMAT = "pcieprof.manifest"
    VERSION = SCHEMA_VERSION
    TAG_KEY = "schema_version"

    #: the schema the bundle was written with (older bundles are read as this pcieprof's)
    schema_version: int = SCHEMA_VERSION
    pcieprof_version: str | None = "unknown"
    command: str | None = "unknown"
    argv: list[str] = field(default_factory=list)
    start_time: str | None = None
    end_time: str | None = None
    #: None: a simulated bundle measured no machine, so it names none
    host: str | None = "unknown"
    platform: str | None = None
    python: str | None = None
    source: str | None = "measured"
    backend: str | None = "unknown"
    status: str | None = Status.PARTIAL.value
    why: str | None = None
    #: who writes it (pcieprof.bundle.writer.record): a dead writer's parts read interrupted
    writer: dict[str, Any] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, Part] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    nodes: NodeLayout | None = None
    model: ModelRecord | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The manifest as manifest.json holds it (optional keys only when set)."""
        out = super().to_json()
        out["schema_version"] = self.schema_version  # as written, not this pcieprof's
        for key in _OPTIONAL:
            if out.get(key) is None:
                out.pop(key, None)
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "") -> "Manifest":
        """Read a manifest of any schema up to this pcieprof's, upgraded to the current shape.

        Raises:
            BadInput: not a manifest, a value of the wrong JSON type (naming the key), or a
                schema newer than this pcieprof reads.
        """
        where = where or FILE
        if not isinstance(data, dict) or "schema_version" not in data:
            raise BadInput(f"{where}: not a pcieprof manifest (no schema_version)")
        data = dict(data)
        version = data["schema_version"] = _schema_version(data["schema_version"], where)
        if version > SCHEMA_VERSION:
            raise BadInput(f"{where}: bundle schema {version} is newer than this pcieprof "
                           f"understands ({SCHEMA_VERSION})", hint="upgrade pcieprof")
        _check_types(data, where)
        if isinstance(data.get("nodes"), dict) and int(_int(data["nodes"].get("nnodes"), where)
                                                       or 1) < 2:
            data.pop("nodes")  # a one-node run's layout says nothing a reader uses
        m = super().from_json(data, where)
        m.schema_version = version
        return _upgraded(m, data)


def _upgraded(m: Manifest, data: dict[str, Any]) -> Manifest:
    """Parts recorded before each carried its own provenance take the bundle's."""
    for name, part in m.parts.items():
        raw = data["parts"][name]
        if "source" not in raw:
            part.source = m.source
        if "backend" not in raw:
            part.backend = m.backend
    if m.nodes is not None:
        m.nodes.nodes.sort(key=lambda n: n.node_rank)
    return m


def _int(value: Any, where: str) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise BadInput(f"{where}: nodes: nnodes: expected an integer, got {_shown(value)}") \
            from None


def _schema_version(v: Any, where: str) -> int:
    if isinstance(v, str) and v.strip().isdigit():
        return int(v)  # hand-edited "3": what it means is clear
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise BadInput(f"{where}: schema_version: expected an integer >= 0, got {_shown(v)}")
    return v


#: Manifest key -> the JSON types its value may have. The document's decoding would turn a
#: number into a string; a manifest is refused instead, so a hand edit gone wrong is seen.
_TYPES: dict[str, tuple[type, ...]] = {
    "pcieprof_version": (str, type(None)), "command": (str, type(None)),
    "argv": (list,), "start_time": (str, type(None)), "end_time": (str, type(None)),
    "host": (str, type(None)), "platform": (str, type(None)), "python": (str, type(None)),
    "source": (str, type(None)), "backend": (str, type(None)), "status": (str, type(None)),
    "why": (str, type(None)), "writer": (dict, type(None)), "versions": (dict,),
    "parts": (dict,), "files": (list,), "nodes": (dict, type(None)),
    "model": (dict, type(None)),
}
_JSON_TYPE = {str: "a string", list: "a list", dict: "an object", type(None): "null"}


def _check_types(data: dict[str, Any], where: str) -> None:
    for key, types in _TYPES.items():
        if key in data and not isinstance(data[key], types):
            want = " or ".join(_JSON_TYPE[t] for t in types)
            raise BadInput(f"{where}: {key}: expected {want}, got {_shown(data[key])}")
    for name, part in data.get("parts", {}).items():
        if not isinstance(part, dict):
            raise BadInput(f"{where}: parts.{name}: expected an object, got {_shown(part)}")
        for key in ("status", "why", "source", "backend"):
            if not isinstance(part.get(key), (str, type(None))):
                raise BadInput(f"{where}: parts.{name}.{key}: expected a string or null, got "
                               f"{_shown(part[key])}")
    if not all(isinstance(f, str) for f in data.get("files", [])):
        raise BadInput(f"{where}: files: expected a list of file names")
    model = data.get("model")
    if model is not None and not all(isinstance(model.get(k), str)
                                     for k in ("name", "hash", "ref")):
        raise BadInput(f"{where}: model: expected an object with the strings name, hash and ref")


def _shown(value: Any) -> str:
    """A JSON value as an error message shows it: short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
