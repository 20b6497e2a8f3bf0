"""Every account's AI Gateways: which exist, and which settings each applies to the calls through it.
A gateway comes to be in one of three ways, each a row of the store's `gateways` table
(runtime.ai.gateway_store), per account:

- made on first use: a call naming an id its account has not got makes it, with the defaults (as
  Cloudflare makes a gateway on its first request); a deleted one is made again by the next call
  that names it;
- declared in the config ([edge.ai_gateways.ID]): every account has it, with the file's settings;
- created through Cloudflare's API (POST .../ai-gateway/gateways): its settings kept as JSON, changed
  by an update (PUT), gone with its logs and cached answers by a delete.

A declared gateway is the file's: the API lists and reads it, but refuses to update or delete it
(GatewayDeclared, naming the file). Its settings are written in one place: an update through the
API would either be lost at the next start or outlive the next change to the file, and either way
the file would no longer say what the gateway does. Creating a gateway whose id is declared, or
that the account has, is refused (GatewayExists).

An account holds at most MAX_GATEWAYS gateways besides the declared ones, however they came to be: a
call naming a new id past it, or a create, is refused (GatewayLimit, a 5004 naming the limit and what
to do), so a tenant cannot grow the table without end by naming ever new ids.

Blocking (SQLite): the runtime calls it through its fair pool (runtime.ai.gateway.Gateways), except
`known`, which answers from memory on the event loop."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.ai.gateway_api_shapes import api_gateway
from runtime.ai.gateway_options import GatewaySettings
from runtime.ai.gateway_store import GatewayStore
from workers import AIError

MAX_KNOWN = 10_000  # settings remembered per (account, gateway); past it they are read again
MAX_GATEWAYS = 100  # an account's gateways besides the declared ones
CONFIG_FILE = "wrangler-like.toml"


class GatewayExists(Exception):
    pass


class GatewayLimit(AIError):
    def __init__(self, account: str):
        super().__init__(
            5004,
            f"account {account!r} has {MAX_GATEWAYS} AI Gateways, the most it may; reuse one or delete one "
            "(DELETE /client/v4/accounts/{id}/ai-gateway/gateways/{gateway}, client.ai_gateway.delete)",
        )


class GatewayDeclared(Exception):
    pass


@dataclass(frozen=True)
class Gateway:
    id: str
    settings: GatewaySettings
    created: float
    modified: float
    declared: bool = False

    def to_api(self) -> dict[str, Any]:
        return api_gateway(self.id, self.settings.to_api(), self.created, self.modified)


class GatewayRegistry:
    """`declared`: the config's gateways by id; `clock`: the time a gateway is created or changed."""

    def __init__(self, store: GatewayStore, declared: dict[str, GatewaySettings], clock: Callable[[], float]):
        self.store, self.declared, self.clock = store, dict(declared), clock
        self._known: dict[tuple[str, str], GatewaySettings] = {}
        self._rows_for: set[str] = set()  # accounts whose declared gateways have their rows

    def known(self, account: str, gateway_id: str) -> GatewaySettings | None:
        """The settings of a gateway already read or made in this process, from memory (None: ask
        `settings`)."""
        return self._known.get((account, gateway_id))

    def settings(self, account: str, gateway_id: str) -> GatewaySettings:
        """The settings that apply to a call through the gateway; a gateway the account has not got
        is made (first use)."""
        now = self.clock()

        def first_use(db: sqlite3.Connection) -> str | None:
            row = db.execute(
                "SELECT settings FROM gateways WHERE account=? AND id=?", (account, gateway_id)
            ).fetchone()
            if row is not None:
                return row[0]
            if gateway_id not in self.declared:
                self._room_for_one(db, account)
            db.execute(
                "INSERT INTO gateways (account, id, created, modified) VALUES (?,?,?,?)",
                (account, gateway_id, now, now),
            )
            return None

        stored = self.store.write(first_use)
        return self._remember(account, gateway_id, self._applied(gateway_id, stored))

    def list(self, account: str, search: str | None, page: int, per_page: int) -> tuple[list[Gateway], int]:
        """The account's gateways whose id holds `search`, newest first (ties by id), one page; and
        how many there are in all."""
        self._declare(account)
        where, args = "account=?", [account]
        if search:
            escaped = search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            where, args = where + " AND id LIKE ? ESCAPE '\\'", [*args, f"%{escaped}%"]

        def page_of(db: sqlite3.Connection) -> tuple[list[tuple[Any, ...]], int]:
            total = db.execute(f"SELECT COUNT(*) FROM gateways WHERE {where}", args).fetchone()[0]
            rows = db.execute(
                f"SELECT id, settings, created, modified FROM gateways WHERE {where} "
                "ORDER BY created DESC, id LIMIT ? OFFSET ?",
                [*args, per_page, (page - 1) * per_page],
            ).fetchall()
            return rows, total

        rows, total = self.store.read(page_of)
        return [self._gateway(account, *row) for row in rows], total

    def get(self, account: str, gateway_id: str) -> Gateway:
        """The account's gateway; LookupError for one it has not got."""
        self._declare(account)
        row = self.store.read(
            lambda db: db.execute(
                "SELECT id, settings, created, modified FROM gateways WHERE account=? AND id=?",
                (account, gateway_id),
            ).fetchone()
        )
        if row is None:
            raise LookupError(f"no gateway {gateway_id!r} in account {account!r}")
        return self._gateway(account, *row)

    def create(self, account: str, gateway_id: str, settings: GatewaySettings) -> Gateway:
        """A new gateway with these settings; GatewayExists when the account has one of that id or
        the config declares it."""
        if gateway_id in self.declared:
            raise GatewayExists(f"gateway {gateway_id!r} is declared in {CONFIG_FILE} ([edge.ai_gateways])")
        now = self.clock()

        def insert(db: sqlite3.Connection) -> bool:
            self._room_for_one(db, account)
            return (
                db.execute(
                    "INSERT OR IGNORE INTO gateways (account, id, created, modified, settings) "
                    "VALUES (?,?,?,?,?)",
                    (account, gateway_id, now, now, settings.to_json()),
                ).rowcount
                == 1
            )

        if not self.store.write(insert):
            raise GatewayExists(f"gateway {gateway_id!r} exists; update it (PUT) or delete it first")
        self._remember(account, gateway_id, settings)
        return Gateway(gateway_id, settings, now, now)

    def update(self, account: str, gateway_id: str, settings: GatewaySettings) -> Gateway:
        """The gateway's settings replaced (its cached answers dropped when the new settings say
        cache_invalidate_on_update); LookupError for none, GatewayDeclared for the config's."""
        self._refuse_declared(gateway_id, "update")
        now = self.clock()

        def replace(db: sqlite3.Connection) -> float | None:
            row = db.execute(
                "SELECT created FROM gateways WHERE account=? AND id=?", (account, gateway_id)
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE gateways SET settings=?, modified=? WHERE account=? AND id=?",
                (settings.to_json(), now, account, gateway_id),
            )
            if settings.cache_invalidate_on_update:
                db.execute("DELETE FROM cache WHERE account=? AND gateway=?", (account, gateway_id))
            return row[0]

        created = self.store.write(replace)
        if created is None:
            raise LookupError(f"no gateway {gateway_id!r} in account {account!r}")
        self._remember(account, gateway_id, settings)
        return Gateway(gateway_id, settings, created, now)

    def delete(self, account: str, gateway_id: str) -> Gateway:
        """The gateway gone, with its logs and cached answers; as it was. LookupError for none,
        GatewayDeclared for the config's."""
        self._refuse_declared(gateway_id, "delete")
        gone = self.get(account, gateway_id)

        def drop(db: sqlite3.Connection) -> None:
            for table, column in (("gateways", "id"), ("logs", "gateway"), ("cache", "gateway")):
                db.execute(f"DELETE FROM {table} WHERE account=? AND {column}=?", (account, gateway_id))

        self.store.write(drop, recount=True)
        self._known.pop((account, gateway_id), None)
        return gone

    def _room_for_one(self, db: sqlite3.Connection, account: str) -> None:
        """GatewayLimit when the account already holds MAX_GATEWAYS gateways of its own."""
        declared = list(self.declared)
        marks = ",".join("?" * len(declared))
        where = f"account=? AND id NOT IN ({marks})" if declared else "account=?"
        held = db.execute(f"SELECT COUNT(*) FROM gateways WHERE {where}", [account, *declared]).fetchone()[0]
        if held >= MAX_GATEWAYS:
            raise GatewayLimit(account)

    def _refuse_declared(self, gateway_id: str, what: str) -> None:
        if gateway_id in self.declared:
            raise GatewayDeclared(
                f"gateway {gateway_id!r} is declared in {CONFIG_FILE} ([edge.ai_gateways.{gateway_id}]): "
                f"{what} it there, where its settings are written"
            )

    def _declare(self, account: str) -> None:
        """The declared gateways' rows for the account (their created_at: when it first saw them)."""
        if account in self._rows_for or not self.declared:
            return
        now = self.clock()
        self.store.write(
            lambda db: db.executemany(
                "INSERT OR IGNORE INTO gateways (account, id, created, modified) VALUES (?,?,?,?)",
                [(account, gid, now, now) for gid in self.declared],
            )
        )
        self._rows_for.add(account)

    def _applied(self, gateway_id: str, stored: str | None) -> GatewaySettings:
        """The config's settings for a declared gateway, else those set through the API, else the
        defaults."""
        if gateway_id in self.declared:
            return self.declared[gateway_id]
        return GatewaySettings.from_json(stored) if stored else GatewaySettings()

    def _gateway(self, account: str, gateway_id: str, stored: str | None, created: float, modified: float):
        settings = self._remember(account, gateway_id, self._applied(gateway_id, stored))
        return Gateway(gateway_id, settings, created, modified, gateway_id in self.declared)

    def _remember(self, account: str, gateway_id: str, settings: GatewaySettings) -> GatewaySettings:
        if len(self._known) >= MAX_KNOWN:
            self._known.clear()
        self._known[account, gateway_id] = settings
        return settings
