"""A worker with one of each thing the pytest plugin reaches (tests/examples/features/test_features.py):
HTTP, the AI binding, KV, D1, R2, a queue (producer and consumer), cron, Durable Objects with an
alarm, and a workflow."""

import datetime
import json
from urllib.parse import parse_qs, urlsplit

from workers import DurableObject, Response, WorkerEntrypoint, WorkflowEntrypoint

MODEL = "@edge/moonshotai/kimi-k2-mini"


class Counter(DurableObject):
    async def increment(self, by=1):
        n = (await self.ctx.storage.get("n")) or 0
        await self.ctx.storage.put("n", n + by)
        return n + by


class Reminder(DurableObject):
    async def remind_in(self, seconds):
        when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
        await self.ctx.storage.setAlarm(when)

    async def reminded(self):
        return (await self.ctx.storage.get("reminded")) or 0

    async def alarm(self, alarm_info=None):
        await self.ctx.storage.put("reminded", (await self.reminded()) + 1)


class Double(WorkflowEntrypoint):
    async def run(self, event, step):
        @step.do("double")
        async def double():
            return event.payload["n"] * 2

        return {"doubled": await double()}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlsplit(request.url)
        args = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/hello":
            print(f"greeting {args.get('name')}")
            return Response(f"Hello, {args.get('name', 'world')}!")
        if url.path == "/ai":
            out = await self.env.AI.run(MODEL, {"prompt": args.get("q", "def fib(n):"), "max_tokens": 12})
            return Response.json(out)
        if url.path == "/notes":
            rows = await self.env.DB.prepare("SELECT body FROM notes ORDER BY id").all()
            return Response.json([r["body"] for r in rows.results])
        if url.path == "/kv":
            if request.method == "PUT":
                await self.env.CACHE.put(args["k"], await request.text())
                return Response("stored", status=201)
            return Response.json({"value": await self.env.CACHE.get(args["k"])})
        if url.path == "/file":
            found = await self.env.BUCKET.get(args["k"])
            return Response(await found.text() if found else "missing", status=200 if found else 404)
        if url.path == "/count":
            return Response(str(await self.env.COUNTER.getByName(args["name"]).increment()))
        return Response("not found", status=404)

    async def scheduled(self, controller):
        if controller.cron == "0 0 * * *":
            raise RuntimeError("the midnight job failed")
        await self.env.CACHE.put(
            "cron:last", json.dumps({"cron": controller.cron, "at": controller.scheduledTime})
        )

    async def queue(self, batch):
        for message in batch.messages:
            if message.body.get("fail"):
                message.retry(delaySeconds=5)
            else:
                await self.env.CACHE.put(f"job:{message.body['name']}", str(message.attempts))
