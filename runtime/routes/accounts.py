"""The control plane's accounts (admin token required, as every state-changing /cdn-cgi/edge/ call):

    GET    /cdn-cgi/edge/accounts                          accounts, their settings and token names
    POST   /cdn-cgi/edge/accounts  {"name", "rpm"?, "tpm"?, "weight"?, "kv_share"?}
                                                           a new account and its first API token (201)
    PATCH  /cdn-cgi/edge/accounts/{name}  {settings}       change some settings ("tpm": null: unlimited)
    GET    /cdn-cgi/edge/accounts/{name}/tokens            token names and when each was made
    POST   /cdn-cgi/edge/accounts/{name}/tokens  {"name"?} a new API token, shown only in this answer
    DELETE /cdn-cgi/edge/accounts/{name}/tokens/{token}    revoke the account's token(s) of that name

Bad input is answered 400 naming what to change, an unknown account or token 404, a name taken 409.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runtime.control.accounts import AccountError, AccountExists, Accounts, AccountSettings, UnknownAccount
from runtime.http.errors import BAD_CONTROL_REQUEST, error_response
from runtime.http.json_body import BadJSON, decode_json

PREFIX = "/cdn-cgi/edge/accounts"

AdminBody = Callable[[Request], Awaitable[bytes | Response]]


class AccountEndpoints:
    """`admin_body(request)`: the request's body if it carries the admin token, else the refusal
    (runtime.routes.edge.EdgeEndpoints.admin_body)."""

    def __init__(self, accounts: Accounts, admin_body: AdminBody):
        self.accounts, self.admin_body = accounts, admin_body

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX, self.list_or_create, methods=["GET", "POST"]),
            Route(PREFIX + "/{name}", self.update, methods=["PATCH"]),
            Route(PREFIX + "/{name}/tokens", self.tokens, methods=["GET", "POST"]),
            Route(PREFIX + "/{name}/tokens/{token}", self.revoke, methods=["DELETE"]),
        ]

    async def list_or_create(self, request: Request) -> Response:
        async def act(body: bytes) -> Response:
            if request.method == "GET":
                shown = [{**a.to_json(), "tokens": self.accounts.tokens(a.id)} for a in self.accounts.list()]
                return JSONResponse({"accounts": shown})
            fields = _object(body)
            name = fields.pop("name", None)
            if not isinstance(name, str):
                raise AccountError('send {"name": "<account>", ...}: the new account\'s name is missing')
            account, token = self.accounts.create(name, AccountSettings().changed(fields))
            return JSONResponse(
                {"account": account.to_json(), "token": {"name": "default", "token": token}}, status_code=201
            )

        return await self._admin(request, act)

    async def update(self, request: Request) -> Response:
        async def act(body: bytes) -> Response:
            account = self.accounts.update(request.path_params["name"], _object(body))
            return JSONResponse({"account": account.to_json()})

        return await self._admin(request, act)

    async def tokens(self, request: Request) -> Response:
        name = request.path_params["name"]

        async def act(body: bytes) -> Response:
            if request.method == "GET":
                return JSONResponse({"account": name, "tokens": self.accounts.tokens(name)})
            token_name = _object(body).get("name") if body.strip() else None
            if token_name is not None and not isinstance(token_name, str):
                raise AccountError(f"name: {token_name!r}; send the token's name as a string")
            token_name, token = self.accounts.create_token(name, token_name)
            return JSONResponse({"account": name, "name": token_name, "token": token}, status_code=201)

        return await self._admin(request, act)

    async def revoke(self, request: Request) -> Response:
        name, token_name = request.path_params["name"], request.path_params["token"]

        async def act(body: bytes) -> Response:
            revoked = self.accounts.revoke_token(name, token_name)
            if not revoked:
                known = ", ".join(repr(t["name"]) for t in self.accounts.tokens(name)) or "none"
                raise UnknownAccount(
                    f"account {name!r} has no token named {token_name!r}; its tokens: {known}"
                )
            return JSONResponse({"account": name, "name": token_name, "revoked": revoked})

        return await self._admin(request, act)

    async def _admin(self, request: Request, act: Callable[[bytes], Awaitable[Response]]) -> Response:
        """`act(body)` for the admin, its account errors answered 400 / 404 / 409."""
        body = await self.admin_body(request)
        if isinstance(body, Response):
            return body
        try:
            return await act(body)
        except AccountExists as exc:
            return error_response(409, BAD_CONTROL_REQUEST, str(exc))
        except AccountError as exc:
            return error_response(400, BAD_CONTROL_REQUEST, str(exc))
        except UnknownAccount as exc:
            return error_response(404, BAD_CONTROL_REQUEST, str(exc.args[0]))


def _object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (empty: {}), else AccountError saying what to send."""
    if not body.strip():
        return {}
    try:
        value = decode_json(body)
    except (BadJSON, msgspec.ValidationError) as exc:
        raise AccountError(f"{exc}; send a JSON object") from None
    if not isinstance(value, dict):
        raise AccountError(f"send a JSON object of settings, not {type(value).__name__}")
    return value
