"""Routing traffic between models: aliases that split jobs by weight (A/B), shadow decoding by
a candidate, hot-swapping a model's weights under a burst, re-running a job on another model
and replaying a dead letter on one. The suite serves tiny.en (the default), base and `next`
(tiny.en's weights until a test swaps them: conftest)."""

import os
import time
import uuid
from collections import Counter

import pytest
from api import submit_id, upload, wait_for_job
from click.testing import CliRunner
from helpers import CLIPS, wait_until, word_error_rate

from config import ConfigError, Settings

BASE_VERSION = "sha256:d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


def routed(**env) -> Settings:
    """The suite's settings (its database, data dir, broker) with these routes."""
    return Settings.from_env({**os.environ, **env})


def _whisperq(*args: str):
    from web.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- aliases and shadows in the configuration ------------------------------------------------------


def test_an_alias_splits_by_weight_and_a_job_draws_once(tmp_path):
    s = routed(
        WHISPERQ_DATA_DIR=str(tmp_path),
        WHISPERQ_ALIASES="default=tiny.en:90|base:10, accurate=base",
        WHISPERQ_DEFAULT_MODEL="default",
        WHISPERQ_SHADOW="tiny.en=base:20",
    )
    assert s.default_model == "tiny.en" and s.routes.default == "default"  # the heaviest variant holds the main queue
    job = str(uuid.uuid4())
    assert s.choose(None, job) == s.choose(None, job) == s.choose("default", job)  # the same draw, however often
    assert s.choose("accurate", job)[:2] == ("base", "accurate")
    assert s.choose("tiny.en", job)[1] is None  # a model named outright: no alias
    assert s.choose("base", job)[2] is None  # base has no shadow


@pytest.mark.parametrize(
    "env, words",
    [
        ({"WHISPERQ_ALIASES": "fast"}, "is not ALIAS=MODEL:WEIGHT"),
        ({"WHISPERQ_ALIASES": "fast=large:1"}, "'large' is not a model of WHISPERQ_MODELS"),
        ({"WHISPERQ_ALIASES": "fast=tiny.en:0"}, "must be a whole number from 1 to 1000"),
        ({"WHISPERQ_ALIASES": "base=tiny.en"}, "already the name of a model"),
        ({"WHISPERQ_ALIASES": "ab=tiny.en|tiny.en"}, "'tiny.en' is named twice"),
        ({"WHISPERQ_SHADOW": "tiny.en=tiny.en:10"}, "two different models"),
        ({"WHISPERQ_SHADOW": "tiny.en=base:150"}, "a percentage from 1 to 100"),
        ({"WHISPERQ_SHADOW": "tiny.en=base"}, "a percentage from 1 to 100"),
        ({"WHISPERQ_DEFAULT_MODEL": "nope"}, "is not one of the models served"),
    ],
)
def test_bad_routes_say_what_to_fix(tmp_path, env, words):
    with pytest.raises(ConfigError, match=words):
        routed(WHISPERQ_DATA_DIR=str(tmp_path), **env)


def test_the_draw_splits_job_ids_by_the_weights(tmp_path):
    """The draw is a function of the job id alone (a SHA-256 of it), so its split is checked over
    100,000 fixed, distinct ids: the weights' shares within half a percent, and the shadow's
    share of its model's jobs. Fixed ids give the same counts every run: nothing left to luck."""
    s = routed(
        WHISPERQ_DATA_DIR=str(tmp_path),
        WHISPERQ_ALIASES="default=tiny.en:90|base:10, three=tiny.en:5|base:3|next:2",
        WHISPERQ_DEFAULT_MODEL="default",
        WHISPERQ_SHADOW="tiny.en=base:20",
    )
    ids = [str(uuid.UUID(int=n, version=4)) for n in range(100_000)]
    draws = [s.choose(None, job_id) for job_id in ids]
    models = Counter(model for model, _route, _shadow in draws)
    assert abs(models["base"] / len(ids) - 0.10) <= 0.005, models
    shadowed = Counter(shadow for model, _route, shadow in draws if model == "tiny.en")
    assert abs(shadowed["base"] / models["tiny.en"] - 0.20) <= 0.005, shadowed
    three = Counter(s.choose("three", job_id)[0] for job_id in ids)
    assert all(
        abs(three[name] / len(ids) - share) <= 0.005 for name, share in (("tiny.en", 0.5), ("base", 0.3), ("next", 0.2))
    ), three


