"""Metering and budgets end to end: a real HTTP server (the callback route), the real controllers and
real ``joch runner`` processes whose agents are small Python programs that report usage the way a
real agent would: ``POST $JOCH_CALLBACK_URL`` (or ``$JOCH_API_URL/...``) with ``$JOCH_RUN_TOKEN``."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from joch.admission.apply import apply_documents, create_documents
from joch.admission.documents import load_documents
from joch.api import kinds
from joch.controllers import metering
from joch.controllers.assembly import build_controllers
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.runtime import runner
from joch.runtime.base import RunId, RunnerSpec
from joch.runtime.local import LocalRuntime
from joch.runtime.sandbox import sandbox_problem
from joch.server.app import create_app
from joch.server.testing import ServerThread
from joch.store import Store, open_store

PY = sys.executable

# What an agent does to report usage: plain urllib, the token from its environment.
POST = """
import json, os, sys, time, urllib.request, urllib.error
def post(events, url=None):
    url = url or os.environ['JOCH_CALLBACK_URL']
    request = urllib.request.Request(url, data=json.dumps({'events': events}).encode(), method='POST',
        headers={'Content-Type': 'application/json', 'Authorization': 'Bearer ' + os.environ['JOCH_RUN_TOKEN']})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
"""


@dataclass
class Env:
    store: Store
    runtime: LocalRuntime
    manager: Manager
    url: str
    http: httpx.Client

    def apply(self, *objs: dict[str, Any]) -> None:
        apply_documents(self.store, load_documents("\n---\n".join(json.dumps(o) for o in objs)), dry_run=False)

    def create_run(self, name: str, *, agent: str, **spec: Any) -> None:
        doc = {"apiVersion": "runtime.joch.dev/v1alpha1", "kind": "AgentRun", "metadata": {"name": name},
               "spec": {"agentRef": {"name": agent}, "implementation": {"inline": {"text": "spend"}}, **spec}}
        create_documents(self.store, load_documents(json.dumps(doc)), dry_run=False)

    def run(self, name: str) -> dict[str, Any]:
        return self.store.get(kinds.AGENT_RUN, "default", name)

    def wait(self, name: str, test: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(name)
            if test(run):
                return run
            assert time.monotonic() < deadline, f"run {name}: {run.get('status')}"
            time.sleep(0.05)

    def wait_phase(self, name: str, *phases: str, timeout: float = 30) -> dict[str, Any]:
        return self.wait(name, lambda r: (r.get("status") or {}).get("phase") in phases, timeout)

    def token(self, name: str) -> str:
        run = self.run(name)
        return metering.run_token(self.store, run["metadata"]["uid"], run["status"]["attempt"])

    def callback(self, name: str, body: Any, token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return self.http.post(f"/v1/namespaces/default/agentruns/{name}/callback", json=body, headers=headers)


def provider(name: str, code: str) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
            "spec": {"binary": PY, "argsTemplate": ["-c", POST + code]}}


def agent(name: str, provider_name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"providerRef": {"name": provider_name}, **spec}}


def budget(name: str, limit: float, *, period: str = "day", on_exceed: str = "deny", namespace: str = "default",
           **scope: str) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Budget", "metadata": {"name": name, "namespace": namespace},
            "spec": {"scope": scope, "period": period, "limitUsd": limit, "onExceed": on_exceed}}


def model(name: str, model_id: str, inp: float, out: float, cached: float | None = None) -> dict[str, Any]:
    pricing: dict[str, float] = {"inputPerMillionUsd": inp, "outputPerMillionUsd": out}
    if cached is not None:
        pricing["cachedInputPerMillionUsd"] = cached
    return {"apiVersion": "model.joch.dev/v1alpha1", "kind": "Model", "metadata": {"name": name},
            "spec": {"provider": "openai", "modelId": model_id, "pricing": pricing}}


SLEEPER = "time.sleep(60)"


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., Env]]:
    made: list[tuple[Env, ServerThread, Store]] = []

    def make(store_url: str | None = None, *, sandbox: str = "none") -> Env:
        store = open_store(store_url or f"sqlite:///{tmp_path / 'joch.db'}")
        data = tmp_path / "data"
        options = ControllerOptions(data_dir=data, leader_election=False, grace_seconds=1.0, resync_period=2.0)
        # The server's socket is bound before it starts, so the runtime can be told its URL first.
        app = create_app(store)
        thread = ServerThread(app)
        runtime = LocalRuntime(data, sandbox=sandbox, api_url=thread.url)
        app.state.runtime = runtime
        thread.start()
        manager = Manager(store, build_controllers(store, runtime, options), options)
        manager.start()
        assert manager.wait_started(10)
        env = Env(store, runtime, manager, thread.url, httpx.Client(base_url=thread.url, timeout=10))
        made.append((env, thread, store))
        return env

    yield make
    for env, thread, store in made:
        env.manager.stop()
        env.runtime.close()
        env.http.close()
        thread.stop()
        store.close()


def status(run: dict[str, Any]) -> dict[str, Any]:
    return run.get("status") or {}


def test_a_run_reporting_80_cents_then_a_run_reserving_50_against_a_1_dollar_day_is_budget_exceeded(
        make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", "post([{'id': 'e1', 'model': 'm', 'costUsd': 0.80}])"), agent("a", "p"),
              budget("daily", 1.0))
    env.create_run("first", agent="a")
    first = env.wait_phase("first", "Succeeded", "Failed")
    assert status(first)["phase"] == "Succeeded", status(first)
    assert status(first)["costUsd"] == pytest.approx(0.80)

    env.create_run("second", agent="a", budgetUsd=0.5)
    second = status(env.wait_phase("second", "Failed", "Succeeded"))
    assert (second["phase"], second["reason"]) == ("Failed", "BudgetExceeded")
    assert "$1.00" in second["message"] and "$0.80" in second["message"] and "$0.50" in second["message"]
    assert "startedAt" not in second  # it never ran
    # The Budget's status follows the spend.
    deadline = time.monotonic() + 10
    while (got := env.store.get(kinds.BUDGET, "default", "daily").get("status") or {}).get("spendUsd") != 0.8:
        assert time.monotonic() < deadline, got
        time.sleep(0.1)
    assert (got["remainingUsd"], got["runsCounted"]) == (pytest.approx(0.2), 1)
    assert got["periodStart"].endswith("T00:00:00Z")
    # Within what is left, a run still starts.
    env.create_run("third", agent="a", budgetUsd=0.1)
    assert status(env.wait_phase("third", "Succeeded", "Failed"))["phase"] == "Failed"  # it reports 0.80: stopped
    third = status(env.run("third"))
    assert third["reason"] == "BudgetExceeded" and "over its own budget of $0.10" in third["message"]


def test_an_agent_that_keeps_spending_is_stopped_when_it_crosses_its_own_budget(make_env: Callable[..., Env]) -> None:
    env = make_env()
    code = ("for i in range(300):\n"
            "    try: post([{'id': f'e{i}', 'costUsd': 0.1}])\n"
            "    except Exception: pass\n"
            "    time.sleep(0.1)\n")
    env.apply(provider("p", code), agent("a", "p", defaults={"budgetUsd": 5}))
    env.create_run("spender", agent="a", budgetUsd=0.35)
    run = status(env.wait_phase("spender", "Succeeded", "Failed", "Cancelled"))
    assert (run["phase"], run["reason"]) == ("Failed", "BudgetExceeded"), run
    assert "spent $0.40, over its own budget of $0.35 (spec.budgetUsd)" in run["message"], run["message"]
    assert run["costUsd"] < 1.0  # stopped long before its 300 reports
    reasons = [e["spec"]["reason"] for e in env.store.list(kinds.EVENT).items
               if e["spec"]["involvedObject"]["name"] == "spender"]
    assert "BudgetExceeded" in reasons


def test_a_budget_crossed_while_running_stops_the_run(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p"), budget("tiny", 0.5, period="total"))
    env.create_run("r", agent="a")
    env.wait_phase("r", "Running")
    token = env.token("r")
    assert env.callback("r", {"id": "1", "costUsd": 0.3}, token).json()["costUsd"] == pytest.approx(0.3)
    answer = env.callback("r", {"id": "2", "costUsd": 0.3}, token).json()
    assert "over its limit of $0.50 in total" in answer["budgetExceeded"]
    run = status(env.wait_phase("r", "Failed", "Cancelled", "Succeeded"))
    assert (run["phase"], run["reason"]) == ("Failed", "BudgetExceeded")
    assert 'Budget "tiny"' in run["message"] and "$0.60" in run["message"]


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_retried_event_counts_once(make_env: Callable[..., Env], backend: str,
                                     request: pytest.FixtureRequest) -> None:
    env = make_env(request.getfixturevalue(f"{backend}_url"))
    code = ("a = post([{'id': 'x', 'costUsd': 0.25, 'inputTokens': 10}])\n"
            "b = post([{'id': 'x', 'costUsd': 0.25, 'inputTokens': 10}])\n"
            "c = post([{'id': 'x', 'costUsd': 0.25}, {'id': 'y', 'costUsd': 0.5}, {'id': 'y', 'costUsd': 0.5}])\n"
            "print(json.dumps([a['accepted'], b['accepted'], b['duplicates'], c['accepted'], c['duplicates']]))\n")
    env.apply(provider("p", code), agent("a", "p"))
    env.create_run("r", agent="a")
    run = status(env.wait_phase("r", "Succeeded", "Failed"))
    assert run["phase"] == "Succeeded", run
    assert run["costUsd"] == pytest.approx(0.75)
    assert run["usage"] == {"inputTokens": 10, "outputTokens": 0, "cachedTokens": 0}
    log = b"".join(env.runtime.logs(run["runtimeRef"])).decode()
    assert json.loads(log.strip().splitlines()[-1]) == [1, 0, 1, 1, 2]
    total = env.http.get("/v1/namespaces/default/cost", params={"by": "agent"}).json()["total"]
    assert (total["costUsd"], total["events"], total["runs"]) == (0.75, 2, 1)


def test_the_callback_refuses_wrong_foreign_and_expired_tokens_with_401(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p"))
    env.create_run("mine", agent="a")
    env.create_run("other", agent="a")
    env.wait_phase("mine", "Running")
    env.wait_phase("other", "Running")
    mine, other = env.token("mine"), env.token("other")
    event = {"id": "1", "costUsd": 0.1}
    basic = env.http.post("/v1/namespaces/default/agentruns/mine/callback", json=event,
                          headers={"Authorization": f"Basic {mine}"})
    assert basic.status_code == 401  # the right token, but not as a bearer token
    for token in (None, "not-a-token", other, mine + "0", mine[:-1]):
        response = env.callback("mine", event, token)
        assert response.status_code == 401, (token, response.text)
        body = response.json()
        assert (body["kind"], body["code"], body["reason"]) == ("Status", 401, "Unauthorized")
        assert mine not in response.text and other not in response.text
    # No such run: the same answer, so the route says nothing about which runs exist.
    assert env.callback("nobody", event, mine).json()["message"] == env.callback("mine", event, "x").json()["message"]
    # A bad body with a bad token is still a 401: nothing is read before the token is checked.
    assert env.http.post("/v1/namespaces/default/agentruns/mine/callback", content=b"{not json",
                         headers={"Content-Type": "application/json"}).status_code == 401
    assert env.callback("mine", event, mine).status_code == 200
    assert status(env.run("other")).get("costUsd") is None  # its token went nowhere
    env.store.update(kinds.AGENT_RUN, {**env.run("mine"), "spec": {**env.run("mine")["spec"], "cancel": True}})
    env.wait_phase("mine", "Cancelled")
    assert env.callback("mine", {"id": "2", "costUsd": 0.1}, mine).status_code == 401  # the run ended
    assert status(env.run("mine"))["costUsd"] == pytest.approx(0.1)


def test_cost_is_computed_from_the_models_prices(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p", modelRoute="codex"),
              model("codex", "gpt-5-codex", 1.25, 10.0, 0.125), model("cheap", "small-1", 0.1, 0.4))
    env.create_run("r", agent="a")
    env.wait_phase("r", "Running")
    token = env.token("r")
    # By modelId; 100k of the 200k input tokens were cached.
    answer = env.callback("r", {"events": [{"id": "1", "model": "gpt-5-codex", "inputTokens": 200_000,
                                            "cachedTokens": 100_000, "outputTokens": 50_000}]}, token)
    assert answer.status_code == 200, answer.text
    assert answer.json()["costUsd"] == pytest.approx(0.125 + 0.0125 + 0.5)
    # By name; without a cached price cached tokens cost the input price. No model: the Agent's modelRoute.
    env.callback("r", {"id": "2", "model": "cheap", "inputTokens": 1_000_000, "cachedTokens": 500_000}, token)
    final = env.callback("r", {"id": "3", "outputTokens": 100_000}, token).json()
    assert final["costUsd"] == pytest.approx(0.6375 + 0.1 + 1.0)
    assert final["usage"] == {"inputTokens": 1_200_000, "outputTokens": 150_000, "cachedTokens": 600_000}
    # An unknown model without costUsd: 422 naming it, nothing recorded (not even the valid event before it).
    bad = env.callback("r", {"events": [{"id": "4", "costUsd": 1}, {"id": "5", "model": "gpt-9"}]}, token)
    assert bad.status_code == 422 and 'no Model "gpt-9"' in bad.json()["message"]
    assert bad.json()["details"]["causes"][0]["field"] == "events[1].model"
    # Only the agent sees that answer: the run says it too (condition and Warning Event), once.
    assert env.callback("r", {"id": "5", "model": "gpt-9"}, token).status_code == 422
    said = next(c for c in status(env.run("r"))["conditions"] if c["type"] == "UsageRecorded")
    assert (said["status"], said["reason"]) == ("False", "UsageNotPriced")
    assert said["message"].startswith('usage the agent reported was not recorded: an event\'s model: no Model "gpt-9"')
    warnings = [e["spec"] for e in env.store.list(kinds.EVENT).items if e["spec"]["reason"] == "UsageNotPriced"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and warnings[0]["message"] == said["message"]
    broken = env.callback("r", {"id": "6", "inputTokens": -1, "cachedTokens": 5}, token)
    assert broken.status_code == 422 and "inputTokens" in broken.text
    assert status(env.run("r"))["costUsd"] == pytest.approx(1.7375)
    by_model = env.http.get("/v1/cost", params={"by": "model"}).json()["items"]
    assert {i["model"]: i["costUsd"] for i in by_model} == {"codex": pytest.approx(1.6375), "cheap": 0.1}


def test_a_held_run_stays_queued_until_the_budget_allows_it(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", "post([{'id': 'e', 'costUsd': 0.9}])"), agent("a", "p"),
              budget("hold", 1.0, period="week", on_exceed="hold", agent="a"))
    env.create_run("first", agent="a")
    assert status(env.wait_phase("first", "Succeeded", "Failed"))["phase"] == "Succeeded"
    env.create_run("held", agent="a", budgetUsd=0.95)
    run = status(env.wait("held", lambda r: status(r).get("reason") == "BudgetExceeded"))
    assert run["phase"] == "Queued"
    assert "held until the period ends at" in run["message"] and "$0.90" in run["message"]
    time.sleep(2.5)  # a resync later it is still held
    assert (status(env.run("held"))["phase"], status(env.run("held"))["reason"]) == ("Queued", "BudgetExceeded")
    stored = env.store.get(kinds.BUDGET, "default", "hold")
    env.store.update(kinds.BUDGET, {**stored, "spec": {**stored["spec"], "limitUsd": 3.0}})
    done = status(env.wait_phase("held", "Succeeded", "Failed"))
    assert done["phase"] == "Succeeded"
    assert [c["status"] for c in done["conditions"] if c["type"] == "Blocked"] == ["False"]


def test_budgets_count_only_their_scope(make_env: Callable[..., Env]) -> None:
    env = make_env()
    team_agent = agent("t", "p")
    team_agent["metadata"]["labels"] = {kinds.TEAM_LABEL: "core"}
    env.apply(provider("p", "post([{'id': 'e', 'costUsd': 0.6}])"), agent("a", "p"), team_agent,
              budget("core", 1.0, period="month", namespace="joch-system", team="core"))
    env.create_run("t1", agent="t")
    env.wait_phase("t1", "Succeeded")
    env.create_run("a1", agent="a", budgetUsd=0.6)  # not the team's: the Budget does not count it
    assert status(env.wait_phase("a1", "Succeeded", "Failed"))["phase"] == "Succeeded"
    env.create_run("t2", agent="t", budgetUsd=0.6)
    t2 = status(env.wait_phase("t2", "Failed", "Succeeded"))
    assert t2["reason"] == "BudgetExceeded" and 'Budget "core" in namespace "joch-system"' in t2["message"]
    teams = env.http.get("/v1/cost", params={"by": "team"}).json()["items"]
    assert {i["team"]: i["costUsd"] for i in teams} == {"core": 0.6, "": 0.6}


def test_the_runner_reports_usage_through_the_same_callback(make_env: Callable[..., Env], tmp_path: Path) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p"))
    env.create_run("r", agent="a")
    run = env.wait_phase("r", "Running")
    run_id = RunId(namespace="default", name="r", uid=run["metadata"]["uid"], attempt=1)
    spec = RunnerSpec(run=run_id, argv=("true",), secret_env=("JOCH_RUN_TOKEN",))
    files = runner.RunFiles(tmp_path / "elsewhere")
    inside = runner.Runner(spec, files, root=tmp_path, cache=tmp_path, environ={},
                           secrets={"JOCH_RUN_TOKEN": env.token("r")}, api_url=env.url)
    answer = inside.report_usage({"id": "parsed-1", "model": "m", "costUsd": 0.25, "outputTokens": 7})
    assert (answer["accepted"], answer["costUsd"]) == (1, 0.25)
    assert inside.report_usage({"id": "parsed-1", "costUsd": 0.25})["duplicates"] == 1  # a retry: once
    assert status(env.run("r"))["costUsd"] == 0.25
    assert status(env.run("r"))["usage"]["outputTokens"] == 7
    wrong = runner.Runner(spec, files, root=tmp_path, cache=tmp_path, environ={},
                          secrets={"JOCH_RUN_TOKEN": "jrt1_forged"}, api_url=env.url)
    with pytest.raises(runner.UsageNotReported, match="401"):
        wrong.report_usage({"id": "parsed-2", "costUsd": 1})
    no_callback = runner.Runner(spec, files, root=tmp_path, cache=tmp_path, environ={}, secrets={})
    with pytest.raises(runner.UsageNotReported, match="no callback"):
        no_callback.report_usage({"id": "parsed-3", "costUsd": 1})


def test_the_agent_finds_the_server_through_joch_api_url_and_never_logs_its_token(
        make_env: Callable[..., Env]) -> None:
    env = make_env()
    code = ("url = os.environ['JOCH_API_URL'] + '/v1/namespaces/' + os.environ['JOCH_RUN_NAMESPACE'] + "
            "'/agentruns/' + os.environ['JOCH_RUN_NAME'] + '/callback'\n"
            "assert url == os.environ['JOCH_CALLBACK_URL']\n"
            "print('token:', os.environ['JOCH_RUN_TOKEN'])\n"
            "print(post([{'id': 'e', 'costUsd': 0.05}], url)['costUsd'])\n")
    env.apply(provider("p", code), agent("a", "p"))
    env.create_run("r", agent="a")
    run = env.wait_phase("r", "Succeeded", "Failed")
    log = b"".join(env.runtime.logs(status(run)["runtimeRef"])).decode()
    assert status(run)["phase"] == "Succeeded", log
    assert "token: ***" in log and "0.05" in log
    assert env.token("r") not in log


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"bubblewrap does not work here: {sandbox_problem()}")
def test_a_sandboxed_agent_reaches_the_callback_on_127_0_0_1(make_env: Callable[..., Env]) -> None:
    env = make_env(sandbox="bwrap")
    env.apply(provider("p", "post([{'id': 'e', 'costUsd': 0.05}])"), agent("a", "p"))
    env.create_run("r", agent="a")
    run = status(env.wait_phase("r", "Succeeded", "Failed"))
    assert (run["phase"], run["costUsd"]) == ("Succeeded", 0.05)


def test_runs_in_flight_hold_their_reservations(make_env: Callable[..., Env]) -> None:
    env = make_env()
    env.apply(provider("p", SLEEPER), agent("a", "p", defaults={"budgetUsd": 0.6}), budget("cap", 1.0, period="total"))
    env.create_run("one", agent="a")
    env.create_run("two", agent="a")
    ended = status(env.wait(
        "two", lambda r: status(r).get("phase") in ("Failed", "Running")
        and status(env.run("one")).get("phase") in ("Failed", "Running")))
    phases = sorted([status(env.run("one"))["phase"], ended["phase"]])
    assert phases == ["Failed", "Running"]  # two runs reserving $0.60 each: only one fits in $1.00
    refused = next(status(env.run(n)) for n in ("one", "two") if status(env.run(n))["phase"] == "Failed")
    assert refused["reason"] == "BudgetExceeded"
    assert "$0.60 reserved by runs in flight; this run reserves $0.60" in refused["message"]
    deadline = time.monotonic() + 10
    while (env.store.get(kinds.BUDGET, "default", "cap").get("status") or {}).get("reservedUsd") != 0.6:
        assert time.monotonic() < deadline
        time.sleep(0.1)
