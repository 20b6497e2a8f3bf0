"""AI Search's REST API through Cloudflare's own `cloudflare` SDK (5.9.0, unmodified) against a real
`edge dev`: namespaces made, read, changed and deleted; an instance over uploaded files (the SDK's
multipart upload, its metadata), its items listed, read, downloaded, chunked and deleted; search and
chat completions on one instance and across a namespace, a streamed answer's `chunks` event first;
stats and jobs; the deprecated default-namespace paths; another account's token refused; each
refusal in Cloudflare's envelope with AI Search's code and status. One server for the module."""

from __future__ import annotations

import json
import textwrap
import time
from itertools import islice

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

cloudflare = pytest.importorskip("cloudflare")
pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"  # answers in Workers AI's shape ({"response"})
ACCOUNT = "local"
NS = "handbook"

WORKER = """
from workers import Response

async def on_fetch(request, env):
    return Response("ok")
"""

DOCS = {
    "bakery.md": "# Lena's bakery\n\nLena runs a bakery in Lisbon. It opens at 7 am and sells rye bread.",
    "bookshop.md": "# Oscar's bookshop\n\nOscar runs a bookshop in Madrid. It opens at 9 am every day.",
    "cafe.md": "# Julia's cafe\n\nJulia runs a cafe in Berlin. Her espresso costs two euros.",
}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("ai-search-rest")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "ai-search-rest"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models = ["{MODEL}"]
        models_dir = "{REPO / "models"}"
    """)
    )
    server = DevServer(d / "wrangler-like.toml", cwd=d)
    server.__enter__()
    server.token = (d / ".edge" / "api-token").read_text().strip()
    admin = (d / ".edge" / "admin-token").read_text().strip()
    server.other_token = server.create_account(admin)
    server.admin = admin
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv):
    return cloudflare.Cloudflare(api_token=srv.token, base_url=f"{srv.url}/client/v4", max_retries=0)


@pytest.fixture(scope="module")
def docs(client):
    """Namespace `handbook` with instance `places` holding DOCS, uploaded as the SDK uploads and
    indexed (polled, as uploadAndPoll does); the items by key."""
    client.aisearch.namespaces.create(account_id=ACCOUNT, name=NS, description="the staff handbook")
    made = client.aisearch.namespaces.instances.create(NS, account_id=ACCOUNT, id="places", chunk_size=128)
    assert made.id == "places" and made.chunk_size == 128
    items = instances(client).items
    uploaded = {}
    for key, text in DOCS.items():
        meta = json.dumps({"city": key.split(".")[0]})
        up = items.upload(
            "places", account_id=ACCOUNT, name=NS, file={"file": (key, text.encode()), "metadata": meta}
        )
        assert up.key == key and up.status in ("queued", "running", "completed")
        uploaded[key] = up.id
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        statuses = {items.get(i, account_id=ACCOUNT, name=NS, id="places").status for i in uploaded.values()}
        if statuses == {"completed"}:
            return uploaded
        time.sleep(0.1)
    raise AssertionError(f"not indexed: {statuses}")


def instances(client):
    return client.aisearch.namespaces.instances


def error_of(exc) -> tuple[int, int]:
    """(the envelope's first error code, the HTTP status) of an SDK exception."""
    body = exc.value.response.json()
    assert body["success"] is False and body["result"] is None
    return body["errors"][0]["code"], exc.value.status_code


def test_namespaces_are_made_listed_read_changed_and_deleted(client, docs):
    names = [n.name for n in client.aisearch.namespaces.list(account_id=ACCOUNT)]
    assert "default" in names and NS in names
    assert client.aisearch.namespaces.read(NS, account_id=ACCOUNT).description == "the staff handbook"
    client.aisearch.namespaces.create(account_id=ACCOUNT, name="scratch")
    changed = client.aisearch.namespaces.update("scratch", account_id=ACCOUNT, description="for now")
    assert changed.description == "for now"
    found = client.aisearch.namespaces.list(account_id=ACCOUNT, search="FOR NOW")
    assert [n.name for n in found.result] == ["scratch"] and found.result_info.total_count == 1
    client.aisearch.namespaces.delete("scratch", account_id=ACCOUNT)
    with pytest.raises(cloudflare.NotFoundError) as exc:
        client.aisearch.namespaces.read("scratch", account_id=ACCOUNT)
    assert error_of(exc) == (7002, 404)
    with pytest.raises(cloudflare.ConflictError) as exc:
        client.aisearch.namespaces.create(account_id=ACCOUNT, name=NS)
    assert error_of(exc) == (7003, 409)
    with pytest.raises(cloudflare.ConflictError) as exc:  # it still holds an instance
        client.aisearch.namespaces.delete(NS, account_id=ACCOUNT)
    assert error_of(exc)[0] == 7003


def test_instances_are_listed_in_pages_read_and_changed(client, docs):
    for n in range(3):
        instances(client).create(NS, account_id=ACCOUNT, id=f"extra-{n}")
    every = list(islice(instances(client).list(NS, account_id=ACCOUNT, per_page=2), 20))
    assert sorted(i.id for i in every) == ["extra-0", "extra-1", "extra-2", "places"]
    raw = instances(client).with_raw_response.list(NS, account_id=ACCOUNT, per_page=3).json()
    assert raw["result_info"] == {"page": 1, "per_page": 3, "count": 3, "total_count": 4}
    found = instances(client).list(NS, account_id=ACCOUNT, search="EXTRA-1")
    assert [i.id for i in found.result] == ["extra-1"]
    changed = instances(client).update("extra-0", account_id=ACCOUNT, name=NS, max_num_results=5)
    assert changed.max_num_results == 5
    assert instances(client).read("extra-0", account_id=ACCOUNT, name=NS).max_num_results == 5
    for n in range(3):
        assert instances(client).delete(f"extra-{n}", account_id=ACCOUNT, name=NS).id == f"extra-{n}"
    with pytest.raises(cloudflare.NotFoundError) as exc:
        instances(client).read("extra-0", account_id=ACCOUNT, name=NS)
    assert error_of(exc) == (7002, 404)


def test_items_are_listed_read_downloaded_chunked_and_deleted(client, docs):
    items = instances(client).items
    listed = list(islice(items.list("places", account_id=ACCOUNT, name=NS, per_page=2), 20))
    assert sorted(i.key for i in listed) == sorted(DOCS) and {i.status for i in listed} == {"completed"}
    one = items.list("places", account_id=ACCOUNT, name=NS, key="cafe.md").result
    assert [i.id for i in one] == [docs["cafe.md"]]
    assert items.list("places", account_id=ACCOUNT, name=NS, status="error").result == []
    by_id = items.list("places", account_id=ACCOUNT, name=NS, item_id=docs["bakery.md"]).result
    assert [i.key for i in by_id] == ["bakery.md"]
    item = items.get(docs["bakery.md"], account_id=ACCOUNT, name=NS, id="places")
    assert item.key == "bakery.md" and item.chunks_count >= 1 and item.metadata["city"] == "bakery"
    body = items.download(docs["bakery.md"], account_id=ACCOUNT, name=NS, id="places")
    assert body.read() == DOCS["bakery.md"].encode()
    chunks = items.chunks(docs["bakery.md"], account_id=ACCOUNT, name=NS, id="places", limit=5, offset=0)
    assert chunks and chunks[0].item.key == "bakery.md" and "rye bread" in " ".join(c.text for c in chunks)
    extra = items.upload("places", account_id=ACCOUNT, name=NS, file={"file": ("tmp.md", b"# temporary\n")})
    assert items.delete(extra.id, account_id=ACCOUNT, name=NS, id="places").key == "tmp.md"
    with pytest.raises(cloudflare.NotFoundError) as exc:
        items.get(extra.id, account_id=ACCOUNT, name=NS, id="places")
    assert error_of(exc) == (7002, 404)


def test_an_upload_that_waits_answers_once_indexed_and_bad_metadata_is_refused(client, docs):
    items = instances(client).items
    instances(client).create(NS, account_id=ACCOUNT, id="waits")
    try:
        done = items.upload(
            "waits",
            account_id=ACCOUNT,
            name=NS,
            file={"file": ("w.md", b"# Waiting\n\nIndexed before the answer."), "wait_for_completion": True},
        )
        assert done.status == "completed" and done.chunks_count >= 1
        for bad in ("not json", "[1, 2]"):
            with pytest.raises(cloudflare.BadRequestError) as exc:
                items.upload(
                    "waits", account_id=ACCOUNT, name=NS, file={"file": ("x.md", b"x"), "metadata": bad}
                )
            assert (
                error_of(exc) == (7001, 400)
                and "metadata" in exc.value.response.json()["errors"][0]["message"]
            )
    finally:
        instances(client).delete("waits", account_id=ACCOUNT, name=NS)


def test_search_finds_the_passage_that_answers(client, docs):
    found = instances(client).search(
        "places", account_id=ACCOUNT, name=NS, query="When does the bakery in Lisbon open?"
    )
    assert found.chunks[0].item.key == "bakery.md" and "7 am" in found.chunks[0].text
    assert found.search_query.startswith("When does the bakery")
    filtered = instances(client).search(
        "places",
        account_id=ACCOUNT,
        name=NS,
        messages=[{"role": "user", "content": "When does it open?"}],
        aisearch_options={"retrieval": {"filters": {"city": "bookshop"}, "max_num_results": 3}},
    )
    assert {c.item.key for c in filtered.chunks} == {"bookshop.md"}


def test_a_namespace_searches_and_answers_across_its_instances(client, docs):
    instances(client).create(NS, account_id=ACCOUNT, id="prices")
    try:
        instances(client).items.upload(
            "prices",
            account_id=ACCOUNT,
            name=NS,
            file={
                "file": ("rye.md", b"# Prices\n\nA loaf of rye bread costs four euros."),
                "wait_for_completion": True,
            },
        )
        found = client.aisearch.namespaces.search(
            NS,
            account_id=ACCOUNT,
            query="rye bread",
            aisearch_options={"instance_ids": ["places", "prices"]},
        )
        keys = {c.item.key for c in found.chunks}
        assert {"bakery.md", "rye.md"} <= keys
        answer = client.aisearch.namespaces.chat_completions(
            NS,
            account_id=ACCOUNT,
            messages=[{"role": "user", "content": "How much is a loaf of rye bread?"}],
            model=MODEL,
            aisearch_options={"instance_ids": ["places", "prices"]},
            extra_body={"max_tokens": 8},
        )
        assert answer.object == "chat.completion" and answer.chunks
        with pytest.raises(cloudflare.BadRequestError) as exc:
            client.aisearch.namespaces.search(
                NS, account_id=ACCOUNT, query="x", aisearch_options={"instance_ids": []}
            )
        assert error_of(exc) == (7001, 400)
    finally:
        instances(client).delete("prices", account_id=ACCOUNT, name=NS)


def test_chat_completions_answer_with_the_chunks_they_read(client, docs, srv):
    answer = instances(client).chat_completions(
        "places",
        account_id=ACCOUNT,
        name=NS,
        messages=[{"role": "user", "content": "Where is Julia's cafe?"}],
        model=MODEL,
        extra_body={"max_tokens": 8},
    )
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content.strip()  # the model's words (a miniature's: not checked)
    assert answer.chunks[0].item.key == "cafe.md"
    body = {"messages": [{"role": "user", "content": "Where is Julia's cafe?"}], "model": MODEL}
    url = (
        f"{srv.url}/client/v4/accounts/{ACCOUNT}/ai-search/namespaces/{NS}/instances/places/chat/completions"
    )
    with httpx.stream(
        "POST",
        url,
        json={**body, "stream": True, "max_tokens": 8},
        headers={"authorization": f"Bearer {srv.token}"},
        timeout=120,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    events = text.split("\n\n")
    assert events[0].startswith("event: chunks\ndata: ")
    assert json.loads(events[0].split("data: ", 1)[1])[0]["item"]["key"] == "cafe.md"
    assert "data: [DONE]" in text


def test_stats_and_jobs(client, docs):
    stats = instances(client).stats("places", account_id=ACCOUNT, name=NS)
    assert stats.completed == len(DOCS) and stats.queued == 0 and stats.error == 0
    assert stats.engine.vectorize.vectors_count >= len(DOCS) and stats.engine.vectorize.dimensions > 0
    jobs = instances(client).jobs
    assert list(jobs.list("places", account_id=ACCOUNT, name=NS)) == []  # uploads only: no source synced
    with pytest.raises(cloudflare.BadRequestError) as exc:  # nothing to sync: its items are uploads
        jobs.create("places", account_id=ACCOUNT, name=NS, description="now")
    assert error_of(exc) == (7001, 400)
    with pytest.raises(cloudflare.NotFoundError) as exc:
        jobs.get("no-such-job", account_id=ACCOUNT, name=NS, id="places")
    assert error_of(exc) == (7002, 404)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK says so of these paths
def test_the_deprecated_paths_are_the_default_namespace(client, docs):
    made = client.aisearch.instances.create(account_id=ACCOUNT, id="legacy")
    try:
        assert made.id == "legacy"
        assert "legacy" in [i.id for i in client.aisearch.instances.list(account_id=ACCOUNT)]
        assert "legacy" in [i.id for i in instances(client).list("default", account_id=ACCOUNT)]
        assert client.aisearch.instances.read("legacy", account_id=ACCOUNT).id == "legacy"
        assert client.aisearch.instances.stats("legacy", account_id=ACCOUNT).completed == 0
        assert client.aisearch.instances.search("legacy", account_id=ACCOUNT, query="anything").chunks == []
        in_ns = client.aisearch.instances.list(account_id=ACCOUNT, namespace=NS)
        assert [i.id for i in in_ns.result] == ["places"]
    finally:
        client.aisearch.instances.delete("legacy", account_id=ACCOUNT)


def test_another_accounts_token_is_refused_and_its_own_account_sees_nothing(client, docs, srv):
    other = cloudflare.Cloudflare(api_token=srv.other_token, base_url=f"{srv.url}/client/v4", max_retries=0)
    for attempt in (
        lambda: other.aisearch.namespaces.list(account_id=ACCOUNT),
        lambda: other.aisearch.namespaces.instances.search(
            "places", account_id=ACCOUNT, name=NS, query="bakery"
        ),
        lambda: other.aisearch.namespaces.instances.items.list("places", account_id=ACCOUNT, name=NS),
        lambda: other.aisearch.namespaces.instances.delete("places", account_id=ACCOUNT, name=NS),
    ):
        with pytest.raises(cloudflare.PermissionDeniedError) as exc:
            attempt()
        assert error_of(exc) == (10000, 403)
    assert [n.name for n in other.aisearch.namespaces.list(account_id="other")] == ["default"]
    with pytest.raises(cloudflare.NotFoundError) as exc:
        other.aisearch.namespaces.instances.search("places", account_id="other", name=NS, query="bakery")
    assert error_of(exc) == (7002, 404)
    anonymous = httpx.get(f"{srv.url}/client/v4/accounts/{ACCOUNT}/ai-search/namespaces", timeout=30)
    assert anonymous.status_code == 401 and anonymous.json()["errors"][0]["code"] == 10000
    assert instances(client).read("places", account_id=ACCOUNT, name=NS).id == "places"  # untouched


def test_refusals_name_what_to_change(client, docs, srv):
    with pytest.raises(cloudflare.BadRequestError) as exc:  # no network here
        instances(client).create(
            NS, account_id=ACCOUNT, id="web", type="web-crawler", source="https://a.example"
        )
    assert error_of(exc) == (7006, 400)
    with pytest.raises(cloudflare.BadRequestError) as exc:
        instances(client).create(NS, account_id=ACCOUNT, id="BAD NAME")
    assert error_of(exc) == (7001, 400)
    with pytest.raises(cloudflare.ConflictError) as exc:
        instances(client).create(NS, account_id=ACCOUNT, id="places")
    assert error_of(exc) == (7003, 409)
    with pytest.raises(cloudflare.BadRequestError) as exc:
        instances(client).search("places", account_id=ACCOUNT, name=NS, query="x", extra_body={"bogus": 1})
    assert error_of(exc) == (7001, 400) and "bogus" in exc.value.response.json()["errors"][0]["message"]
    base = f"{srv.url}/client/v4/accounts/{ACCOUNT}/ai-search/namespaces"
    auth = {"authorization": f"Bearer {srv.token}"}
    for method, path, kwargs, where in (
        ("POST", "", {"content": b"{not json"}, "JSON"),
        ("POST", "", {"json": {"name": 3}}, "$.name"),
        ("GET", "?per_page=0", {}, "per_page"),
        ("GET", "?sort=name", {}, "sort"),
        ("POST", f"/{NS}/instances/places/items", {"json": {"key": "x"}}, "multipart"),
        ("POST", f"/{NS}/search", {"json": {"query": "x"}}, "instance_ids"),
    ):
        r = httpx.request(method, base + path, headers=auth, timeout=30, **kwargs)
        assert r.status_code == 400, (path, r.text)
        error = r.json()["errors"][0]
        assert error["code"] == 7001 and where in error["message"], (path, error)


def test_a_generation_is_an_ai_call_of_the_account_counted_against_its_rate_limit(srv):
    """Chat completions run the model as POST /ai/run does: the account's requests a minute count
    them, and the one past the limit is AI Search's 7004, 429, with Retry-After."""
    admin = {"authorization": f"Bearer {srv.admin}"}
    r = httpx.patch(f"{srv.url}/cdn-cgi/edge/accounts/other", json={"rpm": 1}, headers=admin, timeout=30)
    assert r.status_code == 200, r.text
    other = cloudflare.Cloudflare(api_token=srv.other_token, base_url=f"{srv.url}/client/v4", max_retries=0)
    instances(other).create("default", account_id="other", id="limited")
    ask = {
        "account_id": "other",
        "name": "default",
        "messages": [{"role": "user", "content": "hello"}],
        "model": MODEL,
        "extra_body": {"max_tokens": 2},
    }
    assert instances(other).chat_completions("limited", **ask).object == "chat.completion"
    with pytest.raises(cloudflare.RateLimitError) as exc:
        instances(other).chat_completions("limited", **ask)
    assert error_of(exc) == (7004, 429) and int(exc.value.response.headers["retry-after"]) >= 1
    # retrieval alone is no model call: still answered
    assert instances(other).search("limited", account_id="other", name="default", query="x").chunks == []


def test_a_downloaded_html_item_is_never_a_page_of_this_origin(srv, client):
    """A tenant's HTML file comes back as a download, unsniffed and sandboxed: never run as a page
    of the runtime's origin (where the dashboard's cookie lives)."""
    items = instances(client).items
    page = b"<script>fetch('/cdn-cgi/edge/dashboard/events')</script>"
    made = items.upload("places", account_id=ACCOUNT, name=NS, file={"file": ("x.html", page)})
    r = httpx.get(
        f"{srv.url}/client/v4/accounts/{ACCOUNT}/ai-search/namespaces/{NS}/instances/places/items/{made.id}/download",
        headers={"authorization": f"Bearer {srv.token}"},
        timeout=30,
    )
    assert r.status_code == 200 and r.content == page
    assert r.headers["content-disposition"].startswith("attachment")
    assert (
        r.headers["x-content-type-options"] == "nosniff" and "sandbox" in r.headers["content-security-policy"]
    )
    items.delete(made.id, account_id=ACCOUNT, name=NS, id="places")
