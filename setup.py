"""Which packages `pip install .` puts into site-packages; everything else about the build is in
pyproject.toml (setuptools' pyproject tables can find packages or rename a folder, not both).

Only the design's code packages are top-level names (README, "What an install adds"). Inside them:
- workers._pyodide holds the stand-ins for Pyodide's `pyodide`, `js` and `asgi`, which only an
  isolate puts on its sys.path (runtime.isolate.view.PYODIDE_MODULES);
- runtime.shipped_models is the repository's models/ folder, installed as data (the files
  [tool.setuptools.package-data] names): the checkpoints, catalog, release key, held-out text and
  quality records that runtime.control.config_schema.INSTALLED_MODELS_DIR finds. Its recipe stays behind.
- runtime.cli.rag_example is the repository's examples/rag/ folder, whose worker.py is the `rag`
  template's worker (runtime.cli.templates reads it): the one copy of it, installed beside the CLI.
"""

from setuptools import find_namespace_packages, setup

TOP_LEVEL = ("workers", "runtime", "capacity", "quality", "edge_sim", "engine", "kernels")
SHIPPED_MODELS = "runtime.shipped_models"
RAG_EXAMPLE = "runtime.cli.rag_example"

setup(
    packages=[
        *find_namespace_packages(include=[f"{name}{sub}" for name in TOP_LEVEL for sub in ("", ".*")]),
        SHIPPED_MODELS,
        RAG_EXAMPLE,
    ],
    package_dir={SHIPPED_MODELS: "models", RAG_EXAMPLE: "examples/rag"},
)
