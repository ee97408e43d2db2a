"""Typed JSON documents of a bundle: dataclasses with `to_json` / `from_json`.

A document names its file (`FILE`) and its format tag (`FORMAT` `pcieprof.<name>/<VERSION>`).
`from_json` fills every field an older file lacks with its default (a file without a tag is
version 1) and refuses a file whose tag is newer than this pcieprof knows, with a one-line error.
Keys a class does not know go to its `extra` field when it has one (so a document read and
written again keeps them), else they are dropped. The conversion follows the type hints: nested
documents, lists, tuples, dicts (JSON's string keys back to int where the hint says int),
optional values; NaN and infinity are written as null. A field named after a Python keyword with
an underscore (`class_`) is stored under the keyword (`class`).
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import re
import types
import typing
from typing import Any, ClassVar, Protocol, TypeVar, Union

from pcieprof.errors import BadInput

T = TypeVar("T", bound="Document")


class Readable(Protocol):
    """What `Bundle.read_doc` needs of a document class: its file and a reader."""

    FILE: ClassVar[str]

    @classmethod
    def from_json(cls, data: Any, where: str = ...) -> Any: ...

_TAG = re.compile(r"^(?P<name>[\w.]+)/(?P<version>\d+)$")


def check_format(tag: Any, name: str, version: int, where: str) -> int:
    """The version of a format tag `name/<n>`; 1 when there is no tag (files older than tags).

    Raises:
        BadInput: a tag of another document, or a version newer than `version`.
    """
    if tag is None or tag == "":
        return 1
    m = _TAG.match(str(tag))
    if not m or m["name"] != name:
        raise BadInput(f"{where}: format {tag!r} is not {name}")
    got = int(m["version"])
    if got > version:
        raise BadInput(f"{where}: format {tag} is newer than this pcieprof reads ({name}/{version})",
                       hint="upgrade pcieprof")
    return got


@dataclasses.dataclass
class Document:
    """Base of the typed documents; subclasses are dataclasses setting FILE, FORMAT, VERSION."""

    FILE: ClassVar[str] = ""
    FORMAT: ClassVar[str] = ""
    VERSION: ClassVar[int] = 1
    #: The key the format tag is stored under (`format`; attribution.json has its own).
    TAG_KEY: ClassVar[str] = "format"

    def to_json(self) -> dict[str, Any]:
        """The document as JSON-able data, with its format tag."""
        return encode(self)

    def tag(self) -> Any:
        """The format tag as stored (`pcieprof.<name>/<version>`, or the version number)."""
        return f"{self.FORMAT}/{self.VERSION}" if self.TAG_KEY == "format" else self.VERSION

    @classmethod
    def from_json(cls: type[T], data: Any, where: str = "") -> T:
        """Read a document, filling defaults; refuses a newer format (BadInput)."""
        where = where or cls.FILE or cls.__name__
        if not isinstance(data, dict):
            raise BadInput(f"{where}: expected a JSON object, got {_json_kind(data)}")
        if cls.FORMAT:
            tag = data.get(cls.TAG_KEY)
            if cls.TAG_KEY == "format":
                check_format(tag, cls.FORMAT, cls.VERSION, where)
            elif tag is not None and _version(tag, where, cls.TAG_KEY) > cls.VERSION:
                raise BadInput(f"{where}: {cls.TAG_KEY} {tag} is newer than this pcieprof reads "
                               f"({cls.VERSION})", hint="upgrade pcieprof")
            data = {k: v for k, v in data.items() if k != cls.TAG_KEY}
        return decode(cls, data, where)


def _version(tag: Any, where: str, key: str) -> int:
    """A numeric version tag (`attribution_version: 1`), or BadInput naming it."""
    try:
        return int(tag)
    except (TypeError, ValueError):
        raise BadInput(f"{where}: {key}: expected an integer, got {str(tag)[:40]!r}") from None


def encode(obj: Any) -> Any:
    """Dataclasses, tuples, enums and numpy scalars to JSON-able data (NaN/inf -> None)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        if isinstance(obj, Document) and obj.FORMAT:
            out[obj.TAG_KEY] = obj.tag()
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.name == "extra":
                out.update({k: encode(x) for k, x in v.items() if k not in out})
            else:
                out[_json_key(f.name)] = encode(v)
        return out
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(k)): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "value") and not isinstance(obj, (str, int)):  # enums
        return obj.value
    if hasattr(obj, "item"):  # numpy scalars
        return encode(obj.item())
    return obj


