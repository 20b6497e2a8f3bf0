"""The control API behind `edge deploy | versions | deployments | rollback | secret | tail`.

    PUT    /client/v4/accounts/{account}/workers/scripts/{name}              upload and deploy a version
    GET    .../scripts/{name}/versions                                       versions, newest first
    GET    .../scripts/{name}/deployments                                    deployments, newest first
    POST   .../scripts/{name}/deployments   {"versions": [{"version_id", "percentage"}]}   gradual
    POST   .../scripts/{name}/rollback      {"version_id": optional}         back to a version
    GET|PUT .../scripts/{name}/secrets, DELETE .../secrets/{secret}          secrets (values never returned)
    GET    .../scripts/{name}/tail?status=ok|error                           live events, one JSON per line

A new version is imported in a fresh, sandboxed isolate before anything changes: a script that
fails to load never replaces the active version. Before that, the upload is checked whole: its
config (typed, unknown keys refused, limits by runtime/control/limits.py) and its files (relative paths
of plain components, bounded in count and size); a refused upload leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import unicodedata
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from runtime.bindings import BindingRef, kinds
from runtime.control import limits as worker_limits
from runtime.control.config import check_env_names
from runtime.control.state import State, private_dir, write_bundle
from runtime.control.tail import TailHub
from runtime.control.validation import describe
from runtime.http.json_body import decode_json
from runtime.isolate.process import Isolate, WorkerLoadError
from runtime.routes.ai_rest import AUTH_ERROR, AuthError, authenticate, cf_error, envelope

PREFIX = "/client/v4/accounts/{account}/workers/scripts/{name}"
SCRIPT_INVALID = 10021  # Cloudflare's "script content failed validation"
NOT_FOUND = 10007
BAD_REQUEST = 10014
SCRIPT_TOO_LARGE = 10027  # Cloudflare's "script exceeds the size limit"

WORKER_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")
MAX_FILES = 256
MAX_SOURCE_BYTES = 10 * 1024 * 1024  # all sources together (Workers' own upload limit is 10 MB)
MAX_BODY_BYTES = 8 * MAX_SOURCE_BYTES  # the JSON around them, escapes included
MAX_PATH_BYTES = 1024
MAX_COMPONENT_BYTES = 255  # a file name on Linux


class DurableObjectDeploy(msgspec.Struct, forbid_unknown_fields=True):
    """A durable_objects.bindings entry: a class of this worker (script_name: another's, refused
    when called, as for the dev worker)."""

    name: str
    class_name: str
    script_name: str | None = None


MAX_BINDINGS = 256  # the binding kinds' and Durable Object bindings of one version together

# What `edge deploy` sends from the worker's config; stored with the version. The binding kinds'
# lists are wrangler's, by their config keys (runtime.bindings.kinds: kv_namespaces, d1_databases,
# r2_buckets, queues.producers), their data under the runtime's state dir, keyed by the account.
DeployConfig = msgspec.defstruct(
    "DeployConfig",
    [
        ("vars", dict[str, str | int | float | bool], msgspec.field(default_factory=dict)),
        ("ai_binding", str | None, None),
        ("services", dict[str, str], msgspec.field(default_factory=dict)),  # binding -> a worker
        ("cpu_ms", int, worker_limits.DEFAULTS["cpu_ms"]),
        ("memory_mb", int, worker_limits.DEFAULTS["memory_mb"]),
        ("subrequests", int, worker_limits.DEFAULTS["subrequests"]),
        *kinds.upload_fields({"durable_objects.bindings": DurableObjectDeploy}),
    ],
    forbid_unknown_fields=True,
    module=__name__,
)


class Upload(msgspec.Struct, forbid_unknown_fields=True):
    main: str
    files: dict[str, str]  # relative path -> source
    config: DeployConfig = msgspec.field(default_factory=DeployConfig)
    message: str | None = None


class BodyTooLarge(ValueError):
    pass


def check_config(config: DeployConfig) -> worker_limits.Limits:
    """The upload's limits, validated as [limits] in wrangler-like.toml is; ValueError otherwise."""
    check_bindings(config)
    return worker_limits.validate(msgspec.structs.asdict(config), "config")


