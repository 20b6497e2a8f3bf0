import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import runtime.bindings.kinds  # noqa: F401 - the binding kinds' tables a config read needs (as `edge` has)

# Triton kernels run under the interpreter on machines without a GPU; this must be set before
# any kernel module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist each worker takes its share of the cores (two workers on two cores: one each),
# so that workers do not fight over the same cores with torch's threads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1) // _WORKERS))

# The suite serves eagerly (the eager step is the reference; a compile per engine would not fit the
# suite's budget): tests of the compiled step ask for it (tests/unit/test_compiled_step.py), and the
# servers the suite starts inherit this.
os.environ.setdefault("EDGE_COMPILE", "0")

REPO = Path(__file__).resolve().parent.parent
SHIPPED_KIMI = REPO / "models" / "kimi-k2-mini"
# the shipped tokenizer's tokens, the embedding padded to a multiple of 32 (as the recipe pads it)
SHIPPED_VOCAB = json.loads((SHIPPED_KIMI / "config.json").read_text())["vocab_size"]


def _tiny_kimi(tmp_path_factory, name: str, **overrides) -> Path:
    from tests.hf_reference import tiny_deepseek_v3

    out = tmp_path_factory.mktemp(name)
    tiny_deepseek_v3(out, seed=0, vocab_size=SHIPPED_VOCAB, eos_token_id=5, **overrides)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHIPPED_KIMI / file, out / file)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random DeepSeek-V3 checkpoint written by transformers, with the shipped tokenizer."""
    return _tiny_kimi(tmp_path_factory, "tiny-kimi")


@pytest.fixture(scope="session")
def tiny_long_model_dir(tmp_path_factory) -> Path:
    """The same with a 2,048-token window, for prompts past 512 tokens (the prefix cache's tests)."""
    return _tiny_kimi(tmp_path_factory, "tiny-kimi-long", max_position_embeddings=2048)


TINY_MODEL = "@edge/test/tiny"


@pytest.fixture(scope="module")
def icn_edge(tiny_model_dir):
    """An edge whose one GPU PoP (ICN) serves the tiny model as TINY_MODEL, on the CPU."""
    from edge_sim.edge import Edge
    from edge_sim.network import NetworkModel
    from edge_sim.pop import ModelSpec
    from edge_sim.topology import Topology

    edge = Edge.start(
        Topology.default(),
        NetworkModel(),
        ["ICN"],
        [ModelSpec(TINY_MODEL, str(tiny_model_dir), allow_unsigned=True)],
        device="cpu",
    )
    yield edge
    edge.close()


@pytest.fixture(scope="module")
def fra_node(tiny_model_dir):
    """A PoP node alone (no edge around it) at FRA, serving the tiny model as TINY_MODEL on the CPU."""
    from edge_sim.pop import ModelSpec, PopNode
    from edge_sim.topology import Topology

    node = PopNode.load(
        Topology.default().pop("FRA"),
        [ModelSpec(TINY_MODEL, str(tiny_model_dir), allow_unsigned=True)],
        "cpu",
    )
    yield node
    node.close()


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per test module skipped whole, with its reason: at collection (a module-level
    pytest.skip or importorskip: no test of it is even listed) or test by test (a module-level skipif
    mark, or a fixture each test uses: no C compiler, no network namespaces, no Chromium, no mount).
    `-ra` lists skips by reason; this names what a run did not test at all."""
    at_collection: dict[str, str] = {}
    skipped: dict[str, dict[str, set[str]]] = {}  # module -> reason -> test ids
    ran: set[str] = set()
    for reports in terminalreporter.stats.values():
        for report in reports:
            nodeid = getattr(report, "nodeid", None)
            if not nodeid or not isinstance(report, (pytest.CollectReport, pytest.TestReport)):
                continue
            module = nodeid.split("::")[0]
            if isinstance(report, pytest.CollectReport):
                if report.skipped:
                    at_collection[module] = _skip_reason(report)
            elif report.skipped and not hasattr(report, "wasxfail"):
                skipped.setdefault(module, {}).setdefault(_skip_reason(report), set()).add(nodeid)
            elif report.when == "call" or report.failed:
                ran.add(module)
    whole = {module: f"at collection: {reason}" for module, reason in at_collection.items()}
    for module, reasons in skipped.items():
        if module not in ran and module not in whole:
            count = len(set().union(*reasons.values()))
            whole[module] = f"each of its {count} test(s) that ran: " + "; ".join(sorted(reasons))
    if whole:
        terminalreporter.write_sep("=", f"{len(whole)} test module(s) skipped whole", yellow=True)
        for module, why in sorted(whole.items()):
            terminalreporter.write_line(f"SKIPPED MODULE {module}: {why}")
