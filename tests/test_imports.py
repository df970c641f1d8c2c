"""The import graph: no circles anywhere, `sim` imports neither torch nor `executor` nor the CLI,
and `import simpar` is cheap (the API loads lazily)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "sim": "simpar.sim",
    "jobs": "simpar.jobs",
    "executor": "simpar.executor",
    "cli": "simpar.cli",
    "api": "simpar",
}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for p in (ROOT / folder).rglob("*.py"):
            parts = list(p.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = p
    return out


def _graph() -> tuple[nx.DiGraph, dict[str, set[str]]]:
    mods = _modules()
    g, external = nx.DiGraph(), {m: set() for m in mods}
    for m, p in mods.items():
        g.add_node(m)
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    name = ".".join(base + ([node.module] if node.module else []))
                else:
                    name = node.module or ""
                names = [name] + [f"{name}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for n in names:
                if n in mods and n != m:
                    g.add_edge(m, n)
                external[m].add(n.split(".")[0])
    return g, external


def test_no_import_circles():
    g, _ = _graph()
    assert [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1] == []


def test_sim_imports_neither_torch_nor_executor_nor_the_cli():
    g, external = _graph()
    sim = [m for m in g if m.startswith("simpar.sim")]
    assert [m for m in sim if "torch" in external[m]] == []
    # the simulator's own modules, and how jobs run (`simpar.jobs`, which imports only sim's errors)
    allowed = ("simpar.sim", "simpar.jobs")
    assert [(m, d) for m in sim for d in g.successors(m) if not d.startswith(allowed)] == []
    jobs = [m for m in g if m.startswith("simpar.jobs")]
    assert {d for m in jobs for d in g.successors(m)} <= {"simpar.sim.errors", "simpar.sim", *jobs}


def test_import_simpar_is_cheap_and_the_api_resolves():
    code = (
        "import sys, simpar; heavy = [m for m in ('networkx', 'matplotlib', 'simpy', 'torch') if m in sys.modules];"
        "print(heavy); from simpar import simulate, sweep, Calibration, ParallelPlan, memory_report; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "ok"]


#: simpar's layers, lowest first: a module imports only from its own layer or below (issue 66: "the
#: layer order tested, not only no circles"). Plain values and utilities; files, the trace (its
#: events and file format, shared by the simulator, the executor and the readers) and how jobs run
#: (`simpar.jobs`: worker processes, interrupts, locks); the specs of models,
#: GPUs and clusters and the cluster graph; the schedule generators (which know no plan), the network
#: and the model's layers; the plan; its layout, checks and files; the lowering of a plan onto its
#: schedule; the cost model; the iteration program (its terms, ZeRO's steps, each rank's tail); the
#: engine (the interpreter); the iteration driven over a plan (simulate, compressions, repeated
#: iterations, results); what reads and compares runs (plots, traces, configuration
#: files, validation); calibration; the sweep; the library API and the executor; the CLI.
LAYERS = (
    (
        "sim",
        "sim.choices",
        "sim.levers",
        "sim.errors",
        "sim.units",
        "sim.derived",
        "sim.fitting",
        "sim.zero",
        "sim.collector",
    ),
    ("sim.files", "sim.trace", "simpar.jobs"),
    ("sim.specs", "sim.topology"),
    ("sim.schedules", "sim.network", "sim.model"),
    ("sim.plan",),
    ("sim.layout", "sim.plan_check", "sim.plan_make", "sim.planfile"),
    ("sim.lowering",),
    ("sim.cost",),
    ("sim.program",),
    ("sim.engine",),
    ("sim.iteration",),
    ("sim.plot", "sim.kineto", "sim.interop", "sim.validation", "sim.goodput", "sim.variability", "sim.energy"),
    ("sim.calibration",),
    ("sim.sweep",),
    ("simpar", "simpar.executor"),
    ("simpar.cli",),
)


def _layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[1:2] == ["sim"]:
        return "sim." + parts[2] if len(parts) > 2 else "sim"
    return ".".join(parts[:2])


def test_layers_import_downward_only():
    g, _ = _graph()
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    assert sorted({_layer_of(m) for m in g} - set(rank)) == []  # every package has a layer
    upward = [(a, b) for a, b in g.edges() if rank[_layer_of(b)] > rank[_layer_of(a)]]
    assert upward == []


def test_every_package_folder_is_listed_for_installation():
    """pyproject lists simpar's packages one by one (each folder maps under ``simpar``): a package
    folder missing from the list would import from a checkout and be absent from a wheel."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {**PACKAGES, "topologies": "simpar.topologies"}
    found = {
        ".".join([pkg, *p.parent.relative_to(ROOT / folder).parts])
        for folder, pkg in folders.items()
        for p in (ROOT / folder).rglob("__init__.py")
    }
    assert sorted(found - listed) == []