def decode(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    """A dataclass from JSON data, by its field type hints (defaults for missing keys)."""
    hints, fields = _shape(cls)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key in fields and key != "extra":
            f = fields[key]
            if value is None and not _nullable(hints[f.name]):
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise BadInput(f"{where}: {key}: expected a value, got null")
                continue  # null where the field has a default: read as absent
            kwargs[f.name] = _value(hints[f.name], value, f"{where}: {key}")
        else:
            extra[key] = value
    if "extra" in fields:
        kwargs["extra"] = extra
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field missing
        raise BadInput(f"{where}: {exc}") from None


_Shape = tuple[dict[str, Any], dict[str, "dataclasses.Field[Any]"]]
_SHAPES: dict[type[Any], _Shape] = {}


def _shape(cls: type[Any]) -> _Shape:
    """A dataclass's resolved type hints (by field name) and its init fields (by JSON key),
    worked out once per class (the hints are strings, evaluated anew on every object read
    before)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = (typing.get_type_hints(cls),
                                {_json_key(f.name): f for f in dataclasses.fields(cls) if f.init})
    return shape


def _json_key(name: str) -> str:
    """The JSON key of a field: its name, less the underscore of a keyword's (`class_`)."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


def _nullable(hint: Any) -> bool:
    """True when null is a value of `hint` (Optional, Any, object)."""
    if hint is Any or hint is object:
        return True
    return (typing.get_origin(hint) in (Union, types.UnionType)
            and type(None) in typing.get_args(hint))


def _item(hint: Any, value: Any, where: str) -> Any:
    """An element of a list or a value of a dict: null only where the hint allows it."""
    if value is None and not _nullable(hint):
        raise BadInput(f"{where}: expected {_HINT_WORDS.get(hint, 'a value')}, got null")
    return _value(hint, value, where)


def _value(hint: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _value(inner[0], value, where)
        return value  # a union of several types is kept as read
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise BadInput(f"{where}: expected an object, got {_json_kind(value)}")
        return (hint.from_json(value, where) if issubclass(hint, Document)
                else decode(hint, value, where))
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise BadInput(f"{where}: expected a list, got {_json_kind(value)}")
        item = args[0] if args else Any
        items = [_item(item, v, where) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise BadInput(f"{where}: expected an object, got {_json_kind(value)}")
        kt, vt = args if args else (Any, Any)
        return {_value(kt, k, where): _item(vt, v, where) for k, v in value.items()}
    if hint in (int, float, str) and isinstance(value, (dict, list)):
        raise BadInput(f"{where}: expected {_HINT_WORDS[hint]}, got {_json_kind(value)}")
    if hint is int and isinstance(value, (str, float)) and not isinstance(value, bool):
        try:
            return int(value)
        except (ValueError, OverflowError):
            raise BadInput(f"{where}: expected an integer, got {str(value)[:40]!r}") from None
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise BadInput(f"{where}: expected a number, got {str(value)[:40]!r}") from None
    if hint is str and not isinstance(value, str):
        return str(value)
    return value


_HINT_WORDS = {int: "an integer", float: "a number", str: "a string"}


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words (`a list`, `a string`)."""
    for t, word in ((dict, "an object"), (list, "a list"), (str, "a string"), (bool, "a boolean"),
                    (int, "a number"), (float, "a number")):
        if isinstance(value, t):
            return word
    return "null" if value is None else type(value).__name__