def test_ab_split_over_hundreds_of_jobs_through_the_api_is_the_weights(settings, database, monkeypatch):
    """300 jobs through POST /v1/jobs naming no model, with default=tiny.en:90|base:10 and a 20 %
    shadow of tiny.en by base: each job keeps the draw its id gives (whose split the test above
    checks exactly), and the counted split is the weights' within five standard deviations
    (a share this test cannot be unlucky with, and a broken split still fails)."""
    from models.jobs.operations import discard_job, get_job
    from models.jobs.workers import beat, forget
    from tasks.broker import CeleryBroker
    from web import create_app

    s = routed(
        WHISPERQ_ALIASES="default=tiny.en:90|base:10",
        WHISPERQ_DEFAULT_MODEL="default",
        WHISPERQ_SHADOW="tiny.en=base:20",
    )
    app = create_app({"SETTINGS": s, "TESTING": True})
    rt = app.extensions["whisperq"]
    sent: list[str] = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: sent.append(job.id))
    fake = f"ab-test/{uuid.uuid4().hex[:8]}"  # an inference worker serving base, as far as the door can tell
    beat(rt, fake, "ab-test", "inference", 1, __import__("models.db", fromlist=["utcnow"]).utcnow(), ("base",))
    client = app.test_client()
    try:
        admin = {"Authorization": f"Bearer {s.admin_token}"}  # the weights and shadows: an admin's only
        data = client.get("/v1/models", headers=admin).get_json()["data"]
        alias = next(m for m in data if m["id"] == "default")
        assert alias["variants"] == [{"id": "tiny.en", "weight": 90}, {"id": "base", "weight": 10}]
        assert alias["default"] is True and next(m for m in data if m["id"] == "tiny.en")["shadow"] == {
            "candidate": "base",
            "percent": 20,
        }
        models, shadows = Counter(), Counter()
        for _ in range(300):
            resp = upload(client, "fox.flac")
            assert resp.status_code == 202, resp.get_json()
            body = resp.get_json()
            assert body["route"] == "default"
            job = get_job(rt, body["job_id"])
            assert (job.model, job.route, job.shadow) == s.choose(None, job.id)  # drawn once, from its id
            models[job.model] += 1
            shadows[job.shadow] += job.model == "tiny.en"
        assert len(sent) == 300
        assert abs(models["base"] / 300 - 0.10) <= 5 * (0.10 * 0.90 / 300) ** 0.5, models  # 0.087
        assert abs(shadows["base"] / models["tiny.en"] - 0.20) <= 5 * (0.20 * 0.80 / models["tiny.en"]) ** 0.5, shadows
        # naming the model outright skips the draw
        assert upload(client, "fox.flac", model="base").get_json()["route"] is None
    finally:
        forget(rt, fake)
        for job_id in sent:
            discard_job(rt, job_id)


def test_an_alias_with_a_variant_no_worker_serves_is_refused(settings, database):
    from web import create_app

    s = routed(WHISPERQ_ALIASES="trial=tiny.en:50|base:50")
    client = create_app({"SETTINGS": s, "TESTING": True}).test_client()
    resp = upload(client, "fox.flac", model="trial")
    assert resp.status_code == 503
    assert "no inference worker serves the model 'base' (a variant of 'trial')" in resp.get_json()["error"]["message"]
    resp = upload(client, "fox.flac", model="trial", language="de")
    assert resp.status_code == 400 and "'tiny.en' is English-only" in resp.get_json()["error"]["message"]


def test_a_job_prepared_while_no_worker_serves_its_candidate_is_not_shadowed(database, caplog):
    """A shadow's copy goes only to a candidate some live worker serves (no inference worker of
    this suite serves base before extra_pool below starts): the job goes on unshadowed, no copy
    of its samples is kept, and the preparation log says why."""
    import logging

    from models.jobs.record import new_job_id
    from models.pipeline.preparation import prepare_job
    from models.runtime import Runtime

    s = routed(WHISPERQ_SHADOW="tiny.en=base:100")
    rt = Runtime(s)
    job_id = new_job_id()
    assert s.choose(None, job_id)[2] == "base"  # drawn for a shadow
    with caplog.at_level(logging.INFO, logger="models.pipeline.preparation"):
        prepared = prepare_job(rt, job_id, str(CLIPS["fox.flac"]["path"]), {"language": "en"})
    assert prepared.model == "tiny.en" and prepared.shadow is None and prepared.shadow_ref is None
    assert not list((s.data_dir / "prepared").rglob(f"{job_id}.shadow*"))
    assert f"job {job_id}: not shadowed by base: no live inference worker serves it" in caplog.text


