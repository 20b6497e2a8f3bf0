"""Our top-level `kernels` package must not confuse transformers, which integrates a PyPI package of
the same name when it believes that one is installed; and our top-level packages import each other
only in their dependency order."""

import ast
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


# Dependency order: runtime -> capacity -> edge_sim -> engine -> kernels. A package may import those
# to its right, never one to its left. Each entry: the package, and the top-level packages it must
# never import (at module level or inside a function).
FORBIDDEN_IMPORTS = {
    "capacity": ("runtime",),
    "edge_sim": ("capacity",),
}


def _imported_top_levels(path: Path) -> set[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {(node.lineno, alias.name.split(".")[0]) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.lineno, node.module.split(".")[0]))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add((node.lineno, node.args[0].value.split(".")[0]))
    return found


def test_packages_import_only_in_dependency_order():
    root = Path(__file__).resolve().parents[2]
    bad = []
    for package, forbidden in FORBIDDEN_IMPORTS.items():
        files = sorted((root / package).rglob("*.py"))
        assert files, f"no modules found under {package}/"
        for path in files:
            for lineno, name in sorted(_imported_top_levels(path)):
                if name in forbidden:
                    bad.append(f"{path.relative_to(root)}:{lineno} imports {name}")
    assert not bad, bad


def test_dependency_scan_sees_function_level_and_dotted_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n"
        "def f():\n"
        "    from runtime.cli import main\n"
        "    import capacity.simulator as sim\n"
        "    return importlib.import_module('runtime.app')\n"
        "from . import sibling\n"
    )
    names = {name for _, name in _imported_top_levels(module)}
    assert names == {"os", "runtime", "capacity"}
