"""The package's shape, read from its source (no imports): docs/design.md's layers, no import
cycles, no production use of llama_spec.testing, size limits, exceptions in errors.py.

Every import counts, also the ones inside functions (they run too); only ``if TYPE_CHECKING:``
blocks are left out (they never run). Importing ``a.b.c`` also runs the packages ``a.b`` above
it, so those count as imported as well, except the importer's own packages (already running).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "llama_spec"
DESIGN = ROOT / "docs" / "design.md"

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Functions allowed past MAX_FUNCTION_LINES, by qualified name -> reason. Only numba-jitted draw
# loops of the kernels may go here (one flat loop keeps call boundaries out of the compiled
# per-token path); none needs it today. Keep it tiny.
FUNCTION_EXEMPT: dict[str, str] = {}


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    imports: set[str] = field(default_factory=set)  # runtime imports, resolved to module names


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _runtime_import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run (function bodies included, TYPE_CHECKING blocks not)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(child)
            visit(child)

    visit(tree)
    return out


@cache
def modules() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for path in sorted(PKG.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        name, is_pkg = _module_name(path)
        mods[name] = Module(name, path, is_pkg, ast.parse(path.read_text(), str(path)))
    for m in mods.values():
        m.imports = _resolve_imports(m, mods)
    return mods


def _resolve_imports(m: Module, mods: dict[str, Module]) -> set[str]:
    package = m.name if m.is_package else m.name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _runtime_import_nodes(m.tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from x import y`: y is a submodule of x, or a name defined in x
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        for name in names:
            if not (name == "llama_spec" or name.startswith("llama_spec.")):
                continue
            # importing a.b.c runs a.b's __init__ too, unless the importer is inside a.b already
            parts = name.split(".")
            for i in range(2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in mods and not (m.name == prefix or m.name.startswith(prefix + ".")):
                    targets.add(prefix)
            if name == "llama_spec":
                targets.add(name)
    targets.discard(m.name)
    return targets


def _cycles(mods: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(mods[v].imports):
            if w not in mods:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            strong(v)
    return out


def _path_within(mods: dict[str, Module], comp: list[str]) -> str:
    """One concrete cycle inside a component, for the failure message."""
    members = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(mods[v].imports & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(prev[path[-1]])
                return " -> ".join([start, *reversed(path[:-1]), v, start]) if v != start else start
            if w not in prev:
                prev[w] = v
                todo.append(w)
    return " <-> ".join(comp)


# -- 1. no cycles, no testing in production --------------------------------------------------
def test_no_import_cycles():
    mods = modules()
    cycles = _cycles(mods)
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(
        _path_within(mods, c) for c in cycles)


def test_production_code_never_imports_testing():
    bad = sorted(f"{m.name} imports {t}" for m in modules().values()
                 if not m.name.startswith("llama_spec.testing")
                 for t in m.imports if t == "llama_spec.testing" or t.startswith("llama_spec.testing."))
    assert not bad, "\n".join(bad)


def test_nothing_inside_imports_the_package_facade():
    """llama_spec/__init__ is for users: modules inside import the module that defines a name."""
    bad = sorted(m.name for m in modules().values() if m.name != "llama_spec" and "llama_spec" in m.imports)
    assert not bad, "import from the defining module instead of `llama_spec`: " + ", ".join(bad)


# -- 2. sizes ----------------------------------------------------------------------------------
def _functions(tree: ast.AST, prefix: str) -> list[tuple[str, int]]:
    out = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            q = f"{prefix}.{node.name}"
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.append((q, node.end_lineno - start + 1))
            out += _functions(node, q)
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, f"{prefix}.{node.name}")
        else:
            out += _functions(node, prefix)
    return out


def test_module_and_function_sizes():
    long_modules = sorted(f"{m.name}: {n} lines" for m in modules().values()
                          if (n := len(m.path.read_text().splitlines())) > MAX_MODULE_LINES)
    long_functions = sorted(f"{q}: {n} lines" for m in modules().values() for q, n in _functions(m.tree, m.name)
                            if n > MAX_FUNCTION_LINES and q not in FUNCTION_EXEMPT)
    assert not long_modules and not long_functions, (
        f"modules over {MAX_MODULE_LINES} lines:\n  " + "\n  ".join(long_modules or ["none"])
        + f"\nfunctions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(long_functions or ["none"]))


def test_exemptions_are_real():
    """An exemption for a function that no longer exists (or got short) is removed."""
    sizes = {q: n for m in modules().values() for q, n in _functions(m.tree, m.name)}
    stale = [q for q in FUNCTION_EXEMPT if sizes.get(q, 0) <= MAX_FUNCTION_LINES]
    assert not stale, f"stale exemptions: {stale}"


# -- 3. errors ---------------------------------------------------------------------------------
def test_public_exceptions_live_in_errors_py():
    """Every public exception class is defined in llama_spec/errors.py, under LlamaSpecError."""
    errors_tree = modules()["llama_spec.errors"].tree
    bad = []
    for m in modules().values():
        if m.name in ("llama_spec.errors",) or m.name.startswith("llama_spec.testing"):
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if any(b.endswith(("Error", "Exception")) for b in bases):
                    bad.append(f"{m.name}.{node.name}")
    assert not bad, "exception classes outside errors.py: " + ", ".join(sorted(bad))
    defined = {n.name: n for n in ast.walk(errors_tree) if isinstance(n, ast.ClassDef)}

    def under_root(name: str) -> bool:
        if name == "LlamaSpecError":
            return True
        node = defined.get(name)
        return node is not None and any(isinstance(b, ast.Name) and under_root(b.id) for b in node.bases)

    assert all(under_root(n) for n in defined), [n for n in defined if not under_root(n)]


def test_lazy_exports_match_type_checking_imports():
    """llama_spec/__init__.py: the names type checkers see are exactly the lazy exports."""
    tree = modules()["llama_spec"].tree
    exports: set[str] = set()
    seen: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            exports = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.If) and _is_type_checking(node):
            seen = {a.asname or a.name for s in node.body if isinstance(s, ast.ImportFrom) for a in s.names}
    assert exports and exports == seen, (sorted(exports - seen), sorted(seen - exports))


# -- 4. layers -----------------------------------------------------------------------------------
_LAYER_LINE = re.compile(r"^\s*\d+\.\s+\*\*(?P<name>[\w-]+)\*\*\s*:\s*(?P<mods>[^-—]+?)\s+[-—]")


def design_layers() -> list[tuple[str, list[str]]]:
    """The numbered layer list of docs/design.md (between the layers markers), top first."""
    text = DESIGN.read_text()
    block = text.split("<!-- layers:start -->", 1)[1].split("<!-- layers:end -->", 1)[0]
    layers = []
    for line in block.splitlines():
        m = _LAYER_LINE.match(line)
        if m:
            pats = [p.strip().strip("`") for p in m.group("mods").split(",") if p.strip()]
            layers.append((m.group("name"), pats))
    return layers


def _layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """Index of the layer whose pattern matches `module` best (the longest pattern wins)."""
    best: tuple[int, int] | None = None
    short = module.removeprefix("llama_spec.")
    for i, (_, pats) in enumerate(layers):
        for p in pats:
            if short == p or short.startswith(p + "."):
                if best is None or len(p) > best[1]:
                    best = (i, len(p))
    return None if best is None else best[0]


def test_design_lists_layers():
    layers = design_layers()
    assert len(layers) >= 6, layers
    names = [n for n, _ in layers]
    assert len(set(names)) == len(names)


def test_every_module_has_a_layer():
    layers = design_layers()
    missing = sorted(m for m in modules() if m not in ("llama_spec", "llama_spec.__main__")
                     and _layer_of(m, layers) is None)
    assert not missing, "modules in no layer of docs/design.md: " + ", ".join(missing)


def test_imports_only_go_down_the_layers():
    """An import goes to the same layer or one listed below it in docs/design.md (testing aside)."""
    layers = design_layers()
    bad = []
    for m in modules().values():
        if m.name in ("llama_spec", "llama_spec.__main__"):
            continue
        li = _layer_of(m.name, layers)
        for t in sorted(m.imports):
            lt = _layer_of(t, layers)
            if li is None or lt is None:
                continue
            if lt < li:  # a lower index is a higher layer
                bad.append(f"{m.name} ({layers[li][0]}) imports {t} ({layers[lt][0]})")
    assert not bad, "imports going up the layers:\n" + "\n".join(bad)


# -- the checker itself can fail -------------------------------------------------------------------
def test_checker_sees_cycles_in_function_bodies(tmp_path):
    """A cycle hidden in a function body, and one through a package's __init__, are both found."""
    src = {
        "__init__.py": "",
        "a.py": "def f():\n    from . import b\n",
        "b.py": "from .a import f\n",
        "sub/__init__.py": "from . import x\n",
        "sub/x.py": "def g():\n    import llama_spec.c\n",
        "c.py": "from .sub.x import g\n",
        "d.py": "from .sub import x\n",
    }
    mods: dict[str, Module] = {}
    for rel, text in src.items():
        parts = rel.removesuffix(".py").split("/")
        is_pkg = parts[-1] == "__init__"
        name = ".".join(["llama_spec", *(parts[:-1] if is_pkg else parts)])
        mods[name] = Module(name, tmp_path / rel, is_pkg, ast.parse(text))
    for m in mods.values():
        m.imports = _resolve_imports(m, mods)
    assert mods["llama_spec.c"].imports == {"llama_spec.sub", "llama_spec.sub.x"}  # the package runs first
    assert mods["llama_spec.d"].imports == {"llama_spec.sub", "llama_spec.sub.x"}
    found = {tuple(c) for c in _cycles(mods)}
    assert found == {("llama_spec.a", "llama_spec.b"), ("llama_spec.c", "llama_spec.sub", "llama_spec.sub.x")}
    assert _layer_of("llama_spec.rpc.guard", [("app", ["cli"]), ("devices", ["rpc", "backends"])]) == 1


