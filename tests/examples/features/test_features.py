"""The pytest plugin (runtime.testing) as a project's tests use it, on the worker beside this file
(found as a user's project is: the wrangler.jsonc of the test's folder): requests, the real model's
repeatable answers, seeding and reading KV, D1 and R2, cron, queue batches, Durable Object calls
and alarms, workflows, logs, fresh state per test, and the errors a wrong name gets."""

import asyncio

import pytest

from runtime.testing import EdgeWorker

pytestmark = pytest.mark.slow


async def test_a_request_reaches_the_worker_in_its_isolate(worker):
    r = await worker.fetch("/hello?name=ada")
    assert r.status == 200 and r.text == "Hello, ada!"
    assert r.headers["cf-ray"].endswith("-ICN")  # the runtime's front answered, from Seoul's PoP
    assert "greeting ada" in worker.logs()
    assert (await worker.fetch("/nowhere")).status == 404
    assert worker.runtime.dev.isolate.pid is not None  # a real process, not the worker in this one


async def test_the_real_model_answers_the_same_text_to_the_same_call(worker):
    r1, r2 = await worker.fetch("/ai"), await worker.fetch("/ai")
    assert r1.status == 200, r1
    assert r1.headers["x-edge-quantization"]  # served by the engine at the PoP
    first = r1.json()["response"]
    assert first and r1.json()["usage"]["completion_tokens"] > 0
    assert r2.json()["response"] == first
    together = await asyncio.gather(worker.fetch("/ai"), worker.fetch("/ai"))  # batched in one step
    assert [r.json()["response"] for r in together] == [first, first]
    worker.ai_seed = 1  # another seed samples another answer
    assert (await worker.fetch("/ai")).json()["response"] != first


@pytest.mark.edge_ai_seed(None)
async def test_unseeded_calls_sample_afresh(worker):
    # the miniature is sure of its first words ("Hello! I'm here to help"): three calls gave one answer
    # about one run in five, eight leave that to chance about one in a hundred
    answers = {(await worker.fetch("/ai?q=import")).json()["response"] for _ in range(8)}
    assert len(answers) > 1, answers


async def test_seeded_d1_kv_and_r2_are_what_the_worker_reads(worker):
    db = worker.d1("DB")
    await db.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    await db.prepare("INSERT INTO notes (body) VALUES (?), (?)").bind("first", "second").run()
    assert (await worker.fetch("/notes")).json() == ["first", "second"]

    await worker.kv("CACHE").put("greeting", "hi")
    assert (await worker.fetch("/kv?k=greeting")).json() == {"value": "hi"}
    assert (await worker.fetch("/kv?k=written", method="PUT", body="by the worker")).status == 201
    assert await worker.kv("CACHE").get("written") == "by the worker"

    await worker.r2("BUCKET").put("a.txt", "in the bucket")
    assert (await worker.fetch("/file?k=a.txt")).text == "in the bucket"
    assert (await worker.fetch("/file?k=b.txt")).status == 404


async def test_each_test_starts_with_empty_state(worker, tmp_path):
    # the test above wrote these keys and rows; this one's runtime has its own state dir
    assert worker.runtime.config.state_dir.is_relative_to(tmp_path)
    assert (await worker.kv("CACHE").list()).keys == []
    assert (await worker.r2("BUCKET").list()).objects == []
    assert (await worker.fetch("/count?name=a")).text == "1"


async def test_cron_runs_the_scheduled_handler(worker):
    ran = await worker.scheduled(time_ms=1_000)  # the config's first cron
    assert ran.ok, ran.exception
    assert await worker.kv("CACHE").get("cron:last", type="json") == {"cron": "*/5 * * * *", "at": 1000}
    failed = await worker.scheduled("0 0 * * *")
    assert failed.outcome == "exception" and "the midnight job failed" in failed.exception["message"]


async def test_a_queue_batch_reaches_the_consumer(worker):
    result = await worker.queue(
        "jobs", [{"body": {"name": "a"}, "id": "m1"}, {"body": {"fail": True}, "id": "m2", "attempts": 2}]
    )
    assert result.ok and result.acked == ["m1"] and result.retried == {"m2": 5}
    assert await worker.kv("CACHE").get("job:a") == "1"


async def test_durable_object_calls_and_alarms(worker):
    counter = worker.durable_object("COUNTER").getByName("x")
    assert await counter.increment(2) == 2
    assert (await worker.fetch("/count?name=x")).text == "3"  # the same object the worker reaches

    reminder = worker.durable_object("REMINDER").getByName("r")
    assert not (await worker.alarm("REMINDER", "r")).ran  # none set yet
    await reminder.remind_in(3600)  # due in an hour: run now, whenever it is set for
    fired = await worker.alarm("REMINDER", "r")
    assert fired.ran and fired.outcome == "ok"
    assert await reminder.reminded() == 1
    assert not (await worker.alarm("REMINDER", "r")).ran  # it ran, so it is gone


async def test_a_workflow_instance_runs_to_completion(worker):
    instance = await worker.workflow("DOUBLE").create(params={"n": 21})
    status = await worker.wait_for_workflow(instance, timeout=60)
    assert status["status"] == "complete", status
    assert status["output"] == {"doubled": 42}


async def test_a_wrong_name_gets_an_error_that_names_what_there_is(worker):
    with pytest.raises(LookupError, match="no binding named 'NOPE'.*CACHE \\(kv\\)"):
        worker.kv("NOPE")
    with pytest.raises(TypeError, match="DB is a d1 binding, not kv"):
        worker.kv("DB")
    with pytest.raises(ValueError, match="consumes no queue 'other'.*jobs"):
        await worker.queue("other", [{"body": 1}])
    with pytest.raises(TypeError, match=r"messages\[0\] must be a dict with a 'body'"):
        await worker.queue("jobs", ["bare"])
    with pytest.raises(LookupError, match="no Durable Object binding named 'ROOMS'"):
        worker.durable_object("ROOMS")


def test_a_synchronous_test_runs_the_client_with_worker_run(worker):
    assert isinstance(worker, EdgeWorker)
    assert worker.run(worker.fetch("/hello")).text == "Hello, world!"
