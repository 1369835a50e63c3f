"""The one-way rule: a stage never imports a stage after it; every module has a layer and
imports only from its own and those below; no import cycles.

Order: frame (the reader <-> worker format) -> runner -> render -> redact -> filter -> classify ->
spool -> store -> query (the read layer) -> reader (the read service). The sampler is a source
beside the runner: it knows nothing of spool or store either. ``pipeline`` (runner to spool, its
processes in ``capture``) and ``ship`` (spool to store) are the wiring modules; ``cli`` sits
on top of everything.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "logcapture"
ORDER = ["frame", "runner", "render", "redact", "filter", "classify", "spool", "store", "query",
         "reader"]
SOURCES_BESIDE = {"sampling": ORDER[ORDER.index("spool"):]}
# Libraries every reader and the shipper use, below all of them: pure functions of records.
# ``insights`` (diagnosis, efficiency notes, live checks) is handed lines, samples and a store
# object by its callers and imports none of the stages, readers or wiring.
LIBRARIES = {"insights": [*ORDER, "pipeline", "capture", "ship", "query", "reader", "web",
                          "cli", "runs", "entry", "slurm"]}


def _module_files(name: str) -> list[Path]:
    single = PACKAGE / f"{name}.py"
    if single.exists():
        return [single]
    folder = PACKAGE / name
    return sorted(folder.rglob("*.py")) if folder.is_dir() else []


def _imported_stages(path: Path) -> set[str]:
    """The top-level logcapture modules and packages a file imports (``_imported_modules``)."""
    return {name.split(".")[0] for name in _imported_modules(path)}


@pytest.mark.parametrize("stage", ORDER)
def test_a_stage_never_imports_a_later_stage(stage: str) -> None:
    later = set(ORDER[ORDER.index(stage) + 1:])
    files = _module_files(stage)
    if not files:
        pytest.skip(f"{stage} not present")
    for path in files:
        bad = _imported_stages(path) & later
        assert not bad, f"{path.name} imports later stage(s) {sorted(bad)}"


@pytest.mark.parametrize("source", sorted(SOURCES_BESIDE))
def test_the_sampler_knows_nothing_of_spool_or_store(source: str) -> None:
    for path in _module_files(source):
        bad = _imported_stages(path) & set(SOURCES_BESIDE[source])
        assert not bad, f"{path} imports {sorted(bad)}"


@pytest.mark.parametrize("library", sorted(LIBRARIES))
def test_a_library_imports_no_stage(library: str) -> None:
    files = _module_files(library)
    assert files, f"{library} not present"
    for path in files:
        bad = _imported_stages(path) & set(LIBRARIES[library])
        assert not bad, f"{path} imports {sorted(bad)}"


def test_the_checker_sees_imports() -> None:
    # The rule must be able to fail: pipeline wires everything, so it imports later stages.
    assert {"render", "filter", "classify", "spool"} <= _imported_stages(PACKAGE / "pipeline.py")


# The reading side: what shows runs (the read layer, the web pages, the dashboards) reads
# records, spool and store, and never reaches into the capture path; nothing on the capture
# path imports it. (logview, like xaxis, is a rule every reader applies, the store included.)
READERS = ["query", "web", "grafana"]
CAPTURE = ["frame", "runner", "render", "redact", "filter", "classify", "pipeline", "capture",
           "sampling"]
# sampling.summary.summarize (a run's resource figures, a pure function of Sample records) is
# read by describe; the collectors and the sampler thread are not.
READ_FROM_CAPTURE = {"sampling.summary"}


def _imported_modules(path: Path) -> set[str]:
    """The logcapture modules a file imports, dotted below the package ("sampling.summary"),
    relative imports resolved from the file's own place in the package."""
    here = list(path.relative_to(PACKAGE).parent.parts)
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
            elif (node.module or "").split(".")[0] == "logcapture":
                base = []
            else:
                continue
            mod = node.module or ""
            if node.level == 0:
                mod = mod.partition(".")[2]
            parts = base + (mod.split(".") if mod else [])
            if mod:
                found.add(".".join(parts))
            else:
                found.update(".".join([*parts, a.name]) for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.partition(".")[2] for a in node.names
                         if a.name.startswith("logcapture."))
    return found


@pytest.mark.parametrize("reader", READERS)
def test_readers_never_import_the_capture_path(reader: str) -> None:
    files = _module_files(reader)
    assert files, f"{reader} not found"
    for path in files:
        bad = {m for m in _imported_modules(path) - READ_FROM_CAPTURE
               if m.split(".")[0] in CAPTURE}
        assert not bad, f"{path} imports {sorted(bad)}"


@pytest.mark.parametrize("stage", CAPTURE + ["spool", "store", "ship"])
def test_the_capture_path_never_imports_a_reader(stage: str) -> None:
    for path in _module_files(stage):
        bad = _imported_stages(path) & set(READERS)
        assert not bad, f"{path.name} imports {sorted(bad)}"


# The Slurm job wrapper is on every job's start-up path, opted in or not: importing it, and so
# the package it is in, must cost nothing beyond os and sys. Every other import is inside a
# function (or under TYPE_CHECKING, for annotations only).
SLURM_MODULE_LEVEL = {"os", "sys", "__future__"}


