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
from typing import Any, Iterator, Mapping, Sequence, TypeVar

#: What a masked value reads as.
MASK = "***"

#: Values shorter than this are masked where their name says secret, but not hunted for as plain
#: text elsewhere: a 3-character value would blank unrelated words.
MIN_REMEMBERED = 6

# A secret's name, as environment variables (HF_TOKEN, MY_API_KEY, DB_PASSWORD) and flags
# (--api-key, --hf-token) spell it, once upper-cased with - and . read as _.
# PASS (SGLANG_PASS) and HOOK (a webhook URL whose path is its secret) as whole words only: PWD
# is the working directory, and *_PASSES or HOOKS would be counts.
_SECRET_SUFFIX = re.compile(
    r"(?:^|_)(?:TOKEN|KEY|SECRET|APIKEY|CREDENTIALS?|AUTHORIZATION|COOKIE|PASSPHRASE|PASS|"
    r"AUTH|HOOK|WEBHOOK)$")
_LONGEST_NAME = 128  # longer words are not taken for names

# scheme:// of a URL; what follows it up to the URL's last `@` is its userinfo (_url_creds).
_SCHEME = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*+://")
# What may follow a URL's userinfo: a host name or address with its port.
_HOST = re.compile(r"[A-Za-z0-9._~%\[\]:-]+")
# A run of text without blanks or quotes: a URL lies inside one.
_WORD = re.compile(r"[^\s'\"]+")

# A name and what joins it to its value: NAME=, NAME: , 'NAME': , --flag=, api_key=' (a shell
# line, a repr, a log line, a JSON document), or --flag followed by spaces (a shell line). Names
# start where a word starts and are taken whole (possessive), so a scan is one linear pass; the
# name is judged in Python and only a secret's value is matched (_VALUE) and masked.
_NAME_SEP = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*+)"
    r"(?:(?P<q>['\"]?)(?P<sep>[ \t]*[=:][ \t]*)|(?P<space>[ \t]+)(?!-))")
# An unquoted value runs to the next blank or quote: a secret may hold `,;&)]}` (a value cut at
# one of them would leave its rest in clear), so a closing `)` after it may be masked too.
_VALUE = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"|[^\s'\"]+")
# An argv token NAME=value or --flag=value: everything after the first `=` is the value.
_ARG_ASSIGN = re.compile(r"(?P<name>-{0,2}[A-Za-z_][A-Za-z0-9_.-]*)=(?P<value>.*)", re.S)

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


def _url_creds(text: str) -> str:
    """Mask the userinfo of every URL: `scheme://` to its authority's last `@` (a password may
    hold `@`: `http://u:p@ss@host`; where no host follows that `@`, to the URL's last); where the authority up to the first `/` has no `@` but a
    `:` (`s3://AKIA:se/c@b`: user:password with a `/`), to the URL's last `@`. A path's `@`
    after a plain host (`https://host/a@b`) is left alone; after a port it is masked with it,
    the safe side. One pass over each word: linear."""
    out: list[str] = []
    done = 0
    for w in _WORD.finditer(text):
        word = w.group(0)
        if "://" not in word or "@" not in word:
            continue
        starts = [m for m in _SCHEME.finditer(word)]
        for i, m in enumerate(starts):
            end = starts[i + 1].start() if i + 1 < len(starts) else len(word)
            seg = word[m.end():end]
            head = seg.split("/", 1)[0]  # the authority, unless a password holds a `/`
            at = head.rfind("@") if "@" in head else seg.rfind("@") if ":" in head else -1
            if 0 < at and not _HOST.fullmatch(head[at + 1:]):
                at = seg.rfind("@")  # no host after it (`u:p@/x@host`): the password goes on
            if at <= 0:
                continue
            info = seg[:at]
            remember(info)
            if ":" in info:
                remember(info.split(":", 1)[1])
            out.append(text[done:w.start() + m.end()] + MASK)
            done = w.start() + m.end() + at
    return "".join(out) + text[done:] if out else text


def _secret_names(text: str) -> Iterator[re.Match[str]]:
    """The places in `text` where a secret's name is joined to its value (_NAME_SEP)."""
    for m in _NAME_SEP.finditer(text):
        name = m.group("name")
        if m.start() > 0 and text[m.start() - 1] == "#":
            continue  # `#new-token: 7`: SGLang's counters, not secrets
        if m.group("space") is not None and not name.startswith("-"):
            continue  # `word value` is prose; only `--flag value` passes a value
        if is_secret_name(name):
            yield m


def _assignments(text: str) -> str:
    out: list[str] = []
    done = 0
    for m in _secret_names(text):
        if m.start() < done:
            continue  # inside a value already masked
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
    # Known values first: a pattern below could cut one at a character it stops at, and the
    # rest would then no longer be found.
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    text = _url_creds(text)
    return _assignments(text)


def _arg(tok: str) -> str:
    """One argv token: NAME=value / --flag=value of a secret name masks all after the `=`."""
    m = _ARG_ASSIGN.fullmatch(tok)
    if m is not None and is_secret_name(m.group("name")) and m.group("value"):
        remember(m.group("value"))
        return f"{m.group('name')}={MASK}"
    return _text(tok)


def unfinished_at(text: str) -> int:
    """Where the end of `text` may cut a secret short: the index from which it must wait for
    what follows before it is masked and written (len(text) when nothing is at stake). For a
    copier that writes an unfinished line after a pause (pcieprof.serve.launcher): a secret
    printed in two bursts would otherwise go out as an unmasked head and a tail.

    Held back: a tail that begins a remembered value; a secret's name whose value is missing,
    unclosed or reaches the end; the last word when nothing follows it (a URL's credentials, a
    name still being printed)."""
    cut = len(text)
    for value in _known:
        first = value[0]
        for j in range(max(0, len(text) - len(value) + 1), len(text)):
            if text[j] == first and value.startswith(text[j:]):
                cut = min(cut, j)
                break
    for m in _secret_names(text):
        v = _VALUE.match(text, m.end())
        if v is None or v.end() == len(text):
            cut = min(cut, m.start())
    if text and not text[-1].isspace():
        start = len(text)
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        cut = min(cut, start)
    return cut


def _argv(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    secret_next = False
    for tok in argv:
        if secret_next and not tok.startswith("--"):  # a key may start with one `-`
            remember(tok)
            out.append(MASK)
            secret_next = False
            continue
        secret_next = tok.startswith("-") and "=" not in tok and is_secret_name(tok)
        out.append(_arg(tok))
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


__all__ = ["MASK", "is_secret_name", "redact", "remember", "remember_environ", "unfinished_at"]
