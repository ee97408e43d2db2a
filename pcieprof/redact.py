"""Masking secrets in everything pcieprof records or prints: the one place that knows what a
secret looks like.

A secret arrives as an environment variable (`HF_TOKEN`, `*_TOKEN`, `*_KEY`, `*_SECRET`,
`*PASSWORD*`, ...: by its name), as the value of a command-line flag of such a name (`--api-key X`,
`--api-key=X`, `--hf-token X`), or as the credentials of a URL (`https://user:pass@host`).
`redact(x)` masks all three in a string, an argv list, an environment mapping or a JSON-like
document; the process that is launched still gets the real values (only what is written down or
shown passes through here).

Every secret value seen is remembered for the life of the process, so that the same value is
masked wherever else it shows up afterwards, e.g. in a server log line that quotes its own
arguments in a shape no pattern here knows.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence, TypeVar

#: What a masked value reads as.
MASK = "***"

#: Values shorter than this are masked where their name says secret, but not hunted for as plain
#: text elsewhere: a 3-character value would blank unrelated words.
MIN_REMEMBERED = 6

# A secret's name, as environment variables (HF_TOKEN, MY_API_KEY, DB_PASSWORD) and flags
# (--api-key, --hf-token) spell it, once upper-cased with - and . read as _.
_SECRET_SUFFIX = re.compile(
    r"(?:^|_)(?:TOKEN|KEY|SECRET|APIKEY|CREDENTIALS?|AUTHORIZATION|COOKIE|PASSPHRASE)$")
_LONGEST_NAME = 128  # longer words are not taken for names

# scheme://userinfo@ : the whole userinfo (user:pass, or a token given as the user) goes.
_URL_CREDS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*+://)(?P<info>[^\s/@'\"]++)@")

# A name and what joins it to its value: NAME=, NAME: , 'NAME': , --flag=, api_key=' (a shell
# line, a repr, a log line, a JSON document), or --flag followed by spaces (a shell line). Names
# start where a word starts and are taken whole (possessive), so a scan is one linear pass; the
# name is judged in Python and only a secret's value is matched (_VALUE) and masked.
_NAME_SEP = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*+)"
    r"(?:(?P<q>['\"]?)(?P<sep>[ \t]*[=:][ \t]*)|(?P<space>[ \t]+)(?!-))")
_VALUE = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|[^\s,;'\")}\]&]+")

_known: set[str] = set()

T = TypeVar("T")


def is_secret_name(name: str) -> bool:
    """Whether a variable or flag of this name holds a secret (`HF_TOKEN`, `--api-key`)."""
    norm = name.strip().lstrip("-").upper().replace("-", "_").replace(".", "_")
    if not norm or len(norm) > _LONGEST_NAME:
        return False
    return "PASSWORD" in norm or "PASSWD" in norm or _SECRET_SUFFIX.search(norm) is not None


def remember(value: str) -> None:
    """Mask `value` wherever it appears from now on (values under MIN_REMEMBERED characters,
    and masks, are not hunted for as plain text)."""
    value = value.strip().strip("'\"")
    if len(value) >= MIN_REMEMBERED and value != MASK:
        _known.add(value)


def remember_environ(environ: Mapping[str, str] | None = None) -> None:
    """Remember the secret values of an environment (this process's by default), so that what
    a child inherits from it is masked wherever it is quoted."""
    for k, v in (os.environ if environ is None else environ).items():
        if is_secret_name(k):
            remember(v)


def _mask_url(m: re.Match[str]) -> str:
    info = m.group("info")
    remember(info)
    if ":" in info:
        remember(info.split(":", 1)[1])
    return f"{m.group('scheme')}{MASK}@"


def _assignments(text: str) -> str:
    out: list[str] = []
    done = 0
    for m in _NAME_SEP.finditer(text):
        if m.start() < done:
            continue  # inside a value already masked
        name = m.group("name")
        if m.group("space") is not None and not name.startswith("-"):
            continue  # `word value` is prose; only `--flag value` passes a value
        if not is_secret_name(name):
            continue
        v = _VALUE.match(text, m.end())
        if v is None:
            continue
        val = v.group(0)
        remember(val)
        quote = val[0] if val[:1] in ("'", '"') and len(val) > 1 and val[-1] == val[0] else ""
        out.append(text[done:m.end()] + quote + MASK + quote)
        done = v.end()
    return "".join(out) + text[done:] if out else text


def _text(text: str) -> str:
    text = _URL_CREDS.sub(_mask_url, text)
    text = _assignments(text)
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def _argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    secret_next = False
    for tok in argv:
        if secret_next and not tok.startswith("-"):
            remember(tok)
            out.append(MASK)
            secret_next = False
            continue
        secret_next = tok.startswith("-") and "=" not in tok and is_secret_name(tok)
        out.append(_text(tok))
    return out


def _mapping(env: Mapping[Any, Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for k, v in env.items():
        if is_secret_name(str(k)) and v not in (None, ""):
            if isinstance(v, str):
                remember(v)
            out[k] = MASK
        else:
            out[k] = redact(v)
    return out


def redact(x: T) -> T:
    """`x` with its secrets masked; the one function everything recorded or printed goes through.

    Args:
        x: a string (a log line, a shell command, a message); a list or tuple of strings (an
            argv: `--api-key X` masks X, `--env HF_TOKEN=X` masks X); a mapping (an environment
            or a JSON document: the value of a key with a secret's name is masked, the others
            are redacted in turn); anything else is returned as it is.

    Returns:
        The same shape with every secret replaced by MASK (`***`).
    """
    if isinstance(x, str):
        return _text(x)  # type: ignore[return-value]
    if isinstance(x, Mapping):
        return _mapping(x)  # type: ignore[return-value]
    if isinstance(x, (list, tuple)):
        out = _argv(x) if all(isinstance(t, str) for t in x) else [redact(t) for t in x]
        return (tuple(out) if isinstance(x, tuple) else out)  # type: ignore[return-value]
    return x


__all__ = ["MASK", "is_secret_name", "redact", "remember", "remember_environ"]
