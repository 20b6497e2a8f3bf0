"""The Workers runtime: config, HTTP app, isolates, bindings, the `edge` CLI.

Kept import-light: the isolate process imports `runtime.isolate.ipc`, `runtime.isolate.inside.sandbox` and
`runtime.isolate.inside.main` with its helpers (runtime.isolate.view.ISOLATE_MODULES) only.
"""