# --- hot swap bookkeeping --------------------------------------------------------------------------


def test_swaps_stack_and_each_rollback_takes_one_off(settings, database, tmp_path):
    from models.errors import InvalidRequest
    from models.registry.swaps import ActiveWeights, ModelWeights, history, rollback, swap
    from models.speech.engines import bundled_model_path

    name = "next"
    active = ActiveWeights(settings, database, every=0)
    with database.session() as session:
        session.query(ModelWeights).filter(ModelWeights.model == name).delete()
    try:
        assert active.spec(name).weights == "bundled:tiny.en"
        with pytest.raises(InvalidRequest, match="nothing to roll back"):
            rollback(settings, database, name)
        copy = tmp_path / "tiny-copy"
        copy.mkdir()
        for f in os.listdir(bundled_model_path()):
            (copy / f).write_bytes((__import__("pathlib").Path(bundled_model_path()) / f).read_bytes())
        swap(settings, database, name, "bundled:base")
        swap(settings, database, name, str(copy))
        assert active.spec(name).weights == str(copy)
        assert rollback(settings, database, name).weights == "bundled:base"
        assert rollback(settings, database, name).weights == "bundled:tiny.en"
        assert active.spec(name).weights == "bundled:tiny.en"
        assert [r.action for r in history(database, name)] == ["swap", "swap", "rollback", "rollback"]
        with pytest.raises(InvalidRequest, match="not a CTranslate2 model directory"):
            swap(settings, database, name, str(tmp_path))
        with pytest.raises(InvalidRequest, match="absolute path"):
            swap(settings, database, name, "relative/dir")
        assert _whisperq("models", "swap", "nope", "bundled:base").exit_code == 1
    finally:
        with database.session() as session:
            session.query(ModelWeights).filter(ModelWeights.model == name).delete()


def test_threads_that_meet_a_swap_together_all_take_it_up(settings, database, monkeypatch):
    """An inference worker's threads read the weights in force at once: one takes up the swap
    (hashing the new weights) while another waits for it. The one that waited runs the new
    weights too, and so does every job after: none puts back the weights it saw before."""
    import threading

    from models.registry import swaps
    from models.registry.swaps import ActiveWeights, ModelWeights, swap

    name = "next"
    with database.session() as session:
        session.query(ModelWeights).filter(ModelWeights.model == name).delete()
    active = ActiveWeights(settings, database, every=0)
    try:
        assert active.spec(name).weights == "bundled:tiny.en"
        swap(settings, database, name, "bundled:base")

        hashing, go_on, waiting = threading.Event(), threading.Event(), threading.Event()
        real_verify = swaps.verify_weights

        def slow_verify(*args):
            hashing.set()
            assert go_on.wait(30)
            real_verify(*args)

        class Lock:  # the real lock, telling when a second thread waits on it
            def __init__(self):
                self.lock, self.entered = threading.Lock(), 0

            def __enter__(self):
                self.entered += 1
                if self.entered == 2:
                    waiting.set()
                self.lock.acquire()

            def __exit__(self, *exc):
                self.lock.release()

        monkeypatch.setattr(swaps, "verify_weights", slow_verify)
        active._lock = Lock()
        got = {}
        first = threading.Thread(target=lambda: got.update(first=active.spec(name).weights))
        first.start()
        assert hashing.wait(30)
        second = threading.Thread(target=lambda: got.update(second=active.spec(name).weights))
        second.start()
        assert waiting.wait(30)  # the second thread read the old entry and waits on the lock
        go_on.set()
        first.join(30)
        second.join(30)
        assert got == {"first": "bundled:base", "second": "bundled:base"}
        assert active.spec(name).weights == "bundled:base"
    finally:
        with database.session() as session:
            session.query(ModelWeights).filter(ModelWeights.model == name).delete()


# --- with real workers -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def extra_pool(celery_app, database, tmp_path_factory):
    """An inference worker for base and next (threads, four jobs at once), beside the suite's pools."""
    from conftest import start_worker, stop_worker

    from models.jobs.workers import served_models
    from models.runtime import Runtime

    pool = start_worker(
        celery_app,
        tmp_path_factory.mktemp("extra"),
        "inference-extra",
        "whisperq.inference.base,whisperq.inference.next",
        pool="threads",
        concurrency=4,
    )
    rt = Runtime(Settings.from_env())
    wait_until(lambda: {"base", "next"} <= served_models(rt), 30, "the extra pool's heartbeat did not arrive")
    yield pool
    stop_worker(pool)


