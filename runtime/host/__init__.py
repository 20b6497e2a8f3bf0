"""Locating a worker, picking its version, running it in its isolate and answering what it asks (AI, fetch,
bindings, Durable Objects, service bindings, WebSockets); the fetch guard and static assets."""