@pytest.mark.parametrize("bad", ["def f():\n    import llama_spec.testing.models\n"])
def test_checker_sees_testing_imports(bad):
    tree = ast.parse(bad)
    mods = {"llama_spec.x": Module("llama_spec.x", Path("x.py"), False, tree),
            "llama_spec.testing": Module("llama_spec.testing", Path("t"), True, ast.parse("")),
            "llama_spec.testing.models": Module("llama_spec.testing.models", Path("m"), False, ast.parse(""))}
    assert "llama_spec.testing.models" in _resolve_imports(mods["llama_spec.x"], mods)


def test_code_cites_the_design_document_in_the_repository():
    """The design the code cites is docs/design.md (there is no DESIGN.md in the repository)."""
    assert DESIGN.exists()
    bad = sorted(str(p.relative_to(ROOT)) for p in [*PKG.rglob("*.py"), *(ROOT / "tests").glob("*.py")]
                 if p.name != "test_architecture.py" and re.search(r"(?<!docs/)\bDESIGN\.md", p.read_text()))
    assert not bad, "cite docs/design.md instead of DESIGN.md in: " + ", ".join(bad)


# -- 5. folder = layer, a small top level, no probing in the step core ------------------------------
MAX_TOP_LEVEL_MODULES = 8
FOUNDATION = "foundation"
# the binding sits at the package root beside what the build writes there (the compiled _llama_cffi,
# _cdef/, _shim.cpp, _lib/): build_llama.py and setup.py name those paths
ROOT_LAYERS = (FOUNDATION, "native")