@pytest.mark.integration
@pytest.mark.brokers
@pytest.mark.timeout(900)  # waits of 300 + 120 s (setup.cfg's default is 300)
def test_a_shadow_decodes_apart_and_its_agreement_is_recorded(client, worker, extra_pool, database):
    """Every tiny.en job also decoded by base, apart: the client sees tiny.en's transcript only;
    the two are compared (WER) in the database and in `whisperq models compare`."""
    from models.jobs.shadows import ShadowResult
    from web import create_app

    s = routed(WHISPERQ_SHADOW="tiny.en=base:100")
    shadowed = create_app({"SETTINGS": s, "TESTING": True}).test_client()
    ids = [upload(shadowed, "report.opus", language="en").get_json()["job_id"] for _ in range(2)]
    for job_id in ids:
        job = wait_for_job(client, job_id, timeout=300)
        assert job["status"] == "COMPLETED" and job["result"]["model"]["name"] == "tiny.en"
        assert "shadow" not in job and "shadow" not in job["result"]

    def compared() -> list:
        with database.session() as session:
            rows = session.query(ShadowResult).filter(ShadowResult.job_id.in_(ids)).all()
            return [
                (r.job_id, r.model, r.model_version, r.primary_model, r.wer, r.text) for r in rows if r.wer is not None
            ]

    done = wait_until(lambda: len(found := compared()) == 2 and found, 120, "the shadows were not both compared")
    assert sorted(d[0] for d in done) == sorted(ids), done
    for _job_id, model, version, primary, wer, text in done:
        assert (model, version, primary) == ("base", BASE_VERSION, "tiny.en")
        assert 0 <= wer <= 0.3 and word_error_rate(CLIPS["report.opus"]["text"], text) <= 0.2
    out = _whisperq("models", "compare", "--model", "base").output
    assert '"primary": "tiny.en", "candidate": "base"' in out and '"mean_wer"' in out
    # the shadow's copy of the samples is gone
    assert not list((s.data_dir / "prepared").rglob("*.shadow.npy"))
    # deleting the job deletes its shadow transcript
    assert client.delete(f"/v1/jobs/{ids[0]}").status_code == 204
    with database.session() as session:
        assert session.query(ShadowResult).filter(ShadowResult.job_id == ids[0]).count() == 0


@pytest.mark.integration
@pytest.mark.brokers
@pytest.mark.timeout(1500)  # waits of 300 + 600 + 300 s (setup.cfg's default is 300)
def test_a_hot_swap_under_a_burst_loses_nothing_and_each_job_names_the_weights_that_ran_it(
    client, worker, extra_pool, database
):
    """`next` runs tiny.en's weights; mid-burst it is swapped to base's, with no restart. Every job
    completes once; a job's recorded version is the engine that decoded it — base detects the
    German half of the two-language clip window by window, tiny.en cannot — and jobs that start
    after the swap run on the new weights. Rollback is one command."""
    from models.jobs.record import Job
    from models.registry.swaps import CHECK_EVERY, ModelWeights

    def submit(n):
        return [submit_id(client, "bilingual.opus", model="next") for _ in range(n)]

    try:
        first = submit(4)
        before = wait_until(
            lambda: [j for j in first if client.get(f"/v1/jobs/{j}").get_json()["status"] == "COMPLETED"],
            300,
            "none of the first jobs completed",
        )
        swapped = _whisperq("models", "swap", "next", "bundled:base")
        assert swapped.exit_code == 0 and "rollback next" in swapped.output, swapped.output
        middle = submit(2)  # submitted at the moment of the swap: either weights, named truly
        # Not ordering but the workers' cache: each reads the weights in force at most every
        # CHECK_EVERY s, so a job started once that has passed since the swap runs on the new ones.
        time.sleep(CHECK_EVERY + 0.5)
        after = submit(4)
        versions = {}
        for job_id in first + middle + after:
            job = wait_for_job(client, job_id, timeout=600)
            assert job["status"] == "COMPLETED", job
            version = job["result"]["model"]["version"]
            languages = {seg.get("language") for seg in job["result"]["segments"]}
            assert (version == BASE_VERSION) == ("de" in languages), (version, languages)
            versions[job_id] = version
        assert all(versions[j] != BASE_VERSION for j in before), versions  # finished before the swap
        assert all(versions[j] == BASE_VERSION for j in after), versions
        with database.session() as session:
            runs = [session.get(Job, j).engine_runs for j in versions]
            recorded = {j: session.get(Job, j).model_version for j in versions}
        assert runs == [1] * len(versions) and recorded == versions
        assert extra_pool.proc.poll() is None and "whisper-base" in extra_pool.output()  # loaded in place

        assert _whisperq("models", "rollback", "next").exit_code == 0
        time.sleep(CHECK_EVERY + 0.5)  # the workers' cache, as after the swap
        (again,) = submit(1)
        job = wait_for_job(client, again, timeout=300)
        assert job["status"] == "COMPLETED" and job["result"]["model"]["version"] not in (None, BASE_VERSION)
        history = _whisperq("models", "history", "next").output.splitlines()
        assert [__import__("json").loads(h)["action"] for h in history] == ["swap", "rollback"]
    finally:
        with database.session() as session:
            session.query(ModelWeights).filter(ModelWeights.model == "next").delete()


