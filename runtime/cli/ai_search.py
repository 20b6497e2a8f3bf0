"""`edge ai-search`: the project's AI Search instances, as `wrangler ai-search` names its commands,
worked straight on the state dir through the AI Search service (runtime.ai.search.service; no server
needed, as `edge vectorize`), under the config's account:

    edge ai-search list | create NAME | get NAME | update NAME | delete NAME | stats NAME
    edge ai-search search NAME --query Q [--max-num-results N] [--score-threshold S] [--filter k=v]...
    edge ai-search namespace list | create NAME | get NAME | update NAME | delete NAME
    edge ai-search jobs list NAME | create NAME | get NAME JOB_ID
    edge ai-search items list NAME | get NAME ID | chunks NAME ID | upload NAME FILE... | delete NAME ID

Each takes --namespace/-n (default "default") and --json. `create` of an instance over an R2 bucket
(--type r2 --source BUCKET) or over the folder the config names for it ([[ai_search]] source_dir),
and `jobs create`, index the source at once with a progress bar on stderr (documents, chunks,
errors). `items upload` is edge's own (wrangler uploads through the dashboard or the REST API).
Answering (chat completions) needs the models: ask a running `edge dev` (its REST API or a worker)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runtime.ai.search.common import DEFAULT_NAMESPACE
from runtime.cli.common import CONFIG_HELP, _fail
from runtime.control.config import ConfigError, load_config

POLL_S = 0.1
STALL_S = 60.0  # indexing followed until no document moved on for this long
STOP_S = 2.0  # the background work's moment to stop when a command ends
BAR = 30


class _Refused(Exception):
    """A flag that does not read; the message says what to send."""


def cmd_ai_search(args: argparse.Namespace) -> int:
    from runtime.ai.search.errors import AISearchError
    from runtime.ai.search.service import AISearch
    from runtime.bindings import BindingStores
    from runtime.control.state import private_dir

    try:
        c = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    private_dir(c.state_dir)
    stores = BindingStores(c.state_dir)
    search = AISearch(c.state_dir, stores)
    loop = asyncio.new_event_loop()
    try:
        out, done = loop.run_until_complete(_run(search, c, args))
    except AISearchError as exc:
        return _fail(f"{exc.message} (AI Search error {exc.code})")
    except _Refused as exc:
        return _fail(str(exc))
    finally:
        _stop(loop)
        _close(search, stores)
        loop.close()
    print(json.dumps(out, indent=2, default=str) if args.json else done)
    return 0


def _stop(loop: asyncio.AbstractEventLoop) -> None:
    """What the command leaves running on its loop (the service's indexer) cancelled and given a
    moment to end: never waited for without end, as asyncio.run would."""
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    if left:
        loop.run_until_complete(asyncio.wait(left, timeout=STOP_S))
    loop.run_until_complete(loop.shutdown_asyncgens())


def _close(search: Any, stores: Any) -> None:
    """The service closed once its threads are done: a source sync still reading an R2 bucket or
    the index when the command ends finishes its turn before the files it reads are closed."""
    pool = getattr(search, "pool", None)
    if pool is not None:
        pool.close()  # no new turn starts; a running one ends with its slice
        prefix = f"{pool.name}-"
        for thread in threading.enumerate():
            if thread.name.startswith(prefix) and thread is not threading.current_thread():
                thread.join(STOP_S)
    search.close()
    stores.close()


async def _run(search: Any, c: Any, args: argparse.Namespace) -> tuple[Any, str]:
    """(what --json prints, what a person reads) of one command."""
    account, ns = c.account_id, args.namespace
    group = args.ai_search_command
    if group == "namespace":
        return await _namespace(search, account, args)
    if group == "jobs":
        return await _jobs(search, c, args)
    if group == "items":
        return await _items(search, account, args)
    if group == "list":
        rows, total = await search.instances(account, ns, args.page, args.per_page)
        lines = [_instance_line(i) for i in rows]
        if not lines:
            lines = [f"no AI Search instances in namespace {ns} (edge ai-search create NAME)"]
        elif total > len(rows):
            lines.append(f"(page {args.page}: {len(rows)} of {total}; --page {args.page + 1} for more)")
        return rows, "\n".join(lines)
    if group == "create":
        body = {"id": args.name, **_settings(args)}
        if args.type is not None:
            body["type"] = args.type
        if args.source is not None:
            body["source"] = args.source
        params = {
            k: v
            for k, v in (
                ("prefix", args.prefix),
                ("include_items", args.include_items),
                ("exclude_items", args.exclude_items),
            )
            if v
        }
        if params:
            body["source_params"] = params
        folder = _folder_of(c, ns, args.name)
        if folder is not None and args.source is not None:
            raise _Refused(f"the config gives {args.name} a folder (source_dir {folder}); leave out --source")
        made = await search.instance_create(account, ns, body)
        if args.source is None and folder is None:
            hint = f"upload documents: edge ai-search items upload {args.name} FILE..."
            return made, f"{_created(made)}\n{hint}"
        if folder is not None:
            await search.sync_folder(account, ns, args.name, folder)
            made = await search.instance_get(account, ns, args.name)
        job = await _index(search, c, ns, args.name, folder, args.json, synced=True)
        return {**made, "job": job}, _created(made) + (f"\n{_job_line(job)}" if job else "")
    if group == "get":
        return (found := await search.instance_get(account, ns, args.name)), json.dumps(found, indent=2)
    if group == "update":
        body = _settings(args)
        if args.paused is not None:
            body["paused"] = args.paused
        if not body:
            raise _Refused("edge ai-search update: nothing to change; give at least one flag (see --help)")
        changed = await search.instance_update(account, ns, args.name, body)
        return changed, f"updated AI Search instance {args.name}"
    if group == "delete":
        gone = await search.instance_delete(account, ns, args.name)
        return gone, f"deleted AI Search instance {args.name}, its items and its index"
    if group == "stats":
        stats = await search.instance_stats(account, ns, args.name)
        return stats, _stats_lines(stats)
    # search
    body = _search_body(args)
    found = await search.search(account, ns, [args.name], body, None)
    return found, _search_lines(found)


# --- instances --------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings flags given, in the REST body's names (as wrangler maps them)."""
    names = {
        "embedding_model": "embedding_model",
        "generation_model": "ai_search_model",
        "chunk_size": "chunk_size",
        "chunk_overlap": "chunk_overlap",
        "max_num_results": "max_num_results",
        "reranking": "reranking",
        "reranking_model": "reranking_model",
        "hybrid_search": "hybrid_search_enabled",
        "cache": "cache",
        "score_threshold": "score_threshold",
    }
    return {key: getattr(args, flag) for flag, key in names.items() if getattr(args, flag) is not None}


def _folder_of(c: Any, ns: str, name: str) -> Path | None:
    """The folder the config names for instance `name` ([[ai_search]] source_dir), in the default
    namespace only (an [[ai_search]] binding's instance is there)."""
    if ns != DEFAULT_NAMESPACE:
        return None
    from runtime.bindings.ai_search import source_folders

    try:
        folders = dict(source_folders(c.bindings.get("ai_search", []), c.base_dir))
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    return folders.get(name)


def _source(i: dict[str, Any]) -> str:
    folder = (i.get("edge") or {}).get("source_dir")
    if folder:
        return f"folder {folder}"
    return f"{i.get('type')}:{i.get('source')}" if i.get("source") else "uploads"


def _instance_line(i: dict[str, Any]) -> str:
    source = _source(i)
    status = " (paused)" if i.get("paused") else ""
    return (
        f"{i.get('id')}: {source}, {i.get('embedding_model')}, chunks of {i.get('chunk_size')} tokens{status}"
    )


def _created(made: dict[str, Any]) -> str:
    return (
        f"created AI Search instance {made.get('id')}\n"
        f"  source:     {_source(made)}\n"
        f"  model:      {made.get('ai_search_model') or 'default'}\n"
        f"  embedding:  {made.get('embedding_model') or 'default'}"
    )


def _stats_lines(stats: dict[str, Any]) -> str:
    counts = ", ".join(
        f"{k} {stats.get(k) or 0}" for k in ("queued", "running", "completed", "error", "skipped")
    )
    vectors = ((stats.get("engine") or {}).get("vectorize") or {}).get("vectorsCount")
    chunks = f"; {vectors} chunks indexed" if vectors is not None else ""
    last = f"; last activity {stats['last_activity']}" if stats.get("last_activity") else ""
    return f"items: {counts}{chunks}{last}"


# --- search -----------------------------------------------------------------------------------------


def _search_body(args: argparse.Namespace) -> dict[str, Any]:
    retrieval: dict[str, Any] = {}
    if args.max_num_results is not None:
        retrieval["max_num_results"] = args.max_num_results
    if args.score_threshold is not None:
        retrieval["match_threshold"] = args.score_threshold
    if args.retrieval_type is not None:
        retrieval["retrieval_type"] = args.retrieval_type
    if args.filter:
        retrieval["filters"] = _filters(args.filter)
    options: dict[str, Any] = {}
    if retrieval:
        options["retrieval"] = retrieval
    if args.reranking is not None:
        options["reranking"] = {"enabled": args.reranking}
    return {"query": args.query, **({"ai_search_options": options} if options else {})}


def _filters(given: list[str]) -> dict[str, Any]:
    """--filter key=value, repeated: equality on each metadata field (wrangler's form)."""
    out: dict[str, Any] = {}
    for item in given:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise _Refused(f"--filter {item!r}: write it as key=value (e.g. --filter folder=docs/)")
        out[key] = value
    return out


def _search_lines(found: dict[str, Any]) -> str:
    chunks = found.get("chunks") or []
    lines = [f'search query: "{found.get("search_query", "")}"  ({len(chunks)} results)']
    if not chunks:
        lines.append("no results")
    for n, chunk in enumerate(chunks, 1):
        text = " ".join(str(chunk.get("text", "")).split())
        text = text if len(text) <= 80 else text[:80] + "..."
        key = (chunk.get("item") or {}).get("key", "")
        lines.append(f"{n:>3}  {float(chunk.get('score') or 0):.4f}  {key}  {text}")
    return "\n".join(lines)


# --- namespaces -------------------------------------------------------------------------------------


async def _namespace(search: Any, account: str, args: argparse.Namespace) -> tuple[Any, str]:
    action = args.namespace_command
    if action == "list":
        found = await search.namespaces(account)
        if args.search:
            w = args.search.lower()
            found = [n for n in found if w in n["name"].lower() or w in (n.get("description") or "").lower()]
        shown = found[(args.page - 1) * args.per_page : args.page * args.per_page]
        lines = [f"{n['name']}: {n.get('description') or ''}".rstrip(": ") for n in shown]
        return shown, "\n".join(lines) or "no namespaces match"
    if action == "create":
        body = {"name": args.name, **({"description": args.description} if args.description else {})}
        return await search.namespace_create(account, body), f"created AI Search namespace {args.name}"
    if action == "get":
        found = await search.namespace_get(account, args.name)
        return found, json.dumps(found, indent=2)
    if action == "update":
        changed = await search.namespace_update(account, args.name, {"description": args.description})
        return changed, f"updated AI Search namespace {args.name}"
    gone = await search.namespace_delete(account, args.name)
    return gone, f"deleted AI Search namespace {args.name}"


# --- jobs -------------------------------------------------------------------------------------------


async def _jobs(search: Any, c: Any, args: argparse.Namespace) -> tuple[Any, str]:
    account, ns, action = c.account_id, args.namespace, args.jobs_command
    if action == "list":
        rows, _ = await search.jobs(account, ns, args.name, args.page, args.per_page)
        return rows, "\n".join(_job_line(j) for j in rows) or f"no indexing jobs for {args.name} yet"
    if action == "get":
        job = await search.job_get(account, ns, args.name, args.job_id)
        return job, _job_line(job)
    folder = _folder_of(c, ns, args.name)
    body = {"description": args.description} if args.description else None
    job = await _index(search, c, ns, args.name, folder, args.json, body)
    return job, _job_line(job) if job else f"{args.name}: nothing new in its source"


def _job_line(job: dict[str, Any]) -> str:
    ended = f", ended {job['ended_at']} ({job.get('end_reason') or 'done'})" if job.get("ended_at") else ""
    about = f" {job['description']!r}" if job.get("description") else ""
    return f"job {job.get('id')}{about}: started {job.get('started_at') or '-'}{ended}"


async def _index(
    search: Any,
    c: Any,
    ns: str,
    name: str,
    folder: Path | None,
    quiet: bool,
    body: dict[str, Any] | None = None,
    synced: bool = False,
) -> dict[str, Any] | None:
    """A sync of the instance's source now (its R2 bucket, or the config's folder for it), then its
    documents indexed, with a progress bar on stderr (documents done of those found, chunks, errors);
    the job. `synced`: the source was read already (a create reads it), so only the indexing is
    followed. The indexing runs in this process, while this waits (a running edge dev takes over
    whatever is left if it stops early)."""
    account = c.account_id
    job: dict[str, Any] | None = None
    if not synced and folder is not None:
        current = (await search.instance_get(account, ns, name)).get("edge") or {}
        if current.get("source_dir") != str(folder):  # the folder is new to it: pointed there, read
            await search.sync_folder(account, ns, name, folder)
            synced = True
    if synced:
        newest, _ = await search.jobs(account, ns, name, 1, 1)
        job = newest[0] if newest else None
    else:
        job = await search.job_create(account, ns, name, body)
    bar = Progress(sys.stderr, quiet)
    moved = time.monotonic()
    while True:
        stats = await search.instance_stats(account, ns, name)
        if bar.show(stats):
            moved = time.monotonic()
        if stats["queued"] + stats["running"] == 0:
            break
        if time.monotonic() - moved > STALL_S:
            bar.close(stats)
            raise _Refused(
                f"indexing {name} moved on no document for {STALL_S:.0f} s; it goes on in a running edge dev "
                f"(edge ai-search stats {name} says where it is)"
            )
        await asyncio.sleep(POLL_S)
    bar.close(stats)
    return job


class Progress:
    """One line on stderr, rewritten in place on a terminal (a line per change elsewhere)."""

    def __init__(self, stream: Any, quiet: bool):
        self.stream, self.quiet = stream, quiet
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = ""

    def line(self, stats: dict[str, Any]) -> str:
        done = sum(int(stats.get(k) or 0) for k in ("completed", "error", "skipped"))
        total = done + sum(int(stats.get(k) or 0) for k in ("queued", "running"))
        filled = BAR if total == 0 else BAR * done // total
        vectors = ((stats.get("engine") or {}).get("vectorize") or {}).get("vectorsCount") or 0
        return (
            f"indexing [{'#' * filled}{'.' * (BAR - filled)}] {done}/{total} documents, "
            f"{vectors} chunks, {int(stats.get('error') or 0)} errors"
        )

    def show(self, stats: dict[str, Any]) -> bool:
        """Whether the line changed (shown unless quiet)."""
        text = self.line(stats)
        if text == self.last:
            return False
        self.last = text
        if not self.quiet:
            self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
            self.stream.flush()
        return True

    def close(self, stats: dict[str, Any]) -> None:
        self.show(stats)
        if self.tty and not self.quiet:
            self.stream.write("\n")
            self.stream.flush()


# --- items ------------------------------------------------------------------------------------------


async def _items(search: Any, account: str, args: argparse.Namespace) -> tuple[Any, str]:
    ns, name, action = args.namespace, args.name, args.items_command
    if action == "list":
        rows, total = await search.items(
            account, ns, name, args.page, args.per_page, key=args.key, status=args.status
        )
        lines = [f"{i['id']}  {i.get('status')}  {i.get('key')}" for i in rows]
        return rows, "\n".join(lines) or f"no items in {name}" + (" match" if args.key or args.status else "")
    if action == "get":
        item = await search.item_get(account, ns, name, args.item_id)
        return item, json.dumps(item, indent=2, default=str)
    if action == "chunks":
        rows, total = await search.item_chunks(account, ns, name, args.item_id, args.page, args.per_page)
        return rows, "\n\n".join(f"[{c.get('id')}]\n{c.get('text', '')}" for c in rows) or "no chunks"
    if action == "delete":
        gone = await search.item_delete(account, ns, name, args.item_id)
        return gone, f"deleted item {args.item_id}"
    return await _upload(search, account, args)


async def _upload(search: Any, account: str, args: argparse.Namespace) -> tuple[Any, str]:
    metadata = None
    if args.metadata:
        try:
            metadata = json.loads(args.metadata)
        except ValueError:
            raise _Refused('--metadata: a JSON object, e.g. \'{"folder": "docs"}\'') from None
        if not isinstance(metadata, dict):
            raise _Refused("--metadata: a JSON object of field names to values")
    files = [Path(f) for f in args.files]
    for f in files:
        if not f.is_file():
            raise _Refused(f"{f}: no such file")
    done: list[dict[str, Any]] = []
    bar = Progress(sys.stderr, args.json)
    for n, f in enumerate(files, 1):
        item = await search.item_upload(account, args.namespace, args.name, f.name, f.read_bytes(), metadata)
        if args.wait:
            item = {**item, **await search.item_wait(account, args.namespace, args.name, item["id"])}
        done.append(item)
        bar.show(await search.instance_stats(account, args.namespace, args.name))
        if n == len(files):
            bar.close(await search.instance_stats(account, args.namespace, args.name))
    lines = [
        f"{i['id']}  {i.get('status')}  {i.get('key')}" + (f"  {i['error']}" if i.get("error") else "")
        for i in done
    ]
    return done, "\n".join(lines)


# --- the parser -------------------------------------------------------------------------------------


def add_ai_search_parser(sub) -> None:
    top = sub.add_parser("ai-search", help="AI Search instances: create, index, search (wrangler ai-search)")
    cmds = top.add_subparsers(dest="ai_search_command", required=True)
    made: list[argparse.ArgumentParser] = []

    def command(parent, name: str, helptext: str, *positional: tuple[str, str]) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=helptext, description=helptext)
        for arg, about in positional:
            p.add_argument(arg, help=about)
        made.append(p)
        return p

    instance = ("name", "the instance's name (its id)")
    listing = command(cmds, "list", "the namespace's instances")
    _paging(listing)
    create = command(
        cmds, "create", "a new instance; over an R2 bucket or the config's folder, indexed now", instance
    )
    create.add_argument(
        "--type",
        choices=["r2", "web-crawler"],
        help="the source: an R2 bucket (web-crawler is refused: no network)",
    )
    create.add_argument("--source", help="the R2 bucket's name")
    create.add_argument("--prefix", help="index only the bucket's keys under this prefix")
    create.add_argument(
        "--include-items", nargs="+", metavar="GLOB", help="index only the keys these globs match"
    )
    create.add_argument(
        "--exclude-items", nargs="+", metavar="GLOB", help="leave out the keys these globs match"
    )
    update = command(cmds, "update", "change an instance's settings", instance)
    update.add_argument(
        "--paused", action=argparse.BooleanOptionalAction, default=None, help="pause or resume syncing"
    )
    for p in (create, update):
        _setting_flags(p)
    command(cmds, "get", "an instance's settings", instance)
    delete = command(cmds, "delete", "an instance, its items and its index", instance)
    delete.add_argument("--force", "-y", action="store_true", help="accepted for wrangler's sake")
    command(cmds, "stats", "an instance's items by status and its index's size", instance)
    search = command(cmds, "search", "search an instance (retrieval only)", instance)
    search.add_argument("--query", required=True, help="what to look for")
    search.add_argument("--max-num-results", type=int, help="at most this many chunks (1 to 50)")
    search.add_argument("--score-threshold", type=float, help="only chunks scoring at least this (0 to 1)")
    search.add_argument("--retrieval-type", choices=["vector", "keyword", "hybrid"], help="default: hybrid")
    search.add_argument(
        "--reranking", action=argparse.BooleanOptionalAction, default=None, help="rerank the chunks found"
    )
    search.add_argument(
        "--filter", action="append", metavar="KEY=VALUE", help="a metadata field's value (repeatable)"
    )

    ns = cmds.add_parser("namespace", help="AI Search namespaces")
    ns_cmds = ns.add_subparsers(dest="namespace_command", required=True)
    ns_list = command(ns_cmds, "list", "the account's namespaces")
    ns_list.add_argument("--search", help="only those whose name or description holds this")
    _paging(ns_list)
    named = ("name", "the namespace's name")
    ns_create = command(ns_cmds, "create", "a new namespace", named)
    ns_create.add_argument("--description", help="what it holds (at most 256 characters)")
    command(ns_cmds, "get", "one namespace", named)
    ns_update = command(ns_cmds, "update", "change a namespace's description", named)
    ns_update.add_argument("--description", required=True, help="the new description")
    command(ns_cmds, "delete", "an empty namespace (not default)", named)

    jobs = cmds.add_parser("jobs", help="an instance's indexing jobs")
    job_cmds = jobs.add_subparsers(dest="jobs_command", required=True)
    _paging(command(job_cmds, "list", "an instance's jobs, newest first", instance))
    job_create = command(job_cmds, "create", "sync the instance's source now, with a progress bar", instance)
    job_create.add_argument("--description", help="a note kept with the job")
    command(job_cmds, "get", "one job", instance, ("job_id", "the job's id"))

    items = cmds.add_parser("items", help="an instance's items (documents)")
    item_cmds = items.add_subparsers(dest="items_command", required=True)
    item_list = command(item_cmds, "list", "an instance's items", instance)
    item_list.add_argument(
        "--status",
        choices=["queued", "running", "completed", "error", "skipped", "outdated"],
        help="only the items in this indexing status",
    )
    item_list.add_argument("--key", help="only the item of this key")
    _paging(item_list)
    one = ("item_id", "the item's id")
    command(item_cmds, "get", "one item", instance, one)
    _paging(command(item_cmds, "chunks", "an item's chunks and their text", instance, one))
    command(item_cmds, "delete", "an item and its chunks (edge's own)", instance, one)
    upload = command(
        item_cmds, "upload", "upload files as items (edge's own), each keyed by its name", instance
    )
    upload.add_argument(
        "files", nargs="+", metavar="FILE", help="the documents (Markdown, text, HTML, PDF, ...)"
    )
    upload.add_argument("--metadata", help='a JSON object given to each, e.g. \'{"folder": "docs"}\'')
    upload.add_argument("--wait", action="store_true", help="return once each is indexed")

    for p in made:
        p.add_argument("--namespace", "-n", default=DEFAULT_NAMESPACE, help="the namespace")
        p.add_argument("--json", action="store_true", help="print JSON")
        p.add_argument("--config", default=None, help=CONFIG_HELP)
        p.set_defaults(func=cmd_ai_search)


def _paging(p: argparse.ArgumentParser) -> None:
    p.add_argument("--page", type=_positive, default=1, help="the page of results")
    p.add_argument("--per-page", type=_positive, default=20, help="results a page")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer, not {text!r}")
    return value


def _setting_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--embedding-model", help="the embedding model's name")
    p.add_argument("--generation-model", help="the model that answers chat completions")
    p.add_argument("--chunk-size", type=int, help="tokens a chunk (at least 64)")
    p.add_argument("--chunk-overlap", type=int, help="tokens shared by neighbouring chunks")
    p.add_argument("--max-num-results", type=int, help="chunks a search returns (1 to 50)")
    p.add_argument("--reranking", action=argparse.BooleanOptionalAction, default=None, help="rerank results")
    p.add_argument("--reranking-model", help="the reranking model's name")
    p.add_argument(
        "--hybrid-search", action=argparse.BooleanOptionalAction, default=None, help="keyword + vector"
    )
    p.add_argument(
        "--cache", action=argparse.BooleanOptionalAction, default=None, help="kept for wrangler's sake"
    )
    p.add_argument("--score-threshold", type=float, help="the least score a result needs (0 to 1)")
