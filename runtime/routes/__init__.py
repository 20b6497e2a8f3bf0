"""One module per API surface the runtime answers (Workers AI REST, OpenAI, Responses, deploy, accounts,
rollouts, its own edge endpoints, OpenAPI) and the Starlette app they make; over http, ai and control,
never the reverse."""
