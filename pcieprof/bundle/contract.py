"""Every file a bundle may hold: its name (a glob), its kind, who writes it, what it holds, and
the typed row or document class it is read through.

`Bundle.register` refuses a file the contract does not name, so nothing lands in a bundle
unlisted; docs/bundle.md's file table is `markdown()` (tests/bundle/test_contract.py keeps the two
equal).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from pcieprof.bundle import rows
from pcieprof.bundle.attribution import Attribution
from pcieprof.bundle.comm_model import CommModel
from pcieprof.bundle.document import Document
from pcieprof.bundle.host_tree import HostPcieTree
from pcieprof.bundle.manifest import Manifest
from pcieprof.bundle.model import ModelCardFile
from pcieprof.bundle.nccl_choices import NcclChoices
from pcieprof.bundle.nccl_graph import NcclGraph
from pcieprof.bundle.nccl_topo import NcclTopo
from pcieprof.bundle.plan import Plan
from pcieprof.bundle.recommendations import Recommendations
from pcieprof.bundle.serve_command import RecordedCommand
from pcieprof.bundle.server_info import ServerInfo
from pcieprof.bundle.serve_search import ServeSearch
from pcieprof.bundle.serve_summary import ServeSummary
from pcieprof.bundle.served_card import ServedCard
from pcieprof.bundle.topology import Topology


@dataclass(frozen=True)
class BundleFile:
    """One file (or a family of files) of the contract.

    Attributes:
        name: the path in the bundle, a glob where a family (`nccl/*.log`).
        kind: `manifest`, `table` (CSV, typed rows), `document` (JSON, typed), `json` (JSON kept
            as written, described here), `text` (logs, shell, XML, HTML), `data` (bytes kept as
            they came: imported files, traces).
        written_by: the command or module that writes it.
        what: what it holds, in one line.
        read_as: the class it is read through (rows or a document), or None.
    """

    name: str
    kind: str
    written_by: str
    what: str
    read_as: type | None = None

    def matches(self, path: str) -> bool:
        return fnmatch.fnmatchcase(path, self.name)


def _table(table: str, written_by: str, what: str) -> BundleFile:
    cls = rows.TABLES[table]
    return BundleFile(cls.FILE, "table", written_by, what, cls)


def _doc(cls: type[Document] | type[NcclChoices], written_by: str, what: str) -> BundleFile:
    return BundleFile(cls.FILE, "document", written_by, what, cls)


FILES: tuple[BundleFile, ...] = (
    BundleFile("manifest.json", "manifest", "every writer (pcieprof.bundle)",
               "schema_version, command, provenance (source, backend), versions, per-part status, "
               "the files listed here", Manifest),
    _doc(Topology, "topology (discovery), import, sim",
         "GPUs, pairwise levels and P2P status, PCIe tree, IOMMU, ACS, virtualization, NUMA"),
    _doc(Plan, "topology, recommend --verify",
         "the measurement plan the probes ran: cases, sizes, variants, deadlines (built by "
         "probes.plan.build_plan)"),
    _table("p2p", "topology (copy probes), import, sim", "one row per copy measurement"),
    _table("concurrent", "topology (copy probes), import, sim",
           "several copies at once: a row per flow and the aggregate"),
    _table("allreduce", "topology (all-reduce sweep), import, sim, recommend --verify",
           "one row per variant, group and message size"),
    _doc(NcclChoices, "topology (cuda: parsed NCCL logs; sim: the model's assumption), import",
         "what NCCL chose per case: version, transport per peer, channels, rings, tuner"),
    BundleFile("nccl/*.log", "text", "topology (cuda, cpu)",
               "NCCL_DEBUG=INFO output of each timed all-reduce launch (INIT/ENV/GRAPH), and "
               "`<variant>.tuning.log` of the untimed launch before it (NCCL's TUNING lines); "
               "torchrun's output first, then each rank's NCCL lines in rank order (written by "
               "NCCL to a file per rank, NCCL_DEBUG_FILE, so none is lost or cut)"),
    BundleFile("nccl/*.graph.xml", "text", "topology (cuda)",
               "NCCL's own ring graph of the plain order, or the NCCL_GRAPH_FILE written for a "
               "--ring-order (docs/probes.md)"),
    BundleFile("logs/copies-*.log", "text", "topology (cuda, cpu)", "output of each copy-probe launch"),
    BundleFile("imported/*", "data", "import", "the original bytes of every imported file"),
    BundleFile("nccl_topo*.json", "document", "import",
               "an imported NCCL topology XML, parsed: CPUs, PCI nodes, GPUs, NICs, whether the "
               "tree is a VM's flat one", NcclTopo),
    BundleFile("nccl_graph*.json", "document", "import",
               "an imported NCCL graph XML, parsed: its graphs and their channels", NcclGraph),
    BundleFile("model_card.json", "document", "topology, serve-bench, recommend, attribute --model",
               "the model card the bundle is for, in full (a card file's tables as JSON; the "
               "manifest's `model` names it), so the bundle reads the same card anywhere",
               ModelCardFile),
    _doc(ServedCard, "serve-bench", "the model card served: name and file"),
    _doc(RecordedCommand, "serve-bench",
         "the first launch's argv, environment, notes and the recorded environment"),
    _doc(ServerInfo, "serve-bench --url",
         "what an attached server's /get_server_info answered, its keys as the server gave them"),
    BundleFile("serve/attempts.jsonl", "text", "serve-bench",
               "one JSON line per launch attempt (`Attempt`, read by serve_search.read_attempts): "
               "config, argv, env, outcome, times, log excerpt, last start-up progress line, and "
               "for a launch search the step that chose it"),
    _doc(ServeSearch, "serve-bench --sweep",
         "the launch search: axes with values in search order and the claims behind them, the "
         "learning rules, excluded values, every attempt (as attempts.jsonl holds it: config, "
         "search step, outcome, deciding log line, time to failure), the winner as a command "
         "ready to paste, or why none"),
    BundleFile("serve/server-*.log", "text", "serve-bench", "each launched server's output"),
    BundleFile("serve/requests.jsonl", "text", "serve-bench",
               "one JSON line per request: TTFT, E2E, chunk gaps and tokens, lengths, error"),
    _doc(ServeSummary, "serve-bench", "per load run mean/median/p90/p99/n of ttft_ms, tpot_ms, "
         "itl_ms, e2el_ms, throughputs, the formulas used; the decode curve; the profiler capture"),
    _table("decode_curve", "serve-bench", "the fixed-batch decode step time per batch size"),
    BundleFile("serve/traces/*", "data", "serve-bench",
               "one Kineto trace per rank (and stage), and index.json: what was asked and found"),
    _doc(Attribution, "serve-bench, attribute",
         "decode time per rank and step: communication, compute, overlap, exposed, idle, skew"),
    BundleFile("attribution/*.csv", "text", "serve-bench, attribute",
               "attribution.json's tables (per_rank, per_step, per_class, top_kernels, classes) "
               "and comm_model.csv"),
    _doc(CommModel, "attribute --model --topology",
         "the analytic model's collectives priced per batch next to the measured step"),
    _doc(Recommendations, "recommend (and report, topology before they draw)",
         "the bottleneck, the recommendations with evidence and gains, the ring, the inferred "
         "fabric, the parallel layouts, what needs measuring"),
    BundleFile("tune/nccl_graph.xml", "text", "recommend", "NCCL_GRAPH_FILE with the searched ring"),
    BundleFile("tune/nccl_topo.xml", "text", "recommend",
               "NCCL_TOPO_FILE describing the real tree pcieprof has seen, when a VM hides it "
               "(a simulated VM's host tree, or tune/host_pcie_tree.json)"),
    BundleFile("tune/nccl_tuner.conf", "text", "recommend",
               "NCCL_TUNER_CONFIG_FILE for NCCL's example tuner plugin: a protocol per "
               "all-reduce size range, when a global NCCL_PROTO would slow a phase"),
    _doc(HostPcieTree, "recommend --host-lspci",
         "the PCIe tree of the user's lspci -vvv of the GPUs' host (source, tree)"),
    BundleFile("tune/recommended.env", "text", "recommend",
               "the recommended environment, each line with its reason"),
    BundleFile("tune/sglang_command.sh", "text", "recommend",
               "the SGLang launch of the top-ranked layout with that environment"),
    BundleFile("report.html", "text", "topology, report", "the offline report (rebuildable)"),
)

#: Directories a bundle may hold that are not its own files.
NESTED = {"verify": "recommend --verify: the re-run, itself a bundle (command recommend-verify)"}


def entry(path: str) -> BundleFile | None:
    """The contract entry of a path inside a bundle (`/` separated), or None."""
    return next((f for f in FILES if f.matches(path)), None)


def _type_name(cls: type | None) -> str:
    if cls is None:
        return ""
    tag = getattr(cls, "FORMAT", "")
    version = getattr(cls, "VERSION", "")
    if tag:
        key = getattr(cls, "TAG_KEY", "format")
        return f"`{cls.__name__}` ({key} {tag}/{version})" if key == "format" else \
            f"`{cls.__name__}` ({key} {version})"
    return f"`{cls.__name__}`"


def markdown() -> str:
    """The file table of docs/bundle.md."""
    lines = ["| file | kind | written by | what | read as |", "|---|---|---|---|---|"]
    for f in FILES:
        lines.append(f"| `{f.name}` | {f.kind} | {f.written_by} | {f.what} | "
                     f"{_type_name(f.read_as)} |")
    for name, what in NESTED.items():
        lines.append(f"| `{name}/` | bundle | {what.split(':')[0]} | {what.split(': ', 1)[1]} | |")
    return "\n".join(lines) + "\n"
