"""`edge ai-search`, as `wrangler ai-search` names its commands, worked straight on the project's
state dir: instances over uploads, over the config's folder and over an R2 bucket (indexed at once,
a progress bar on stderr), search, stats, items, jobs and namespaces; --json and --namespace on each;
errors said with AI Search's code and exit status 2."""

from __future__ import annotations

import argparse
import json

import pytest

from runtime.cli import main

CONFIG = {
    "name": "w",
    "main": "worker.py",
    "compatibility_date": "2026-11-01",
    "ai_search": [{"binding": "DOCS", "instance_name": "docs", "source_dir": "docs/"}],
}
PAGES = {
    "lisbon.md": "# Lisbon\n\nLena's bakery in Lisbon opens at 7 am.",
    "madrid.md": "# Madrid\n\nOscar's bookshop in Madrid opens at 9 am.",
}


@pytest.fixture
def project(tmp_path):
    (tmp_path / "wrangler.jsonc").write_text(json.dumps(CONFIG))
    (tmp_path / "worker.py").write_text("")
    (tmp_path / "docs").mkdir()
    for name, text in PAGES.items():
        (tmp_path / "docs" / name).write_text(text)
    return tmp_path


@pytest.fixture
def edge(project, capsys):
    """`edge ai-search ...` in the project: (exit status, stdout, stderr); JSON parsed with --json."""

    def run(*args: str):
        code = main(["ai-search", *args, "--config", str(project / "wrangler.jsonc")])
        out, err = capsys.readouterr()
        return code, (json.loads(out) if "--json" in args and code == 0 else out), err

    return run


def test_create_over_the_configs_folder_indexes_it_with_a_progress_bar(edge, project):
    code, out, err = edge("create", "docs")
    assert code == 0, err
    assert "created AI Search instance docs" in out and f"folder {project / 'docs'}" in out
    assert "indexing [" in err and "2/2 documents" in err and "0 errors" in err
    code, stats, _ = edge("stats", "docs", "--json")
    assert stats["completed"] == 2 and stats["queued"] == stats["running"] == 0
    assert stats["engine"]["vectorize"]["vectorsCount"] >= 2
    code, out, _ = edge("search", "docs", "--query", "When does the bakery in Lisbon open?")
    assert code == 0 and out.splitlines()[1].split()[2] == "lisbon.md"
    # a page more, a page changed: `jobs create` reads the folder again and indexes what is new
    (project / "docs" / "berlin.md").write_text("# Berlin\n\nJulia's cafe in Berlin opens at 8 am.")
    code, job, err = edge("jobs", "create", "docs", "--description", "a new page", "--json")
    assert code == 0 and job["description"] == "a new page" and job["source"] == "user", err
    assert "documents" not in err  # --json: no bar on stderr
    assert edge("stats", "docs", "--json")[1]["completed"] == 3  # indexed before the command ended
    code, found, _ = edge("search", "docs", "--query", "cafe in Berlin", "--json")
    assert found["chunks"][0]["item"]["key"] == "berlin.md"
    code, jobs, _ = edge("jobs", "list", "docs", "--json")
    assert jobs[0]["id"] == job["id"] and len(jobs) >= 2  # the newest first; the folder read at create
    code, out, _ = edge("jobs", "get", "docs", job["id"])
    assert code == 0 and f"job {job['id']} 'a new page'" in out


def test_an_instance_over_uploads_items_search_update_and_delete(edge, tmp_path):
    code, made, _ = edge("create", "notes", "--chunk-size", "128", "--json")
    assert code == 0 and made["chunk_size"] == 128 and made["type"] is None
    note = tmp_path / "faq.md"
    note.write_text("# FAQ\n\nThe office wifi password is on the fridge.")
    code, items, err = edge(
        "items", "upload", "notes", str(note), "--metadata", '{"team": "ops"}', "--wait", "--json"
    )
    assert code == 0, err
    (item,) = items
    assert item["key"] == "faq.md" and item["status"] == "completed" and item["metadata"]["team"] == "ops"
    code, listed, _ = edge("items", "list", "notes", "--status", "completed", "--json")
    assert [i["id"] for i in listed] == [item["id"]]
    code, out, _ = edge("items", "get", "notes", item["id"])
    assert code == 0 and json.loads(out)["key"] == "faq.md"
    code, chunks, _ = edge("items", "chunks", "notes", item["id"], "--json")
    assert "fridge" in chunks[0]["text"]
    code, found, _ = edge("search", "notes", "--query", "wifi password", "--filter", "team=ops", "--json")
    assert found["chunks"][0]["item"]["key"] == "faq.md"
    code, found, _ = edge("search", "notes", "--query", "wifi password", "--filter", "team=sales", "--json")
    assert found["chunks"] == []
    code, out, _ = edge("update", "notes", "--max-num-results", "3", "--no-reranking")
    assert code == 0 and "updated AI Search instance notes" in out
    code, got, _ = edge("get", "notes", "--json")
    assert got["max_num_results"] == 3 and got["reranking"] is False
    code, out, _ = edge("list")
    assert "notes: uploads" in out
    assert edge("items", "delete", "notes", item["id"])[0] == 0
    assert edge("items", "list", "notes", "--json")[1] == []
    assert edge("delete", "notes", "-y")[0] == 0
    code, _, err = edge("get", "notes")
    assert code == 2 and "no AI Search instance 'notes'" in err and "7002" in err