@pytest.mark.parametrize("path", sorted((PACKAGE / "slurm").glob("*.py")), ids=lambda p: p.name)
def test_the_slurm_modules_import_only_os_and_sys_at_module_level(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # a sibling: held to this same rule
                continue
            names = {node.module or ""}
        else:
            continue
        assert names <= SLURM_MODULE_LEVEL, f"{path.name}:{node.lineno} imports {sorted(names)}"


# Every module has a place, and imports only from its own layer or the layers below it. A
# package name places all its modules; a dotted name places one module of a package whose
# modules are run by different callers (the Slurm job wrapper on every job start, the hooks
# by slurmd, the node sampler as a daemon).
LAYERS: list[tuple[str, list[str]]] = [
    # redact is a stage, and its rules (what a configured pattern may be) are read by config.
    ("records and rules", ["", "errors", "records", "sgr", "config", "jobref", "search",
                           "logview", "rankview", "xaxis", "summary_row", "views", "userfiles",
                           "redact", "progress", "arrays", "sections", "ranklabel", "recycle"]),
    ("capture stages and sources", ["frame", "runner", "render", "filter", "classify", "limit",
                                    "spool", "sampling"]),
    ("libraries over records", ["insights", "store", "runs", "ownership", "grafana",
                                "slurm.jobrecords", "slurm.jobs", "slurm.rootsafe"]),
    ("wiring", ["pipeline", "capture", "ship", "slurm.nodesampler"]),
    ("reading", ["query", "jobfollow", "jobview", "reader", "web"]),
    ("entry points", ["cli", "entry", "__main__", "slurm", "slurm.wrapper", "slurm.hooks",
                      "slurm.__main__"]),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int | None:
    """The index in LAYERS of the longest placed name that is ``module`` or a package of it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):  # "" (the package's __init__) is only itself
        name = ".".join(parts[:n])
        for i, (_, names) in enumerate(LAYERS):
            if name in names:
                return i
    return None


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in it: at the top, in a function,
    for type annotations), each import resolved to the longest existing module it names."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for imported in _imported_modules(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in MODULES:
                parts.pop()
            target = ".".join(parts)
            if parts and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def test_every_module_is_placed_in_a_layer() -> None:
    unplaced = [m for m in MODULES if _layer(m) is None]
    assert not unplaced, f"place these modules in LAYERS: {unplaced}"


ARCHITECTURE_MD = PACKAGE.parent / "docs" / "architecture.md"


def _module_table() -> dict[str, str]:
    """docs/architecture.md's module table: the first cell (``name.py`` or ``name/``) -> the
    entry-point cell."""
    rows = {}
    for line in ARCHITECTURE_MD.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[1]
    return rows


def _defined_names(files: list[Path]) -> set[str]:
    names = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
    return names


def test_every_module_is_in_the_architecture_table_with_real_entry_points() -> None:
    table = _module_table()
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py") + sorted(
        f"{p.parent.name}/" for p in PACKAGE.glob("*/__init__.py"))
    missing = [m for m in modules if m not in table]
    assert not missing, f"add these to docs/architecture.md's module table: {missing}"
    assert sorted(table) == sorted(modules), "the table names a module that does not exist"
    # Each `name(...)` of a row's entry points is defined in that module (or package).
    absent = []
    for module, entry in table.items():
        path = PACKAGE / module
        defined = _defined_names([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))
        absent += [f"{module}: {name}" for name in re.findall(r"([A-Za-z_][\w.]*)\(", entry)
                   if name.split(".")[-1] not in defined]
    assert not absent, f"docs/architecture.md names what does not exist: {absent}"


def test_a_module_imports_only_its_layer_and_below() -> None:
    bad = [f"{m} ({LAYERS[_layer(m) or 0][0]}) imports {t} ({LAYERS[_layer(t) or 0][0]})"
           for m, targets in _import_graph().items() for t in sorted(targets)
           if (_layer(t) or 0) > (_layer(m) or 0)]
    assert not bad, "\n".join(bad)


def test_no_import_cycles() -> None:
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(_import_graph()).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


def test_the_layer_checks_can_fail() -> None:
    graph = _import_graph()
    assert "store" in graph["query.store_reader"] and "capture" in graph["cli.capture_commands"]
    assert _layer("store.queries") == _layer("store") < _layer("query") < _layer("cli")
    assert _layer("nonexistent") is None and _layer("slurm.new") == _layer("slurm")
    import graphlib

    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({**graph, "records": {"cli"}}).static_order())


# No module over MAX_LINES lines: a module that long holds more than one concern.
MAX_LINES = 800


def _lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def test_no_module_is_over_800_lines() -> None:
    over = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if _lines(p) > MAX_LINES)
    assert not over, f"over {MAX_LINES} lines: {over}"


def test_who_owns_a_run_is_decided_below_the_shipper_and_the_readers() -> None:
    # The privacy rule (ownership.trusted_identity) is one module both use, importing
    # neither: the read layer does not reach into the shipper for it.
    graph = _import_graph()
    assert _layer("ownership") < _layer("ship") < _layer("query")  # type: ignore[operator]
    assert not {t for t in graph["ownership"] if t.split(".")[0] in ("ship", "query")}
    assert "ownership" in graph["query.local_reader"] and "ownership" in graph["ship"]