def check_bindings(config: DeployConfig) -> dict[str, BindingRef]:
    """Every binding of the upload checked as the config's are (one name check for both: an
    identifier, bound once, not a var's), ids given; its BindingRefs; ValueError naming the entry."""
    tables = kinds.tables_of(msgspec.to_builtins(config))
    objects = config.durable_objects.bindings
    if sum(map(len, tables.values())) + len(objects) > MAX_BINDINGS:
        raise ValueError(f"config: at most {MAX_BINDINGS} bindings of KV, D1, R2, queues and Durable Objects")
    bound = [("ai_binding", config.ai_binding)] if config.ai_binding is not None else []
    bound += [("services", b) for b in config.services]
    bound += [
        (f"{k.config_key}.{i}.{k.env_key}", k.env_name(e))
        for k in kinds.KINDS
        for i, e in enumerate(tables[k.config_key])
    ]
    bound += [(f"durable_objects.bindings.{i}.name", b.name) for i, b in enumerate(objects)]
    check_env_names(config.vars, bound, "config.")
    for i, b in enumerate(objects):
        if not b.class_name.isidentifier():
            raise ValueError(
                f"config.durable_objects.bindings.{i}.class_name: {b.class_name!r} is not a Python class name"
            )
    return kinds.binding_refs(tables, "config.")


def _check_path(rel: str) -> None:
    if not rel:
        raise ValueError("files: a file path is empty")
    if any(unicodedata.category(c)[0] == "C" or c == "\\" for c in rel):
        raise ValueError(f"files: {rel!r}: control characters and backslashes are not allowed in a path")
    if rel.startswith("/"):
        raise ValueError(f"files: {rel!r}: paths must be relative to the bundle")
    if len(rel.encode()) > MAX_PATH_BYTES:
        raise ValueError(f"files: {rel[:40]!r}...: a path is at most {MAX_PATH_BYTES} bytes")
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(
                f"files: {rel!r}: a path is names joined by single '/' (no empty, '.' or '..' part)"
            )
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            raise ValueError(f"files: {rel!r}: a path component is at most {MAX_COMPONENT_BYTES} bytes")


def check_bundle(main: str, files: dict[str, str]) -> None:
    """Refuse (ValueError naming the path) a bundle that could not be written as it says, or that
    would write outside its folder; BodyTooLarge for too many files or too much source."""
    if len(files) > MAX_FILES:
        raise BodyTooLarge(f"files: {len(files)} files; a bundle has at most {MAX_FILES}")
    total = 0
    for rel, source in files.items():
        _check_path(rel)
        try:
            total += len(source.encode())
        except UnicodeEncodeError:
            raise ValueError(f"files: {rel!r}: the source is not valid Unicode text") from None
    if total > MAX_SOURCE_BYTES:
        raise BodyTooLarge(f"files: {total} bytes of source; a bundle has at most {MAX_SOURCE_BYTES}")
    for rel in files:
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise ValueError(f"files: {'/'.join(parts[:i])!r} is both a file and the folder of {rel!r}")
    if main not in files:
        raise ValueError(f"main: {main!r} is not among the uploaded files")
    if not main.endswith(".py"):
        raise ValueError(f"main: {main!r} is not a Python module (.py)")


