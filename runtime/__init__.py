"""The Workers runtime: config, HTTP app, isolates, bindings, the `edge` CLI.

Kept import-light: the isolate process imports `runtime.ipc`, `runtime.sandbox` and
`runtime.isolate_main` with its helpers (runtime.isolate_view.ISOLATE_MODULES) only.
"""
