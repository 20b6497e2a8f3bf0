"""The Workers runtime: config, HTTP app, isolates, bindings, the `edge` CLI.

Kept import-light: the isolate process imports `runtime.ipc` and `runtime.isolate_main` only.
"""
