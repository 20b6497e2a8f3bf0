"""Our top-level `kernels` package must not confuse transformers, which integrates a PyPI package of
the same name when it believes that one is installed; an install adds no top-level names but the
design's packages (tests/unit/test_wheel_install.py installs the wheel itself); and runtime's modules
import each other without a cycle (the order between rooms is import-linter's: test_import_contracts)."""

import ast
import runpy
import subprocess
import sys
from pathlib import Path


def test_transformers_imports_and_runs_beside_our_kernels_package():
    code = (
        "import kernels, transformers\n"
        "from transformers.utils import import_utils as u\n"
        "assert kernels.__file__.endswith('kernels/__init__.py'), kernels.__file__\n"
        "assert not u.is_kernels_available(), 'transformers thinks our kernels is the hub package'\n"
        "import torch\n"
        "from transformers import DeepseekV3Config, DeepseekV3ForCausalLM\n"
        "cfg = DeepseekV3Config(vocab_size=64, hidden_size=32, intermediate_size=64,"
        " moe_intermediate_size=16,"
        " num_hidden_layers=2, num_attention_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1,"
        " topk_group=1, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=32,"
        " v_head_dim=32, first_k_dense_replace=1)\n"
        "out = DeepseekV3ForCausalLM(cfg)(torch.tensor([[1, 2, 3]])).logits\n"
        "assert out.shape == (1, 3, 64)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


DESIGN_PACKAGES = {"workers", "runtime", "capacity", "quality", "edge_sim", "engine", "kernels"}


def test_an_install_adds_only_the_design_packages_at_top_level(monkeypatch):
    import setuptools

    root = Path(__file__).resolve().parents[2]
    given = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: given.update(kwargs))
    monkeypatch.chdir(root)
    runpy.run_path(str(root / "setup.py"))
    packages = given["packages"]
    assert {p.split(".")[0] for p in packages} == DESIGN_PACKAGES, packages
    # the stand-ins for Pyodide's modules only inside workers; models/ as runtime's data, not a package
    assert {"workers._pyodide.js", "workers._pyodide.asgi", "workers._pyodide.pyodide"} <= set(packages)
    # data folders installed under runtime: the models, and the rag template's worker (examples/rag)
    assert given["package_dir"] == {
        "runtime.shipped_models": "models",
        "runtime.cli.rag_example": "examples/rag",
    }
    assert not [p for p in packages if p.startswith("runtime.shipped_models.")], packages
    for stray in ("js", "asgi", "pyodide"):
        assert not (root / stray).exists(), f"{stray}/ at the top of the checkout is importable from there"


def _in_package(path: Path, top: Path) -> bool:
    """Whether every folder from `top` down to `path` is a package (has its __init__.py)."""
    folder = path.parent
    while folder != top.parent:
        if not (folder / "__init__.py").is_file():
            return False
        folder = folder.parent
    return True


def _runtime_import_graph(root: Path, package: str | tuple[str, ...] = "runtime") -> dict[str, set[str]]:
    """module -> the modules of `package` (or of several) it imports, from the AST: module level,
    inside functions and under TYPE_CHECKING alike (a cycle through any of them is still a cycle to
    a reader)."""
    modules = {}
    packages = (package,) if isinstance(package, str) else package
    for path in sorted(p for package in packages for p in (root / package).rglob("*.py")):
        if not _in_package(path, root / path.relative_to(root).parts[0]):
            continue  # not importable as a module of the package (a build's own sources under bench/out)
        parts = list(path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = here[: len(here) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:  # `from runtime import ipc` names a module; else the package
                    sub = f"{module}.{alias.name}"
                    if sub in modules:
                        edges.add(sub)
                    elif module in modules:
                        edges.add(module)
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as the path that closes it), or None."""
    done: set[str] = set()
    for start in graph:
        stack, path, on_path = [(start, iter(sorted(graph[start])))], [start], {start}
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return path[path.index(child) :] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
                on_path.add(child)
    return None


def test_runtime_modules_import_each_other_without_a_cycle():
    graph = _runtime_import_graph(Path(__file__).resolve().parents[2])
    assert "runtime.host.worker" in graph and graph["runtime.app"], "the scan found no runtime imports"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


# every room of the repository: the installed packages, the training recipe and the benchmarks
ROOMS = ("workers", "runtime", "capacity", "quality", "edge_sim", "engine", "kernels", "models", "bench")


def test_no_module_of_any_room_imports_itself_back():
    """0 import circles anywhere: a circle closed through an import inside a function is still one
    (each module of a circle can only be understood with the others); within a room and between."""
    graph = _runtime_import_graph(Path(__file__).resolve().parents[2], ROOMS)
    assert graph["engine.step.runner"] and graph["models.recipe.train"], "the scan found no imports"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_scan_sees_type_checking_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "runtime"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runtime.b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import runtime.a\n")
    graph = _runtime_import_graph(tmp_path)
    assert graph == {
        "runtime": set(),
        "runtime.a": {"runtime.b"},
        "runtime.b": {"runtime.c"},
        "runtime.c": {"runtime.a"},
    }
    assert _cycle(graph) == ["runtime.a", "runtime.b", "runtime.c", "runtime.a"]
    (package / "c.py").write_text("import runtime\n")
    assert _cycle(_runtime_import_graph(tmp_path)) is None
