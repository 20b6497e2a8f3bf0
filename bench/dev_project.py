"""The benchmarks' throwaway `edge dev` project: it lives in runtime.bench.devserver (which
`edge bench serve --compare` also uses); these names stay importable from here."""

from runtime.bench.devserver import MODEL, REPO, free_port, start_dev, wait_compiled, write_project

__all__ = ["MODEL", "REPO", "free_port", "start_dev", "wait_compiled", "write_project"]
