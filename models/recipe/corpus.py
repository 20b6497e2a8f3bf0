"""The training and held-out text for the miniatures: the Python standard library's own sources.

They are on every machine that has Python, so nothing is downloaded; `asyncio/` is held out for
evaluation (it is shipped as models/eval/heldout.txt so evaluation does not depend on the local
Python). Test suites are left out: they are mostly data and repetition.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

HELDOUT_PACKAGE = "asyncio"
_SKIP_PARTS = {"site-packages", "test", "tests", "idle_test", "__pycache__", HELDOUT_PACKAGE}
FILE_SEPARATOR = "\n\n"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _sources(root: Path, *, heldout: bool) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts[:-1])
        if heldout:
            if path.relative_to(root).parts[0] == HELDOUT_PACKAGE:
                files.append(path)
        elif not parts & _SKIP_PARTS:
            files.append(path)
    return files


def read_corpus(*, heldout: bool = False, root: Path | None = None) -> str:
    """All training (or held-out) files joined by a blank line, in a fixed order."""
    root = root or stdlib_root()
    texts = []
    for path in _sources(root, heldout=heldout):
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue  # a handful of files carry latin-1 test data; not worth a special case
    return FILE_SEPARATOR.join(texts)
