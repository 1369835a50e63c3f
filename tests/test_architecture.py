"""The one-way rule: a stage never imports a stage after it.

Order: frame (the reader <-> worker format) -> runner -> render -> filter -> classify -> spool ->
store -> query (the read layer) -> reader (the read service). The sampler is a source beside
the runner: it knows nothing of spool or store either. ``pipeline`` (runner to spool, its
processes in ``capture``) and ``ship`` (spool to store) are the wiring modules; ``cli`` sits
on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "logcapture"
ORDER = ["frame", "runner", "render", "filter", "classify", "spool", "store", "query", "reader"]
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
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            parts = mod.split(".")
            if node.level >= 1:  # from .x import y / from . import x
                found.update(parts[:1] if mod else [a.name for a in node.names])
            elif parts[0] == "logcapture":
                found.update(parts[1:2] or [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "logcapture" and len(parts) > 1:
                    found.add(parts[1])
    return found


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
CAPTURE = ["frame", "runner", "render", "filter", "classify", "pipeline", "capture",
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
