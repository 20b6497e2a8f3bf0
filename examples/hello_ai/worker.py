from workers import AIError, Response, WorkerEntrypoint

MODEL = "@edge/moonshotai/kimi-k2-mini"
HINT = (
    'send a JSON body such as {"messages": [{"role": "user", "content": "What is the capital of France?"}]}'
)


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        try:
            body = await request.json()
        except ValueError:
            return Response.json({"error": HINT}, status=400)
        if not isinstance(body, dict):
            return Response.json({"error": HINT}, status=400)
        # a chat ("messages") or a "prompt", both through the model's chat template as Workers AI
        # renders them (a prompt as one user message); "raw": true sends a prompt as written, for
        # the model to continue
        if isinstance(body.get("messages"), list) and body["messages"]:
            inputs = {"messages": body["messages"]}
        elif isinstance(body.get("prompt"), str):
            inputs = {"prompt": body["prompt"], "raw": body.get("raw") is True}
        else:
            return Response.json(
                {"error": f'the JSON body needs "messages" or a "prompt" string: {HINT}'}, status=400
            )
        try:
            out = await self.env.AI.run(
                body.get("model", MODEL), {**inputs, "max_tokens": body.get("max_tokens", 32)}
            )
        except AIError as exc:
            status = 400 if exc.code in (5004, 5007, 3006) else 503
            return Response.json({"error": str(exc)}, status=status)
        return Response.json(out)
