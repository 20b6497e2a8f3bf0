from workers import AIError, Response, WorkerEntrypoint

MODEL = "@edge/moonshotai/kimi-k2-instruct"  # served by FRA's upstream (topology.toml)


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        try:
            body = await request.json()
        except ValueError:
            return Response.json({"error": 'send a JSON body such as {"question": "..."}'}, status=400)
        question = body.get("question") if isinstance(body, dict) else None
        if not isinstance(question, str):
            return Response.json({"error": 'the JSON body needs a "question" string'}, status=400)
        try:
            out = await self.env.AI.run(
                MODEL, {"messages": [{"role": "user", "content": question}], "max_tokens": 256}
            )
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400 if exc.code in (5004, 5007) else 503)
        return Response.json(out)
