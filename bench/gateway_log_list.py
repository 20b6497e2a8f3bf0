"""An AI Gateway's 20,000 log rows listed whole through Cloudflare's own `cloudflare` SDK, its
auto-pagination asking page after page of a running `edge dev` until one comes back empty
(runtime.routes.gateway_rest, runtime.ai.gateway_log_query): at the SDK's default page (20 rows) and
at the largest (50), then with filters and another order, each checked to hold every row it should
exactly once. The baseline, in the same run: the same pages read with plain httpx (no SDK, no
models), so what the SDK adds shows apart from what the runtime takes.

    python bench/gateway_log_list.py [--rows 20000]

The rows are written before `edge dev` starts, through the store `edge dev` opens (the gateway
created with the API's settings, its log cap raised to hold them all), as its calls log them: one
in five failed, one in three cached, four rows a timestamp (so the order's tie-break on id is
walked too), metadata on one in two. The goal (issue 59): the whole list in under 30 s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import cloudflare  # noqa: E402

from runtime.ai.gateway_options import GatewaySettings  # noqa: E402
from runtime.ai.gateway_registry import GatewayRegistry  # noqa: E402
from runtime.ai.gateway_store import GatewayStore  # noqa: E402
from runtime.bench.devserver import start_dev, write_project  # noqa: E402

ACCOUNT, GATEWAY = "local", "bench"
MODELS = ("@cf/meta/llama-3.1-8b-instruct", "@cf/qwen/qwen2.5-coder-32b-instruct")
T0 = 1_800_000_000.0


def fill(state_dir: Path, rows: int) -> None:
    """`rows` log rows of the account's gateway, as Gateways.run logs them, with small bodies."""
    store = GatewayStore(state_dir / "ai-gateway.db")
    GatewayRegistry(store, {}, time.time).create(ACCOUNT, GATEWAY, GatewaySettings(log_rows=rows))
    for i in range(rows):
        entry = {
            "id": uuid.uuid4().hex,
            "created_at": T0 + i // 4,
            "gateway": GATEWAY,
            "provider": "workers-ai",
            "path": f"workers-ai/{MODELS[i % 2]}",
            "model": MODELS[i % 2],
            "step": 0,
            "success": i % 5 != 0,
            "cached": i % 3 == 0,
            "status_code": 200 if i % 5 else 503,
            "error": None,
            "duration": 5 + i % 400,
            "attempts": 1,
            "stream": False,
            "tokens_in": 12 + i % 50,
            "tokens_out": 40 + i % 90,
            "cost": 0.0,
            "model_type": "Text Generation",
            "request_type": "workers-ai",
            "request_content_type": "application/json",
            "response_content_type": "application/json",
            "tags": ["checkout"],
            "metadata": {"user": f"user-{i % 100}"} if i % 2 else {},
            "event_id": None,
            "request_id": str(uuid.uuid4()),
            "score": None,
            "feedback": None,
        }
        store.log(
            ACCOUNT,
            GATEWAY,
            entry,
            b'{"prompt": "hello", "max_tokens": 64}',
            b'{"response": "hi"}',
            keep=rows,
        )
    store.close()


def sdk_list(client: cloudflare.Cloudflare, **params) -> tuple[float, list[str], int]:
    started = time.perf_counter()
    first = client.ai_gateway.logs.list(GATEWAY, account_id=ACCOUNT, **params)
    ids, pages = [], 0
    for page in first.iter_pages():
        pages += 1
        ids += [row.id for row in page.result]
    return time.perf_counter() - started, ids, pages  # the last the empty one that ended it


def raw_list(url: str, token: str, per_page: int) -> tuple[float, list[str], int]:
    started, ids, page = time.perf_counter(), [], 1
    with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        while True:
            got = http.get(
                f"{url}/client/v4/accounts/{ACCOUNT}/ai-gateway/gateways/{GATEWAY}/logs",
                params={"page": page, "per_page": per_page},
            ).json()["result"]
            if not got:
                return time.perf_counter() - started, ids, page
            ids += [row["id"] for row in got]
            page += 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gateway-log-list-"))
    proc = None
    try:
        write_project(folder, "gateway-log-list")
        started = time.perf_counter()
        fill(folder / ".edge", args.rows)
        print(f"{args.rows} log rows written in {time.perf_counter() - started:.1f} s")
        proc, url = start_dev(folder, {})
        token = (folder / ".edge" / "api-token").read_text().strip()
        client = cloudflare.Cloudflare(api_token=token, base_url=f"{url}/client/v4", max_retries=0)
        every = args.rows
        succeeded = sum(1 for i in range(args.rows) if i % 5)
        llama_ok = sum(1 for i in range(args.rows) if i % 5 and i % 2 == 0)
        runs = [
            ("SDK, default page (20)", {}, every),
            ("SDK, per_page=50", {"per_page": 50}, every),
            ("SDK, 50, oldest first", {"per_page": 50, "order_by_direction": "asc"}, every),
            (
                "SDK, 50, success=true, by model",
                {"per_page": 50, "success": True, "order_by": "model"},
                succeeded,
            ),
            (
                "SDK, 50, filters model eq + success",
                {
                    "per_page": 50,
                    "success": True,
                    "filters": [{"key": "model", "operator": "eq", "value": [MODELS[0]]}],
                },
                llama_ok,
            ),
            ("SDK, 50, search metadata", {"per_page": 50, "search": '"user-7"'}, args.rows // 100),
        ]
        print(f"{'list':40} {'rows':>7} {'pages':>6} {'s':>7} {'ms/page':>8}")
        for name, params, want in runs:
            seconds, ids, pages = sdk_list(client, **params)
            assert len(ids) == len(set(ids)) == want, (name, len(ids), len(set(ids)), want)
            print(
                f"{name:40} {len(ids):7d} {pages:6d} {seconds:7.2f} {1000 * seconds / pages:8.1f}", flush=True
            )
        for per_page in (20, 50):
            seconds, ids, pages = raw_list(url, token, per_page)
            assert len(ids) == len(set(ids)) == every
            name = f"baseline: httpx, no SDK, per_page={per_page}"
            print(
                f"{name:40} {len(ids):7d} {pages:6d} {seconds:7.2f} {1000 * seconds / pages:8.1f}", flush=True
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
