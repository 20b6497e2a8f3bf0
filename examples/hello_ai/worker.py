from workers import AIError, Response, WorkerEntrypoint

MODEL = "@edge/moonshotai/kimi-k2-mini"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        try:
            body = await request.json()
        except ValueError:
            return Response.json({"error": 'send a JSON body such as {"prompt": "def fib(n):"}'}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return Response.json({"error": 'the JSON body needs a "prompt" string'}, status=400)
        try:
            out = await self.env.AI.run(
                body.get("model", MODEL),
                {"prompt": body["prompt"], "max_tokens": body.get("max_tokens", 32)},
            )
        except AIError as exc:
            status = 400 if exc.code in (5004, 5007, 3006) else 503
            return Response.json({"error": str(exc)}, status=status)
        return Response.json(out)
