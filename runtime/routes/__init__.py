"""One module per API surface the runtime answers (Workers AI REST, OpenAI, Responses, AI Gateway's doors
and its REST API, deploy, accounts, rollouts, its own edge endpoints, the live dashboard with its page
in dashboard_static/, OpenAPI) and the Starlette app they make; over http, ai, control and the binding
stores, never the reverse (deploy also loads an upload in an isolate to check it)."""
