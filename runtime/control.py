"""The control API behind `edge deploy | versions | deployments | rollback | secret | tail`.

    PUT    /client/v4/accounts/{account}/workers/scripts/{name}              upload and deploy a version
    GET    .../scripts/{name}/versions                                       versions, newest first
    GET    .../scripts/{name}/deployments                                    deployments, newest first
    POST   .../scripts/{name}/deployments   {"versions": [{"version_id", "percentage"}]}   gradual
    POST   .../scripts/{name}/rollback      {"version_id": optional}         back to a version
    GET|PUT .../scripts/{name}/secrets, DELETE .../secrets/{secret}          secrets (values never returned)
    GET    .../scripts/{name}/tail?status=ok|error                           live events, one JSON per line

A new version is imported in a fresh, sandboxed isolate before anything changes: a script that
fails to load never replaces the active version.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from typing import TYPE_CHECKING

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from runtime.api import AUTH_ERROR, AuthError, authenticate, cf_error, envelope
from runtime.isolate import Isolate, IsolateLimits, WorkerLoadError
from runtime.validation import describe

if TYPE_CHECKING:
    from runtime.app import Runtime

PREFIX = "/client/v4/accounts/{account}/workers/scripts/{name}"
SCRIPT_INVALID = 10021  # Cloudflare's "script content failed validation"
NOT_FOUND = 10007
BAD_REQUEST = 10014


class Upload(msgspec.Struct):
    main: str
    files: dict[str, str]  # relative path -> source
    config: dict = {}  # vars, ai_binding, services, cpu_ms, memory_mb, subrequests
    message: str | None = None


class Split(msgspec.Struct):
    version_id: str
    percentage: int


class DeployRequest(msgspec.Struct):
    versions: list[Split]
    message: str | None = None


class RollbackRequest(msgspec.Struct):
    version_id: str | None = None
    message: str | None = None


class SecretRequest(msgspec.Struct):
    name: str
    text: str


async def _no_ai(call):  # validation isolates never get as far as calling the model
    from runtime import ipc

    return ipc.AIReply(call.call, error_code=5004, error_message="not during validation")


class ControlApi:
    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def routes(self) -> list[Route]:
        return [
            Route(PREFIX, self.upload, methods=["PUT"]),
            Route(PREFIX + "/versions", self.versions, methods=["GET"]),
            Route(PREFIX + "/deployments", self.deployments, methods=["GET", "POST"]),
            Route(PREFIX + "/rollback", self.rollback, methods=["POST"]),
            Route(PREFIX + "/secrets", self.secrets, methods=["GET", "PUT"]),
            Route(PREFIX + "/secrets/{secret}", self.delete_secret, methods=["DELETE"]),
            Route(PREFIX + "/tail", self.tail_events, methods=["GET"]),
        ]

    def _auth(self, request: Request) -> tuple[str, str]:
        return authenticate(self.runtime.state, request), request.path_params["name"]

    async def _decode(self, request: Request, kind: type):
        try:
            return msgspec.json.decode(await request.body(), type=kind)
        except msgspec.ValidationError as exc:
            raise ValueError(describe(exc)) from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"the body is not valid JSON ({exc})") from None

    async def upload(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
            upload = await self._decode(request, Upload)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        if upload.main not in upload.files:
            return cf_error(BAD_REQUEST, f"main {upload.main!r} is not among the uploaded files")
        if any(p.startswith("/") or ".." in p.split("/") for p in upload.files):
            return cf_error(BAD_REQUEST, "file paths must be relative and stay inside the project")
        state_dir = self.runtime.config.state_dir
        staging = state_dir / "staging" / uuid.uuid4().hex
        for rel, source in upload.files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source)
        cfg = upload.config
        probe = Isolate(
            f"validate:{name}",
            staging / upload.main,
            dict(cfg.get("vars", {})),
            cfg.get("ai_binding"),
            _no_ai,
            services=list(cfg.get("services", {})),
            limits=IsolateLimits(cpu_ms=cfg.get("cpu_ms", 30_000), memory_mb=cfg.get("memory_mb", 128)),
        )
        try:
            await probe.start()  # imports the script in a fresh isolate
        except WorkerLoadError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            return cf_error(SCRIPT_INVALID, f"{exc}; the active version is unchanged", 400)
        finally:
            await probe.stop()
        state = self.runtime.state
        version = state.add_version(account, name, upload.main, upload.files, cfg, upload.message)
        target = state_dir / "scripts" / version
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
        deployment = state.deploy(account, name, [(version, 100)], upload.message)
        return envelope({"id": version, "deployment_id": deployment, "entry": probe.entry})

    async def versions(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        return envelope({"items": self.runtime.state.versions(account, name)})

    async def deployments(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        state = self.runtime.state
        if request.method == "GET":
            return envelope({"deployments": state.deployments(account, name)})
        try:
            body = await self._decode(request, DeployRequest)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        known = {v["id"] for v in state.versions(account, name)}
        unknown = [s.version_id for s in body.versions if s.version_id not in known]
        if unknown:
            return cf_error(NOT_FOUND, f"no version {', '.join(unknown)} of {name!r}", 404)
        if sum(s.percentage for s in body.versions) != 100 or any(s.percentage < 0 for s in body.versions):
            return cf_error(BAD_REQUEST, "percentages must be non-negative and add up to 100")
        deployment = state.deploy(
            account, name, [(s.version_id, s.percentage) for s in body.versions], body.message
        )
        return envelope({"id": deployment})

    async def rollback(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
            body = await self._decode(request, RollbackRequest) if await request.body() else RollbackRequest()
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        state = self.runtime.state
        version = body.version_id
        if version is None:  # the version active before the current deployment
            deployments = state.deployments(account, name)
            current = {v["version_id"] for v in deployments[0]["versions"]} if deployments else set()
            version = next(
                (
                    v["version_id"]
                    for d in deployments[1:]
                    for v in d["versions"]
                    if v["version_id"] not in current
                ),
                None,
            )
            if version is None:
                return cf_error(NOT_FOUND, f"{name!r} has no earlier version to roll back to", 404)
        elif state.version(account, version) is None:
            return cf_error(NOT_FOUND, f"no version {version} of {name!r}", 404)
        deployment = state.deploy(account, name, [(version, 100)], body.message or f"rollback to {version}")
        return envelope({"id": deployment, "version_id": version})

    async def secrets(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        state = self.runtime.state
        if request.method == "GET":
            return envelope([{"name": n, "type": "secret_text"} for n in state.secret_names(account, name)])
        try:
            body = await self._decode(request, SecretRequest)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        if not body.name.isidentifier():
            return cf_error(BAD_REQUEST, f"secret name {body.name!r} must be a valid identifier")
        state.put_secret(account, name, body.name, body.text)
        await self.runtime.restart_worker(account, name)  # the next request sees the new env
        return envelope({"name": body.name, "type": "secret_text"})

    async def delete_secret(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        if not self.runtime.state.delete_secret(account, name, request.path_params["secret"]):
            return cf_error(NOT_FOUND, f"no secret {request.path_params['secret']!r}", 404)
        await self.runtime.restart_worker(account, name)
        return envelope(None)

    async def tail_events(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        wanted = request.query_params.get("status")
        queue = self.runtime.tail.subscribe(account, name)

        async def events():
            try:
                yield b'{"type": "connected"}\n'
                while True:
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=15)
                    except TimeoutError:
                        yield b"\n"  # keep-alive
                        continue
                    ok = event.get("outcome") in ("ok", "log")
                    if wanted == "ok" and not ok or wanted == "error" and ok:
                        continue
                    yield (json.dumps(event) + "\n").encode()
            finally:
                self.runtime.tail.unsubscribe(account, name, queue)

        return StreamingResponse(events(), media_type="application/x-ndjson")
