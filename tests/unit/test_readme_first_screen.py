"""The README's first screen says what the shipped models are and how to serve a real one (issue 57,
item 9): a reader who meets a 6M-parameter model's answer should already know why, and where to go
for a full-size one, before the quick start sends the first request."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIRST_SCREEN = 40  # lines


def _first_screen() -> str:
    return "\n".join((REPO / "README.md").read_text().splitlines()[:FIRST_SCREEN])


def test_the_first_screen_gives_the_models_size_and_what_they_do_and_do_not():
    text = _first_screen()
    assert re.search(r"\b6M parameters\b", text), "say the shipped models' size (about 6M parameters)"
    assert "factual" in text and "tool call" in text  # what they do well
    assert "poems" in text and "translate" in text  # and what not


def test_the_first_screen_says_how_to_serve_a_real_model():
    text = _first_screen()
    assert "upstream" in text and "vLLM" in text  # an OpenAI-compatible upstream behind a PoP
    assert "#a-gpu-cluster-behind-vllm-or-sglang" in text and "models_dir" in text
    assert "### A GPU cluster behind vLLM or SGLang" in (REPO / "README.md").read_text()  # its anchor
