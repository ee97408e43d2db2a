"""The results bundle: a directory written incrementally, read by analysis, tuning and the report.

Layout (see docs/bundle.md): `manifest.json` (versioned, per-part status and provenance), JSON
documents (`topology.json`, `attribution.json`, ...) replaced atomically, and CSV tables
(`p2p.csv`, `allreduce.csv`, ...) appended row by row and flushed, so a crash or Ctrl-C keeps every
row measured so far. A bundle starts as `partial` and only becomes `ok` when its writer finishes.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import platform
import shutil
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, TypeVar

from pcieprof import __version__, progress
from pcieprof.errors import BadInput
from pcieprof.redact import redact
from pcieprof.bundle import contract, outdir
from pcieprof.bundle import rows as R
from pcieprof.bundle import writer
from pcieprof.bundle.document import Readable
from pcieprof.bundle.manifest import FILE as MANIFEST
from pcieprof.bundle.manifest import Manifest, Part
from pcieprof.bundle.model import ModelCardFile, ModelRecord
from pcieprof.cards import ModelCard
from pcieprof.bundle.nodes import NodeLayout
from pcieprof.schema import Status

if TYPE_CHECKING:  # pandas costs ~0.3 s to import; only readers of tables pay for it
    import pandas as pd

DocT = TypeVar("DocT", bound=Readable)


def now_iso() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status); elsewhere by
    setting and restoring it."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def file_mode() -> int:
    """The mode of every file pcieprof writes into a bundle or as a report: 0666 minus the
    umask, what `open(path, "w")` gives a new file (0644 under the usual umask 022)."""
    return 0o666 & ~_umask()


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new file, never half of one.

    The file gets `file_mode()` (a temporary file is created 0600; the CSVs, appended in
    place, get the umask's mode: every file of a bundle has the same one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), file_mode())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _cannot(path: Path, what: str, exc: OSError) -> BadInput:
    shown = str(path) if len(str(path)) <= 120 else f"{str(path)[:60]}...{str(path)[-40:]}"
    blocker = next((p for p in path.parents if _is_file(p)), None)
    why = f"{blocker} is a file" if blocker is not None else (exc.strerror or str(exc))
    return BadInput(f"{shown}: cannot {what} ({why})",
                    hint="choose an --out in a writable directory")


def _is_file(path: Path) -> bool:
    try:
        return path.exists() and not path.is_dir()
    except OSError:
        return False


def prepare_out_dir(path: Path, *, force: bool, inputs: Sequence[Path | str] = ()) -> None:
    """Make `path` a directory to write a bundle into, locked for this process, or refuse with
    one line (BadInput); the rules are pcieprof.bundle.outdir's.

    Args:
        path: the output directory (`--out`).
        force: replace the bundle a non-empty directory holds (its own files only) instead of
            refusing it.
        inputs: the files and directories the command reads: `path` must not be or hold one.
    """
    outdir.refuse_inputs_inside(path, inputs)
    try:
        if path.exists() and not path.is_dir():
            raise BadInput(f"{path}: expected a directory for the output, got an existing file")
        path.mkdir(parents=True, exist_ok=True)
        outdir.lock(path)  # before looking inside: a second writer is refused here
    except OSError as exc:
        raise _cannot(path, "create the output directory", exc) from None
    try:
        if any(path.iterdir()):
            if not force:
                raise BadInput(f"output directory {path} exists and is not empty",
                               hint="choose another --out or pass --force")
            outdir.clear_bundle(path)
    except BaseException as exc:
        outdir.unlock(path)
        if isinstance(exc, OSError):
            raise _cannot(path, "replace the bundle in the output directory", exc) from None
        raise


def prepare_out_file(path: Path) -> None:
    """Check before any work that a file can be written at `path` (its directory is created),
    or refuse with one line (BadInput): a directory, an unwritable or impossible place."""
    try:
        if path.is_dir():
            raise BadInput(f"{path}: expected a file name to write, got a directory",
                           hint=f"e.g. -o {path / 'report.html'}")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise _cannot(path, "write the output file", exc) from None


def _whole_records(text: str) -> int:
    """Where the last whole record of CSV `text` ends: after its last line break that lies
    outside quotes, or at the end where the text after that break is a row with every field of
    the header (a file written without a final line break); 0: not even a whole header. Rows
    are appended, so a tear (a kill, a full disk) can only cut the last one, and it may cut it
    inside a quoted field; found from the end, counting quotes, in one pass."""
    quotes = text.count('"')
    pos, after = len(text), 0
    end = 0
    while pos > 0:
        nl = text.rfind("\n", 0, pos)
        if nl < 0:
            break
        after += text.count('"', nl + 1, pos)
        if (quotes - after) % 2 == 0:
            end = nl + 1
            break
        pos = nl
    tail = text[end:]
    if tail.strip() and tail.count('"') % 2 == 0:
        header = next(csv.reader([text.split("\n", 1)[0]]), [])
        if end == 0 or len(next(csv.reader([tail]), [])) == len(header):
            return len(text)
    return end


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "value"):  # enums
        return obj.value
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _clean_nan(obj: Any) -> Any:
    """JSON has no NaN: store it as null so that browsers and other tools can read the file."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean_nan(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_nan(v) for v in obj]
    return obj


