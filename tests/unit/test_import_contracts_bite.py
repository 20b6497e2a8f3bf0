"""Each import-linter contract in pyproject.toml breaks on an import planted against it: a copy of the
rooms gets, per contract, one new import that the contract forbids (a module of its lowest layer
importing its top layer; a module of a forbidden contract's source importing what it forbids), and
`lint-imports` over the copy must name that planted import under that contract. A contract that
cannot fail checks nothing."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _module_file(tree: Path, module: str) -> Path:
    return tree.joinpath(*module.split(".")).with_suffix(".py")


def _plant(tree: Path, where: str, target: str, n: int) -> str:
    """Make `where` (a package or a module) import `target` in the copy; the module that holds it."""
    package = tree.joinpath(*where.split("."))
    if package.is_dir():  # a new module of the package: nothing else in it changes
        module = f"{where}._planted_{n}"
        _module_file(tree, module).write_text(f"import {target}\n")
        return module
    with _module_file(tree, where).open("a") as f:  # a module: one more import at its end
        f.write(f"\nimport {target}  # planted\n")
    return where


def _plan(contract: dict, n: int) -> tuple[str, str]:
    """(where, target): an import the contract forbids."""
    if contract["type"] == "layers":
        container = contract.get("containers", [""])[0]
        top = contract["layers"][0].split("|")[0].strip()
        low = contract["layers"][-1].split("|")[0].strip()
        prefix = f"{container}." if container else ""
        return prefix + low, prefix + top
    return contract["source_modules"][0], contract["forbidden_modules"][0]


def test_every_contract_name_fits_one_line_of_the_report():
    """lint-imports wraps a longer name over two lines, and its report is then hard to read."""
    assert [c["name"] for c in _contracts() if len(c["name"]) > 79] == []


def test_every_contract_fails_on_an_import_planted_against_it(tmp_path):
    contracts = _contracts()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    tree = tmp_path / "tree"
    for room in config["root_packages"]:
        skip = shutil.ignore_patterns("__pycache__", "*.so", "*.safetensors", "*.json", "*.jsonl")
        shutil.copytree(ROOT / room, tree / room, ignore=skip)
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    planted = {}
    for n, contract in enumerate(contracts):
        where, target = _plan(contract, n)
        planted[contract["name"]] = (_plant(tree, where, target, n), target)
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    assert f"0 kept, {len(contracts)} broken" in out, out[-3000:]
    report = out.split("Broken contracts", 1)[1]
    # the report's sections: a contract's name over a rule of dashes as long, then its broken imports
    heads = list(re.finditer(r"^(\S.*)\n(-+)\n", report, re.M))
    sections = {
        " ".join(h.group(1).split()): report[h.end() : nxt.start() if nxt else len(report)]
        for h, nxt in zip(heads, [*heads[1:], None], strict=True)
        if len(h.group(1)) == len(h.group(2))
    }
    for name, (module, target) in planted.items():
        section = sections.get(" ".join(name.split()))
        assert section is not None, f"no section for {name!r} in: {sorted(sections)}"
        assert re.search(rf"{re.escape(module)} -> {re.escape(target)} \(l\.", section), (
            name,
            section[:1500],
        )