def test_create_over_an_r2_bucket_indexes_its_objects(edge, project):
    from runtime.bindings import BindingStores

    stores = BindingStores(project / ".edge")
    try:
        r2 = stores.store("r2")
        for key, text in PAGES.items():
            r2.call("local", "pages", "put", [f"site/{key}", text.encode()], {})
        r2.call("local", "pages", "put", ["other/skip.md", b"# not under the prefix"], {})
    finally:
        stores.close()
    code, out, err = edge("create", "site", "--type", "r2", "--source", "pages", "--prefix", "site/")
    assert code == 0, err
    assert "source:     r2:pages" in out and "2/2 documents" in err
    code, items, _ = edge("items", "list", "site", "--json")
    assert sorted(i["key"] for i in items) == ["site/lisbon.md", "site/madrid.md"]


def test_namespaces_and_the_namespace_flag(edge):
    code, out, _ = edge("namespace", "create", "team-a", "--description", "team A's docs")
    assert code == 0 and "created AI Search namespace team-a" in out
    code, listed, _ = edge("namespace", "list", "--json")
    assert [n["name"] for n in listed] == ["default", "team-a"]
    code, listed, _ = edge("namespace", "list", "--search", "TEAM A", "--json")
    assert [n["name"] for n in listed] == ["team-a"]
    assert edge("namespace", "update", "team-a", "--description", "A")[0] == 0
    assert edge("namespace", "get", "team-a", "--json")[1]["description"] == "A"
    assert edge("create", "kb", "-n", "team-a")[0] == 0
    assert [i["id"] for i in edge("list", "--namespace", "team-a", "--json")[1]] == ["kb"]
    assert edge("list", "--json")[1] == []  # the default namespace holds none
    code, _, err = edge("namespace", "delete", "team-a")
    assert code == 2 and "7003" in err  # it still holds an instance
    assert edge("delete", "kb", "-n", "team-a")[0] == 0
    assert edge("namespace", "delete", "team-a")[0] == 0


def test_refusals_say_what_to_change(edge):
    code, _, err = edge("create", "web", "--type", "web-crawler", "--source", "https://example.com")
    assert code == 2 and "no network" in err and "7006" in err
    code, _, err = edge("create", "docs", "--source", "pages")
    assert code == 2 and "leave out --source" in err  # the config gives docs a folder
    assert edge("create", "notes")[0] == 0
    code, _, err = edge("create", "notes")
    assert code == 2 and "7003" in err
    code, _, err = edge("update", "notes")
    assert code == 2 and "nothing to change" in err
    code, _, err = edge("search", "notes", "--query", "x", "--filter", "oops")
    assert code == 2 and "key=value" in err
    code, _, err = edge("items", "upload", "notes", "/no/such/file.md")
    assert code == 2 and "no such file" in err
    code, _, err = edge("jobs", "create", "notes")
    assert code == 2 and "no source to sync" in err


def test_every_command_takes_json_namespace_and_config():
    from runtime.cli.ai_search import add_ai_search_parser

    sub = argparse.ArgumentParser().add_subparsers()
    add_ai_search_parser(sub)
    leaves = []

    def walk(parser, path):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            leaves.append((path, parser))
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*path, name))

    walk(sub.choices["ai-search"], ())
    names = {" ".join(p) for p, _ in leaves}
    wrangler = {"list", "create", "get", "update", "delete", "search", "stats"}
    wrangler |= {f"namespace {c}" for c in ("list", "create", "get", "update", "delete")}
    wrangler |= {"jobs list", "jobs create", "jobs get", "items list", "items get", "items chunks"}
    assert wrangler <= names
    for path, parser in leaves:
        flags = {s for a in parser._actions for s in a.option_strings}
        assert {"--json", "--namespace", "-n", "--config"} <= flags, path