@pytest.mark.integration
@pytest.mark.brokers
@pytest.mark.timeout(900)  # waits of 120 + 300 + 300 s (setup.cfg's default is 300)
def test_a_rerun_on_another_model_is_a_new_job_linked_to_the_first(client, worker, extra_pool, settings):
    resp = upload(client, "fox.flac", language="en")
    first = wait_for_job(client, resp.get_json()["job_id"])
    assert first["status"] == "COMPLETED" and first["result"]["model"]["name"] == "tiny.en"

    rerun = client.post(f"/v1/jobs/{first['job_id']}/rerun", json={"model": "base"})
    assert rerun.status_code == 202, rerun.get_json()
    body = rerun.get_json()
    assert (body["rerun_of"], body["model"], body["language"]) == (first["job_id"], "base", "en")
    second = wait_for_job(client, body["job_id"], timeout=300)
    assert second["status"] == "COMPLETED", second
    assert (second["result"]["model"]["name"], second["result"]["model"]["version"]) == ("base", BASE_VERSION)
    assert word_error_rate(CLIPS["fox.flac"]["text"], second["result"]["text"]) <= 0.2

    # Bad requests say what to send, and make nothing.
    resp = client.post(f"/v1/jobs/{first['job_id']}/rerun", json={"colour": "red"})
    assert resp.status_code == 400 and "unknown field(s) 'colour'" in resp.get_json()["error"]["message"]
    resp = client.post(f"/v1/jobs/{first['job_id']}/rerun", json={"model": "large-v9"})
    assert resp.status_code == 400 and "not served here" in resp.get_json()["error"]["message"]
    resp = client.post(f"/v1/jobs/{first['job_id']}/rerun", data="model=base", content_type="text/plain")
    assert resp.status_code == 415
    assert client.post(f"/v1/jobs/{uuid.uuid4()}/rerun").status_code == 404

    # Each job owns its audio: the first deleted, the re-run can still be run again; the first cannot.
    assert client.delete(f"/v1/jobs/{first['job_id']}").status_code == 204
    resp = client.post(f"/v1/jobs/{first['job_id']}/rerun", json={"model": "base"})
    assert resp.status_code == 404  # deleted jobs are gone to the API
    third = client.post(f"/v1/jobs/{second['job_id']}/rerun")  # no body: the same options again
    assert third.status_code == 202 and third.get_json()["model"] == "base"
    assert wait_for_job(client, third.get_json()["job_id"], timeout=300)["status"] == "COMPLETED"


@pytest.mark.integration
@pytest.mark.brokers
@pytest.mark.timeout(900)  # waits up to 300 s for the replay (setup.cfg's default is 300)
def test_a_dead_letter_is_replayed_on_another_model(client, worker, extra_pool, settings, monkeypatch):
    from models.jobs.deadletter import move_to_dead_letters
    from models.runtime import Runtime
    from tasks.broker import CeleryBroker

    held: list[str] = []
    with monkeypatch.context() as m:  # the job is recorded, never sent: then it "fails" for good
        m.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: held.append(job.id))
        job_id = upload(client, "fox.flac", language="en").get_json()["job_id"]
    rt = Runtime(settings)
    move_to_dead_letters(rt, job_id, "whisperq.infer", "the model crashed", None)
    assert client.get(f"/v1/jobs/{job_id}").get_json()["status"] == "FAILED"
    bad = _whisperq("dlq", "replay", "--model", "large-v9", job_id)
    assert bad.exit_code == 1 and "not served here" in bad.output
    out = _whisperq("dlq", "replay", "--model", "base", job_id)
    assert out.exit_code == 0, out.output
    job = wait_for_job(client, job_id, timeout=300)
    assert job["status"] == "COMPLETED" and job["result"]["model"]["version"] == BASE_VERSION
