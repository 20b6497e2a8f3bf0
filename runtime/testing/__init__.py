"""Testing a worker project with pytest: the real runtime, isolate, bindings and model, per test.

Cloudflare's answer for JavaScript is @cloudflare/vitest-pool-workers; this is the same idea for
Python workers. Installed with edge-workers, the plugin (runtime.testing.plugin, the `pytest11`
entry point `edge_workers`) gives every test a `worker` fixture:

    async def test_hello(worker):
        r = await worker.fetch("/hello?name=ada")
        assert r.status == 200
        await worker.d1("DB").exec("CREATE TABLE t (x)")
        assert (await worker.scheduled("*/5 * * * *")).outcome == "ok"

Design, and why:

- In process, not a subprocess `edge dev`. The fixture builds a runtime.app.Runtime from the
  project's config and sends requests to its own Starlette app through httpx's ASGI transport:
  the same front, routing, isolate (a real jailed process per worker, as under `edge dev`) and
  answer, without a port or a server to wait for, and with the runtime's stores and event
  handlers at hand for seeding, cron, queue batches, alarms and workflows. A subprocess would
  isolate more but costs a model load and a start per project per test, and reaches the stores
  only through the CLI.
- Scope. Loading a project's models takes seconds, so the edge (its GPU PoPs and engines) and
  the project's installed dependencies are the session's, one per project (EdgeSession). All
  state a worker can change is the test's: each test gets a new Runtime whose state dir (KV, D1,
  R2, Vectorize, queues, workflows, Durable Objects, the state database) is under its tmp_path,
  and a new isolate. The engines' prefix cache outlives a test: it changes timing, never text.
- Repeatable AI answers. The model is the real one (never a mock, no recorded answers). A call
  that sets no `seed` gets the session's seed (default 0, `--edge-ai-seed` or the
  `edge_ai_seed` marker; `none` leaves calls unseeded), so it samples as asked (temperature,
  top_p...) from a fixed generator: a seeded request samples with its own torch.Generator
  (engine.sampling), so the same call gives the same text, in one test and across tests.
  Calls running at once share decode steps; their text is the same as well (each sequence has
  its own generator), but a test that needs an exact answer should send one call at a time.
- Async tests without pytest-asyncio. The project's own suite has none, so the plugin runs an
  `async def` test that uses `worker` itself, on one event loop per session (the loop the
  worker's runtime lives on; the shared edge answers on the caller's loop). A synchronous test
  or fixture uses `worker.run(coro)`. Tests that do not use `worker` are left alone. An async
  test marked for anyio runs on the same loop (the plugin's runner is called before anyio's); a
  worker call awaited on any other loop (asyncio.run, pytest-asyncio) fails at once saying which
  style to use, and edge_test_timeout (default 300 s) ends any test of ours that would wait forever.
- Nothing starts unless a test asks for `worker`: no autouse fixtures, so installing the plugin
  leaves every other suite as it was.
"""

__all__ = ["AlarmResult", "EdgeWorker", "EventResult", "QueueResult", "WorkerLoadError", "WorkerResponse"]


def __getattr__(name: str):
    """The public names, imported on first use: pytest loads the plugin (runtime.testing.plugin, and
    so this package) in every session of this environment, and the runtime is needed only by a
    test that asks for `worker`."""
    if name in __all__:
        from runtime.testing import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'runtime.testing' has no attribute {name!r}")
