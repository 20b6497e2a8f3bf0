"""The README names the AI APIs by their real paths (issue 57, item 7): the runtime answers them under
`/client/v4/accounts/{account_id}`, and the worker answers every other path, so a short `/ai/v1/...`
or `/ai/run` read as a path from the server root sends a reader's request to the worker."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
# a mention of the AI APIs' paths, with what stands before it on its line
AI_PATH = re.compile(r"(?P<before>\S*)(?P<path>/ai/(?:run|v1)\b\S*)")
ACCOUNT = re.compile(r"/client/v4/accounts/[^/\s`]+$")


def _mentions(text: str):
    for number, line in enumerate(text.splitlines(), 1):
        for m in AI_PATH.finditer(line):
            yield number, line, m


def _code_lines(text: str):
    """The lines inside the README's fenced code blocks."""
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
        elif inside:
            yield line


def test_every_ai_path_the_readme_names_is_under_the_accounts_api():
    short = [
        f"line {n}: {m['before']}{m['path']}"
        for n, _, m in _mentions(README.read_text())
        if not ACCOUNT.search(m["before"])
    ]
    assert not short, "name the full path, /client/v4/accounts/{account_id}/ai/...:\n" + "\n".join(short)


def test_every_curl_command_to_an_ai_path_names_the_whole_url():
    curls = [line for line in _code_lines(README.read_text()) if "curl " in line]
    assert curls  # the README shows the APIs with curl
    for line in curls:
        for m in AI_PATH.finditer(line):
            assert re.search(r"https?://[^/\s]+/client/v4/accounts/[^/\s]+$", m["before"]), line


def test_the_check_catches_a_short_path():
    found = [m for _, _, m in _mentions("OpenAI Chat Completions (`/ai/v1/chat/completions`)")]
    assert found and not ACCOUNT.search(found[0]["before"])
    full = [m for _, _, m in _mentions("POST `/client/v4/accounts/{account_id}/ai/run/{model}`")]
    assert full and ACCOUNT.search(full[0]["before"])
