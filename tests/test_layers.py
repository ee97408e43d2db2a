"""The import contract of pcieprof (docs/design.md): measure -> bundle -> analysis -> tune ->
report -> commands, read from the source (every import statement, top-level or not).

Layers, lowest first; a module may import its own layer and the layers listed as below it:
- foundation (errors, schema, progress, units, cards, the package itself): imported by all;
- bundle: the results bundle, its typed rows and documents;
- measure (probes, discover, importers, sim, serve, refserver, probe_runner, measurement,
  node_group, selftest) and analysis: both stand on the bundle and never import each other (measuring
  never analyses, analysis never measures); within measure, no probe imports what runs probes
  (no import back up);
- tune: decides from analysis;
- report: draws what the bundle saved (analysis, the bundle's documents); it reaches no tuner
  and no launch search, directly or through others;
- commands (commands, cli, __main__): wire everything.
No two components (top-level modules or packages of pcieprof; each module of probes/, a directory
of separate entry points: workers and the GPU self-tests) may import each other, directly or
through others, and in pcieprof/ a function-local import of another component has to say why
it is not at the top (`# heavy: <reason>`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: component (pcieprof.<name> or probes) -> layer
LAYER_OF = {
    "pcieprof": "foundation", "pcieprof.errors": "foundation", "pcieprof.schema": "foundation",
    "pcieprof.progress": "foundation", "pcieprof.units": "foundation",
    "pcieprof.cards": "foundation", "pcieprof.redact": "foundation",
    "pcieprof.parent_death": "foundation", "pcieprof.loopback": "foundation",
    "pcieprof.proc_group": "foundation", "pcieprof.aio": "foundation",
    "pcieprof.bundle": "bundle",
    "probes": "measure", "pcieprof.discover": "measure", "pcieprof.importers": "measure",
    "pcieprof.sim": "measure", "pcieprof.serve": "measure", "pcieprof.refserver": "measure",
    "pcieprof.probe_runner": "measure", "pcieprof.measurement": "measure",
    "pcieprof.node_group": "measure", "pcieprof.selftest": "measure",
    "pcieprof.peer_plan": "measure",
    "pcieprof.analysis": "analysis",
    "pcieprof.tune": "tune",
    "pcieprof.report": "report",
    "pcieprof.commands": "commands", "pcieprof.cli": "commands", "pcieprof.__main__": "commands",
}

#: layer -> the layers it may import
MAY_IMPORT = {
    "foundation": {"foundation"},
    "bundle": {"foundation", "bundle"},
    "measure": {"foundation", "bundle", "measure"},
    "analysis": {"foundation", "bundle", "analysis"},
    "tune": {"foundation", "bundle", "analysis", "tune"},
    "report": {"foundation", "bundle", "analysis", "tune", "report"},
    "commands": {"foundation", "bundle", "measure", "analysis", "tune", "report", "commands"},
}


@dataclass(frozen=True)
class Import:
    """One import of a pcieprof or probes module."""

    source: str  # the importing module
    target: str  # the imported module
    line: int
    local: bool  # inside a function
    heavy_reason: bool  # the line says `# heavy: <why>`


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def component(module: str) -> str:
    parts = module.split(".")
    return module if parts[0] == "probes" else ".".join(parts[:2])


def layer(module: str) -> str:
    return LAYER_OF["probes" if module.split(".")[0] == "probes" else component(module)]


def source_files() -> list[Path]:
    return sorted([*(ROOT / "pcieprof").rglob("*.py"), *(ROOT / "probes").rglob("*.py")])


def imports_of(path: Path) -> list[Import]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    local_nodes = {id(n) for f in ast.walk(tree)
                   if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(f)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
            else:
                targets = [node.module or ""]
            # `from pcieprof.sim import model` imports the module pcieprof.sim.model
            targets = [f"{targets[0]}.{a.name}" if _is_module(f"{targets[0]}.{a.name}") else targets[0]
                       for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for t in targets:
            if t.split(".")[0] in ("pcieprof", "probes"):
                out.append(Import(module, t, node.lineno, id(node) in local_nodes,
                                  "# heavy:" in lines[node.lineno - 1]))
    return out


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def all_imports() -> list[Import]:
    return [i for f in source_files() for i in imports_of(f)]


def test_every_component_has_a_layer() -> None:
    missing = sorted({component(module_name(f)) for f in source_files()
                      if not module_name(f).startswith("probes")} - set(LAYER_OF))
    assert not missing, f"give these a layer in LAYER_OF (and docs/design.md): {missing}"


def test_no_import_against_the_layers() -> None:
    bad = []
    for i in all_imports():
        src, dst = layer(i.source), layer(i.target)
        if dst not in MAY_IMPORT[src]:
            bad.append(f"{i.source}:{i.line} ({src}) imports {i.target} ({dst})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_cycle_between_components() -> None:
    edges: dict[str, set[str]] = {}
    for i in all_imports():
        a, b = component(i.source), component(i.target)
        if a != b:
            edges.setdefault(a, set()).add(b)
    assert not _cycles(edges), _cycles(edges)


def test_no_cycle_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for i in all_imports():
        if i.source != i.target and not i.target.startswith(i.source + "."):
            edges.setdefault(i.source, set()).add(i.target)
    assert not _cycles(edges), _cycles(edges)


def test_function_local_imports_of_other_components_say_why() -> None:
    """In pcieprof/, such imports used to work around import loops; the layering removed the
    loops. One that stays is there for start-up time (it pulls in torch, a driver library...)
    and says so: `# heavy: <reason>`. (probes/ are separate entry points, where the order of
    imports can matter to CUDA; they are not held to this.)"""
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in all_imports()
           if i.local and i.source.startswith("pcieprof") and not i.heavy_reason
           and component(i.source) != component(i.target)]
    assert not bad, "\n".join(bad)


def test_the_contract_sees_the_known_directions() -> None:
    """The checks above read real imports: the commands import every layer, tune imports
    analysis, and nothing in analysis imports a measuring component."""
    imps = all_imports()
    layers_used_by = {}
    for i in imps:
        layers_used_by.setdefault(layer(i.source), set()).add(layer(i.target))
    assert layers_used_by["commands"] >= {"measure", "analysis", "tune", "report", "bundle"}
    assert "analysis" in layers_used_by["tune"] and "measure" not in layers_used_by["analysis"]
    assert "bundle" in layers_used_by["measure"]


#: The modules that run probes (launch the workers, or drive the session that does).
RUNS_PROBES = ("pcieprof.measurement", "pcieprof.probe_runner", "pcieprof.node_group",
               "pcieprof.selftest", "pcieprof.sim.backend")
#: What decides: the tuner and the launch search (the report reads what they saved).
DECIDES = ("pcieprof.tune.recommend", "pcieprof.tune.rules", "pcieprof.tune.launch",
           "pcieprof.tune.search", "pcieprof.tune.space", "pcieprof.tune.learn",
           "pcieprof.tune.verify", "pcieprof.commands")


def _reached(start: set[str], imps: list[Import]) -> dict[str, str]:
    """Module -> the module that first imported it, for everything `start` imports, directly or
    through others."""
    edges: dict[str, set[str]] = {}
    for i in imps:
        edges.setdefault(i.source, set()).add(i.target)
    seen: dict[str, str] = {}
    todo = list(start)
    while todo:
        m = todo.pop()
        for t in edges.get(m, ()):
            # `import pcieprof.tune.x` runs pcieprof.tune's __init__ too, which imports nothing
            if t not in seen and t not in start:
                seen[t] = m
                todo.append(t)
    return seen


def test_no_probe_imports_what_runs_probes() -> None:
    """A probe runs inside the processes the runner starts: importing the runner (or the session
    above it) would be an import back up, the loop the layers exist to prevent."""
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in all_imports()
           if i.source.startswith("probes") and i.target.startswith(RUNS_PROBES)]
    assert not bad, "\n".join(bad)


def test_the_report_reaches_no_tuner_and_no_search() -> None:
    """The report draws saved documents (recommendations.json, serve/search.json, ...): nothing
    it imports, directly or through others, runs the tuner, its rules or the launch search."""
    imps = all_imports()
    report = {i.source for i in imps if i.source.startswith("pcieprof.report")}
    reached = _reached(report, imps)
    bad = sorted(f"{m} (through {by})" for m, by in reached.items() if m.startswith(DECIDES))
    assert report and not bad, "the report reaches: " + ", ".join(bad)



#: The tuner and the code that wires it into the commands.
TUNER = ("pcieprof.tune", "pcieprof.commands.tuning")


def test_the_report_imports_no_tuner() -> None:
    """pcieprof/report and `pcieprof report` (commands/report.py) import nothing of tune/ or
    commands/tuning, directly or through others (the VM words they share with `compare` and the
    rules live in analysis/vm_words.py)."""
    imps = all_imports()
    start = {i.source for i in imps if i.source.startswith("pcieprof.report")}
    reached = _reached(start, imps)
    bad = [f"{i.source}:{i.line} imports {i.target}" for i in imps
           if (i.source.startswith("pcieprof.report") or i.source == "pcieprof.commands.report")
           and i.target.startswith(TUNER)]
    bad += sorted(f"{m} (through {by})" for m, by in reached.items() if m.startswith(TUNER))
    assert not bad, "\n".join(bad)
    assert not [i for i in imps if i.source == "pcieprof.commands.report"
                and i.target.startswith(TUNER)]


def test_the_report_command_reaches_the_tuner_only_through_recommends_save() -> None:
    """`pcieprof report` draws what the bundles saved: recommend's result reaches the page only
    as written into the bundle by pcieprof.commands.recommend (save_for_report); take that one
    door away and nothing the command imports, directly or through others, runs the tuner, its
    rules or the launch search, or wires them (commands/tuning)."""
    imps = all_imports()
    cmd = "pcieprof.commands.report"
    assert any(i.source == cmd and i.target == "pcieprof.commands.recommend" for i in imps)
    reached = _reached({cmd}, [i for i in imps if i.target != "pcieprof.commands.recommend"])
    runs_tuner = (*(d for d in DECIDES if d != "pcieprof.commands"), "pcieprof.commands.tuning")
    bad = sorted(f"{m} (through {by})" for m, by in reached.items() if m.startswith(runs_tuner))
    assert not bad, "the report command reaches: " + ", ".join(bad)
