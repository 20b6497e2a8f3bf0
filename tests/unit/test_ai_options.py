"""env.AI.run's options (runtime.ai.run_options) and env.AI.toMarkdown's converter (workers.markdown):
what a worker may pass, every other key refused by name, and the Markdown a user would write."""

from __future__ import annotations

import random
import string

import pytest

from runtime.ai.gateway import GatewayOptions
from runtime.ai.run_options import ACCEPTED, MAX_TAGS, parse_run_options
from workers import AIError
from workers.markdown import convert, csv_to_markdown, html_to_markdown, mime_type_of


def test_the_options_a_worker_sends_are_read():
    opts = parse_run_options(
        {
            "queueRequest": True,
            "extraHeaders": {"X-Session-Affinity": "conv-1", "x-edge-priority": 2, "x-other": "kept"},
            "returnRawResponse": True,
            "tags": ["checkout", "eu"],
            "prefix": "",
        }
    )
    assert opts.queue and opts.raw_response and opts.tags == ("checkout", "eu")
    assert opts.session == "conv-1" and opts.priority == "2" and opts.header("x-other") == "kept"
    assert parse_run_options(None) == parse_run_options({})


def test_any_other_key_is_refused_naming_it_and_the_accepted_ones():
    rng = random.Random()
    for _ in range(20):
        key = "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(1, 12)))
        if key in ACCEPTED or key == "extra_headers":
            continue
        with pytest.raises(AIError) as caught:
            parse_run_options({key: 1})
        assert caught.value.code == 5004 and f"options: {key}: no such option" in str(caught.value)
        assert all(name in str(caught.value) for name in ACCEPTED)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"tags": ["t"] * (MAX_TAGS + 1)}, f"tags: at most {MAX_TAGS} tags"),
        ({"tags": "one"}, "tags: expected a list of strings"),
        ({"tags": [""]}, "tags: each tag is 1 to"),
        ({"prefix": "org:team"}, "prefix: expected a namespace name"),
        ({"prefix": 7}, "prefix: expected a namespace name"),
        ({"sessionOptions": {"other": 1}}, "sessionOptions: expected {extraHeaders"),
        ({"sessionOptions": {"extraHeaders": {"x-a": []}}}, "sessionOptions.extraHeaders.x-a: expected"),
        ({"websocket": True}, "websocket: not available here"),
        ({"queueRequest": "true"}, "queueRequest: expected true or false"),
        ({"extraHeaders": {"x-edge-priority": 1.5}}, "extraHeaders.x-edge-priority: expected a string"),
    ],
)
def test_a_wrong_value_is_refused_saying_what_to_send(options, fragment):
    with pytest.raises(AIError, match=f"^5004: env.AI.run options: {fragment}"):
        parse_run_options(options)


def test_a_prefix_names_the_model_as_workerd_does():
    assert parse_run_options({"prefix": "my-org"}, "@cf/meta/m").model == "my-org:@cf/meta/m"
    assert parse_run_options({"prefix": ""}, "@cf/meta/m").model == "@cf/meta/m"
    assert parse_run_options(None, "@cf/meta/m").model == "@cf/meta/m"


def test_the_deprecated_session_options_headers_are_read_beneath_extra_headers():
    opts = parse_run_options(
        {
            "sessionOptions": {"extraHeaders": {"x-session-affinity": "old", "x-edge-priority": "3"}},
            "extraHeaders": {"x-session-affinity": "new"},
        }
    )
    assert opts.session == "new" and opts.priority == "3"


def test_the_gateway_option_is_checked_by_the_gateways_own_parser():
    given = {"id": "my-gw", "cacheTtl": 60, "skipCache": True}
    assert parse_run_options({"gateway": given}).gateway == GatewayOptions.parse(given)
    with pytest.raises(AIError) as caught:
        parse_run_options({"gateway": {"id": "my-gw", "cacheTTL": 60}})
    assert caught.value.code == 5004 and "cacheTTL" in str(caught.value)


def test_html_becomes_the_markdown_a_user_would_write():
    page = (
        "<html><head><title>t</title><style>p{}</style></head><body>"
        "<h2>Plan &amp; notes</h2><p>Read <em>this</em> and <a href='/x'>that</a>.</p>"
        "<ol><li>first</li><li>second<ul><li>inner</li></ul></li></ol>"
        "<pre>a  =  1\n</pre><blockquote>quoted</blockquote><script>steal()</script></body></html>"
    )
    assert html_to_markdown(page) == (
        "## Plan & notes\n\nRead *this* and [that](/x).\n\n1. first\n2. second\n  - inner\n\n"
        "```\na  =  1\n```\n\n> quoted\n"
    )


def test_csv_becomes_a_table_and_unsupported_types_say_what_is_supported():
    assert csv_to_markdown("name,age\nada,36\n") == "| name | age |\n| --- | --- |\n| ada | 36 |\n"
    assert mime_type_of("report.PDF", None) == "application/octet-stream"
    assert mime_type_of("x.bin", "text/html; charset=utf-8") == "text/html"
    out = convert("scan.png", "image/png", b"\x89PNG")
    assert out["format"] == "error" and "image/png cannot be converted" in out["error"]
    assert "text/html" in out["error"] and "text/csv" in out["error"]
    text = convert("a.txt", "text/plain", b"  words  ")
    assert text == {
        "name": "a.txt",
        "mimeType": "text/plain",
        "format": "markdown",
        "tokens": 2,
        "data": "words\n",
    }