def test_folder_is_layer():
    """Every layer but the foundation is a set of packages (folders), not loose modules."""
    loose = [f"{name}: {p}" for name, pats in design_layers() if name not in ROOT_LAYERS for p in pats
             if not (PKG / p / "__init__.py").exists()]
    assert not loose, "layers listing modules instead of packages:\n  " + "\n  ".join(loose)


def test_few_modules_at_the_top_level():
    top = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


# classes whose isinstance checks would be the loop probing a drafter or a proposal
_PROBED = {"Proposal", "TreeProposal", "Drafter", "DraftModelDrafter", "MtpDrafter", "ChainDrafter",
           "TreeDrafting", "DraftGroup", "SharedDraftModel"}
_NO_PROBES = ("llama_spec.generation.core", "llama_spec.generation.solo", "llama_spec.generation.batch",
              "llama_spec.rules", "llama_spec.observe.stats")


def _probes(tree: ast.AST) -> list[str]:
    """getattr/hasattr of a named attribute (a probe; getattr(o, field) over a dataclass's own
    fields is not one), isinstance against a drafter/proposal class outside __init__ (a capability
    is checked once, when a generator is built)."""
    out: list[str] = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name):
                f, args = child.func.id, child.args
                if f in ("getattr", "hasattr") and len(args) >= 2 and isinstance(args[1], ast.Constant):
                    out.append(f"{f} in {fn} (line {child.lineno})")
                if f == "isinstance" and len(args) == 2 and fn != "__init__":
                    names = {n.id for n in ast.walk(args[1]) if isinstance(n, ast.Name)}
                    if names & _PROBED:
                        out.append(f"isinstance(.., {sorted(names & _PROBED)}) in {fn} (line {child.lineno})")
            visit(child, name)

    visit(tree, "<module>")
    return out


def test_step_core_rules_and_stats_never_probe_drafters_or_proposals():
    bad = [f"{m.name}: {p}" for m in modules().values()
           if any(m.name == n or m.name.startswith(n + ".") for n in _NO_PROBES) for p in _probes(m.tree)]
    assert not bad, "\n".join(bad)


def test_probe_checker_can_fail():
    src = "def f(d):\n    return getattr(d, 'x', None) or isinstance(d, TreeProposal)\n"
    assert len(_probes(ast.parse(src))) == 2
    assert _probes(ast.parse("class A:\n    def __init__(self, d):\n        isinstance(d, TreeDrafting)\n")) == []