def dumps(obj: Any) -> str:
    """The JSON encoding used for every bundle document."""
    return json.dumps(_clean_nan(obj), indent=2, default=_json_default, allow_nan=False) + "\n"


#: Bundles this process created and has not finished (by path): what an interrupt leaves
#: partial, named by the CLI's one interrupt handler (pcieprof.cli).
_UNFINISHED: dict[Path, "Bundle"] = {}


def unfinished() -> list["Bundle"]:
    """The bundles this process created and did not finish, oldest first."""
    return list(_UNFINISHED.values())


def forget_unfinished() -> None:
    """Start a new command invocation in this process (pcieprof.cli.main): the bundles of an
    earlier one, and the --out locks it held, are not its own."""
    _UNFINISHED.clear()
    outdir.release_locks()


class Bundle:
    """A results bundle directory.

    Use `Bundle.create` to start writing one and `Bundle.open` to read one.
    """

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest

    # -- creating and opening ------------------------------------------------------------------

    @classmethod
    def create(cls, path: Path | str, *, command: str, source: str, backend: str,
               force: bool = False, argv: list[str] | None = None,
               inputs: Sequence[Path | str] = ()) -> "Bundle":
        """Start a new bundle at `path`.

        Args:
            path: the directory; it must not exist or be empty unless `force`.
            command: the pcieprof subcommand that writes it (e.g. "topology").
            source: `measured`, `simulated` or `imported` (the main provenance).
            backend: `cuda`, `cpu`, `sim` or `imported`.
            force: reuse a bundle's directory, removing that bundle's own files.
            argv: the command line to record (defaults to sys.argv; secrets are masked).
            inputs: what the command reads (trace files, bundles): `path` must not hold one.
        """
        path = Path(path)
        prepare_out_dir(path, force=force, inputs=inputs)
        manifest = Manifest(
            pcieprof_version=__version__, command=command,
            argv=redact(list(sys.argv if argv is None else argv)), start_time=now_iso(),
            # A simulated bundle measured no machine, so it names none (the report says so too).
            host=None if source == "simulated" else socket.gethostname(),
            platform=platform.platform(), python=platform.python_version(),
            source=source, backend=backend,
            status=Status.PARTIAL.value,  # until finish(): a killed run stays 'partial'
            # who writes it: a reader finds the parts a dead writer left running (writer.py)
            writer=writer.record())
        bundle = cls(path, manifest)
        bundle.save_manifest()
        _UNFINISHED[path] = bundle
        return bundle

    @classmethod
    def open(cls, path: Path | str) -> "Bundle":
        """Open an existing bundle for reading (or adding parts), upgrading old manifests."""
        path = Path(path)
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise BadInput(f"{path} is not a pcieprof bundle (no {MANIFEST})")
        try:
            data = json.loads(mpath.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BadInput(f"{mpath}: unreadable manifest ({exc})") from None
        bundle = cls(path, Manifest.from_json(data, str(mpath)))
        bundle._settle_dead_writer()
        return bundle

    def check(self) -> "Bundle":
        """Read every table and typed document the bundle holds (pcieprof.bundle.contract), so
        that a bad one is refused with its one line before any work or output. Returns self.

        Raises:
            BadInput: the first file that is not what its reader expects.
        """
        for f in contract.FILES:
            if f.read_as is None:
                continue
            if f.kind == "document" and "*" in f.name:  # a family: each file of it
                for p in sorted(self.path.glob(f.name)):
                    self.read_doc(f.read_as, p.relative_to(self.path).as_posix())
            elif "*" in f.name or not (self.path / f.name).is_file():
                continue
            elif f.kind == "table":
                self.read_table(R.table_of(f.read_as))
            elif f.kind == "document":
                self.read_doc(f.read_as, f.name)
        return self

    def _settle_dead_writer(self) -> None:
        """Parts left `running` by a writer that is gone become `interrupted`, and so does the
        bundle (in memory: a reader that saves the manifest keeps it so)."""
        m = self.manifest
        left = [n for n, p in m.parts.items() if p.status == Status.RUNNING.value]
        if not (left or m.end_time is None) or writer.state(m.writer) != "gone":
            return
        assert m.writer is not None  # state() is "unknown" without a record
        why = (f"interrupted: its writer ({writer.describe(m.writer)}) ended without "
               "closing the bundle" + (f"; left running: {', '.join(left)}" if left else ""))
        for name in left:
            m.parts[name].status, m.parts[name].why = Status.INTERRUPTED.value, why
        m.status = Status.INTERRUPTED.value
        m.why = why

    def copy_to(self, path: Path | str, *, force: bool = False) -> "Bundle":
        """Copy the whole bundle to `path` and open the copy (e.g. `recommend --out`, which
        leaves the original untouched).

        Args:
            path: the directory; it must not exist or be empty unless `force`, and must not lie
                inside this bundle.
            force: replace what a non-empty directory holds.
        """
        path = Path(path)
        src = self.path.resolve()
        try:
            dst = path.resolve()
        except OSError as exc:
            raise _cannot(path, "create the output directory", exc) from None
        if dst == src or src in dst.parents:
            raise BadInput(f"{path} is the bundle {self.path} or inside it",
                           hint="choose a directory outside the bundle")
        prepare_out_dir(path, force=force, inputs=[self.path])
        # The copy's manifest goes first and says partial until every file is there: a copy cut
        # short (a full disk) reads as what it is, never as the finished original.
        copy = Bundle(path, dataclasses.replace(self.manifest, status=Status.PARTIAL.value,
                                                why=f"copy of {self.path} cut short"))
        try:
            copy.save_manifest()
            for dirpath, _dirs, names in os.walk(self.path):
                here = Path(dirpath)
                there = path / here.relative_to(self.path)
                there.mkdir(exist_ok=True)
                for name in names:
                    if here != self.path or name != MANIFEST:
                        shutil.copy2(here / name, there / name)
            Bundle(path, self.manifest).save_manifest()
        except OSError as exc:
            raise _cannot(path, f"copy {self.path} into it", exc) from None
        return Bundle.open(path)

    # -- manifest --------------------------------------------------------------------------------

    def save_manifest(self) -> None:
        """Replace manifest.json atomically with the in-memory manifest."""
        atomic_write_text(self.path / MANIFEST, dumps(self.manifest.to_json()))

    def set_part(self, name: str, status: str, *, why: str | None = None,
                 source: str | None = None, backend: str | None = None,
                 **extra: Any) -> None:
        """Record the status of one part (e.g. "p2p", "allreduce", "serve") and save.

        Args:
            name: the part.
            status: `running`, `ok`, `partial` or `failed`.
            why: the reason, for anything but `ok`.
            source: provenance of this part's numbers if it differs from the bundle's.
            backend: backend of this part if it differs from the bundle's.
            extra: further JSON-able facts about the part (counts, durations).
        """
        m = self.manifest
        if status == Status.RUNNING.value:
            _UNFINISHED.setdefault(self.path, self)  # e.g. serve-bench --resume
            if not writer.is_this_process(m.writer):
                m.writer = writer.record()  # another process goes on writing it
        old = m.parts.get(name, Part())
        m.parts[name] = Part(status=status, why=why, source=source or old.source or m.source,
                             backend=backend or old.backend or m.backend, updated=now_iso(),
                             extra={**old.extra, **extra})
        self.save_manifest()

    def set_nodes(self, layout: NodeLayout) -> None:
        """Record the nodes of a multi-node run (manifest `nodes`, pcieprof.bundle.nodes)."""
        self.manifest.nodes = layout
        self.save_manifest()

    def nodes(self) -> NodeLayout | None:
        """The nodes of a multi-node run, None for a one-node bundle."""
        nodes = self.manifest.nodes
        return nodes if nodes is not None and nodes.nnodes >= 2 else None

    def set_model(self, card: ModelCard) -> None:
        """Record the card the bundle is measured, served or tuned for: the manifest's `model`
        (pcieprof.bundle.model) and the card itself in model_card.json."""
        self.write_doc(ModelCardFile.of(card))
        self.manifest.model = ModelRecord.of_card(card)
        self.save_manifest()

    def model(self) -> ModelRecord | None:
        """The card the bundle was made for, None for a bundle that does not say."""
        return self.manifest.model

    def model_card(self) -> ModelCard | None:
        """The copy of the card the bundle holds (model_card.json), None without one.

        Raises:
            BadInput: a model_card.json that is not a card (one line).
        """
        doc = self.read_doc(ModelCardFile)
        return None if doc is None else doc.card(self.file(ModelCardFile.FILE))

    def set_versions(self, **versions: str | None) -> None:
        """Record tool versions (driver, cuda, nccl, torch, sglang)."""
        self.manifest.versions.update(versions)
        self.save_manifest()

    def finish(self) -> str:
        """Close the bundle: `ok` when every part is ok, else `partial` (or `failed`). Returns it."""
        m = self.manifest
        states = [p.status for p in m.parts.values()]
        if states and all(s == Status.OK.value for s in states):
            status = Status.OK.value
        elif states and all(s == Status.FAILED.value for s in states):
            status = Status.FAILED.value
        else:
            status = Status.PARTIAL.value
        for part in m.parts.values():
            if part.status == Status.RUNNING.value:
                part.status = Status.PARTIAL.value
                part.why = part.why or "did not finish"
        m.status = status
        m.end_time = now_iso()
        self.save_manifest()
        _UNFINISHED.pop(self.path, None)
        outdir.unlock(self.path)
        return status

    def interrupted(self, why: str) -> None:
        """Mark the bundle partial after Ctrl-C or an error; rows already written stay."""
        m = self.manifest
        for part in m.parts.values():
            if part.status == Status.RUNNING.value:
                part.status, part.why = Status.PARTIAL.value, why
        m.status = Status.PARTIAL.value
        m.end_time = now_iso()
        m.why = why
        self.save_manifest()

    def incomplete(self) -> str | None:
        """Why the bundle is not a finished `ok` one, in one line (None when it is): `partial`,
        `failed` or `interrupted`, with its reason and the parts that are not ok."""
        m = self.manifest
        status = str(m.status or "unknown")
        if status == Status.OK.value:
            return None
        if m.end_time is None and m.writer and writer.state(m.writer) == "running":
            return f"{status}: still being written ({writer.describe(m.writer)})"
        bad = [f"{n} {p.status}" for n, p in m.parts.items()
               if p.status not in (Status.OK.value, None)]
        said = [str(m.why)] if m.why else []
        said += [f"parts not ok: {', '.join(bad)}"] if bad else []
        return status + (f" ({'; '.join(said)})" if said else "")

    @property
    def source(self) -> str:
        return str(self.manifest.source or "")

    @property
    def backend(self) -> str:
        return str(self.manifest.backend or "")

    def part(self, name: str) -> Part | None:
        """A part's status record, or None when the bundle has no such part."""
        return self.manifest.parts.get(name)

    # -- files -----------------------------------------------------------------------------------

    def file(self, name: str) -> Path:
        """Path of a file inside the bundle (sub-directories are created)."""
        p = self.path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def has(self, name: str) -> bool:
        return (self.path / name).exists()

    def remove(self, name: str) -> None:
        """Delete a file a command writes only when it applies (a stale copy from an earlier
        run would read as this run's) and drop it from the manifest; absent: nothing to do."""
        (self.path / name).unlink(missing_ok=True)
        if name in self.manifest.files:
            self.manifest.files.remove(name)
            self.save_manifest()

    def write_json(self, name: str, obj: Any) -> Path:
        """Replace a JSON document atomically."""
        p = self.file(name)
        atomic_write_text(p, dumps(obj))
        self.register(name)
        return p

    def read_json(self, name: str, default: Any = None) -> Any:
        """Read a JSON document, or `default` when the bundle does not have it."""
        p = self.path / name
        if not p.is_file():
            return default
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise BadInput(f"{p}: not valid JSON ({exc})") from None

    def write_doc(self, doc: Any, name: str | None = None) -> Path:
        """Replace a typed document (pcieprof.bundle.document) atomically, at its FILE."""
        return self.write_json(name or doc.FILE, doc.to_json())

    def read_doc(self, cls: type[DocT], name: str | None = None) -> DocT | None:
        """A typed document, or None when the bundle does not have it.

        Raises:
            BadInput: unreadable JSON, the wrong shape, or a newer format than this pcieprof's.
        """
        name = name or cls.FILE
        data = self.read_json(name)
        return None if data is None else cls.from_json(data, str(self.path / name))

    def write_text(self, name: str, text: str) -> Path:
        p = self.file(name)
        atomic_write_text(p, text)
        self.register(name)
        return p

    def append_rows(self, table: str, rows: Iterable[R.Row | Mapping[str, Any]]) -> int:
        """Append rows to a table (header written once), flushed to disk before returning.

        Args:
            table: a name of `pcieprof.bundle.rows.TABLES` (`p2p`, `allreduce`, ...).
            rows: typed rows, or mappings of column -> value (missing columns get defaults).

        Returns:
            The number of rows written.

        Raises:
            ValueError: a column the table does not have (the schema is the contract).
        """
        rows = list(rows)
        if not rows:  # no rows, no file: a table that exists has something in it
            return 0
        name = R.TABLES[table].FILE
        p = self.file(name)
        new = not p.exists() or p.stat().st_size == 0
        n = 0
        with p.open("a", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=R.columns(table))
            if new:
                w.writeheader()
            for row in rows:
                w.writerow(R.encode(table, row))
                n += 1
            f.flush()
            os.fsync(f.fileno())
        self.register(name)
        return n

    def read_table(self, table: str) -> "pd.DataFrame":
        """A table as a DataFrame with every column (older files get defaults) and typed cells
        (`env` a dict, `ranks` a tuple). A missing table gives an empty frame of its columns."""
        import pandas as pd  # heavy: pandas

        p = self.path / R.TABLES[table].FILE
        try:
            text = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else ""
        except OSError as exc:
            raise BadInput(f"{p}: unreadable table ({exc.strerror or exc})") from None
        whole = _whole_records(text)
        if whole < len(text):  # the last row was cut short: a kill or a full disk mid-write
            progress.warn(f"{p}: its last row is cut short (a kill or a full disk while it was "
                          "written); read without it")
        if whole == 0:
            return R.decode_frame(table, pd.DataFrame({c: pd.Series(dtype=object if isinstance(
                v, (str, dict, tuple)) else type(v)) for c, v in R.defaults(table).items()}))
        try:
            # A row with extra fields (a writer gone wrong) is dropped, not fatal.
            df = pd.read_csv(io.StringIO(text[:whole]), keep_default_na=False,
                             na_values=["", "nan", "NaN"], on_bad_lines="skip")
        except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
            raise BadInput(f"{p}: unreadable table ({exc})") from None
        try:
            return R.decode_frame(table, df)
        except ValueError as exc:
            raise BadInput(f"{p}: {exc}") from None

    def rows(self, cls: type[R.RowT]) -> list[R.RowT]:
        """A table as typed rows: `bundle.rows(AllReduceRow)`."""
        table = R.table_of(cls)
        return [R.row_of(cls, rec) for rec in self.read_table(table).to_dict("records")]

    def register(self, name: str) -> None:
        """List a file in the manifest (write_json, write_text and append_rows do it; a file
        written into the bundle directly, a log or a trace, is registered by its writer).

        Raises:
            ValueError: a file the bundle contract (pcieprof.bundle.contract) does not name.
        """
        if contract.entry(name) is None:
            raise ValueError(f"{name} is not a file of the bundle contract "
                             "(add it to pcieprof/bundle/contract.py and docs/bundle.md)")
        files = self.manifest.files
        if name not in files:
            files.append(name)
            self.save_manifest()



def default_out_dir(command: str, root: Path | str = "reports") -> Path:
    """`reports/<command>-<UTC timestamp>`: where a command writes when --out is not given."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{command}-{stamp}"