def decode(body: bytes, kind: type):
    """`body` as `kind`, or ValueError naming the field."""
    try:
        return decode_json(body, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(describe(exc)) from None


def parse_upload(body: bytes) -> tuple[Upload, worker_limits.Limits]:
    """An upload checked whole (config, limits, files) before anything is written; ValueError
    (BodyTooLarge for size) naming the key or the path otherwise."""
    upload = decode(body, Upload)
    limits = check_config(upload.config)
    check_bundle(upload.main, upload.files)
    return upload, limits


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


class ControlApi:
    """`restart_worker(account, name)` stops a worker's running isolates (its env changed)."""

    def __init__(
        self,
        state: State,
        state_dir: Path,
        tail: TailHub,
        restart_worker: Callable[[str, str], Awaitable[None]],
    ):
        self.state, self.state_dir, self.tail = state, state_dir, tail
        self.restart_worker = restart_worker

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
        return authenticate(self.state, request), request.path_params["name"]

    async def _decode(self, request: Request, kind: type):
        return decode(await self._read(request, 1024 * 1024), kind)

    async def _read(self, request: Request, max_bytes: int) -> bytes:
        """The body, read in chunks up to `max_bytes` (BodyTooLarge past it)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise BodyTooLarge(f"the body is over {max_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise BodyTooLarge(f"the body is over {max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def upload(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
            if not WORKER_NAME.fullmatch(name):  # it names routes, tail streams and log lines
                raise ValueError(f"worker name {name!r}: use 1-63 letters, digits, '_' and '-'")
            upload, limits = parse_upload(await self._read(request, MAX_BODY_BYTES))
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except BodyTooLarge as exc:
            return cf_error(SCRIPT_TOO_LARGE, f"{exc}; the active version is unchanged", 413)
        except ValueError as exc:  # nothing has been written yet
            return cf_error(BAD_REQUEST, f"{exc}; the active version is unchanged")
        state, cfg = self.state, upload.config
        state_dir = private_dir(self.state_dir)
        staging = private_dir(state_dir / "staging") / uuid.uuid4().hex
        try:  # whatever happens, the staging folder goes (renamed to the version's, or removed)
            write_bundle(staging, upload.files)
            probe = Isolate(
                f"validate:{name}",
                staging / upload.main,
                dict(cfg.vars),
                cfg.ai_binding,  # its host refuses every call: it is only imported
                services=list(cfg.services),
                limits=limits.isolate(),
                bindings=kinds.sdk_clients(check_bindings(cfg)),
            )
            try:
                await probe.start()  # imports the script in a fresh isolate
            except WorkerLoadError as exc:
                return cf_error(SCRIPT_INVALID, f"{exc}; the active version is unchanged", 400)
            finally:
                await probe.stop()
            stored = msgspec.to_builtins(cfg)
            version = await asyncio.to_thread(
                state.add_version, account, name, upload.main, upload.files, stored, upload.message
            )
            staging.rename(private_dir(state_dir / "scripts") / version)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        deployment = await asyncio.to_thread(state.deploy, account, name, [(version, 100)], upload.message)
        return envelope({"id": version, "deployment_id": deployment, "entry": probe.entry})

    async def versions(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        return envelope({"items": self.state.versions(account, name)})

    async def deployments(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        state = self.state
        if request.method == "GET":
            return envelope({"deployments": state.deployments(account, name)})
        try:
            body = await self._decode(request, DeployRequest)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        known = {v["id"] for v in state.versions(account, name)}
        unknown = [s.version_id for s in body.versions if s.version_id not in known]
        if unknown:  # another worker's version included
            return cf_error(NOT_FOUND, f"no version {', '.join(unknown)} of worker {name!r}", 404)
        if sum(s.percentage for s in body.versions) != 100 or any(s.percentage < 0 for s in body.versions):
            return cf_error(BAD_REQUEST, "percentages must be non-negative and add up to 100")
        split = [(s.version_id, s.percentage) for s in body.versions]
        deployment = await asyncio.to_thread(state.deploy, account, name, split, body.message)
        return envelope({"id": deployment})

    async def rollback(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
            body = await self._decode(request, RollbackRequest) if await request.body() else RollbackRequest()
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        state = self.state
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
        elif state.version(account, name, version) is None:  # another worker's version included
            return cf_error(NOT_FOUND, f"no version {version} of worker {name!r}", 404)
        message = body.message or f"rollback to {version}"
        deployment = await asyncio.to_thread(state.deploy, account, name, [(version, 100)], message)
        return envelope({"id": deployment, "version_id": version})

    async def secrets(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        state = self.state
        if request.method == "GET":
            return envelope([{"name": n, "type": "secret_text"} for n in state.secret_names(account, name)])
        try:
            body = await self._decode(request, SecretRequest)
        except ValueError as exc:
            return cf_error(BAD_REQUEST, str(exc))
        if not body.name.isidentifier():
            return cf_error(BAD_REQUEST, f"secret name {body.name!r} must be a valid identifier")
        await asyncio.to_thread(state.put_secret, account, name, body.name, body.text)
        await self.restart_worker(account, name)  # the next request sees the new env
        return envelope({"name": body.name, "type": "secret_text"})

    async def delete_secret(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        secret = request.path_params["secret"]
        if not await asyncio.to_thread(self.state.delete_secret, account, name, secret):
            return cf_error(NOT_FOUND, f"no secret {secret!r}", 404)
        await self.restart_worker(account, name)
        return envelope(None)

    async def tail_events(self, request: Request) -> Response:
        try:
            account, name = self._auth(request)
        except AuthError as exc:
            return cf_error(AUTH_ERROR, str(exc), exc.status)
        wanted = request.query_params.get("status")
        queue = self.tail.subscribe(account, name)

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
                self.tail.unsubscribe(account, name, queue)

        return StreamingResponse(events(), media_type="application/x-ndjson")
