"""A tiny agent output format for the runner's tests, registered as ``test-lines`` in
``agentoutput.FORMATS`` by the runner command the tests start (``RUNNER_WITH_TEST_FORMAT``):

* ``USAGE <id> <input tokens> <output tokens> <cost>`` → one usage event;
* ``SESSION <id>`` → the CLI's session id;
* ``ERROR <words>`` → the CLI's own verdict that it failed;
* ``BOOM`` → the parser raises (a parser's bug must not end the run).
Anything else tells nothing."""

from __future__ import annotations

from joch.runtime.agentoutput import Observation

NAME = "test-lines"
RUNNER_WITH_TEST_FORMAT = (
    "import sys; from joch.runtime import agentoutput, runner; "
    f"agentoutput.FORMATS[{NAME!r}] = 'integration.runtime.lineformat'; sys.exit(runner.main())"
)


class Parser:
    def __init__(self) -> None:
        self.lines = 0

    def feed(self, line: str) -> Observation | None:
        self.lines += 1
        word, _, rest = line.partition(" ")
        if word == "USAGE":
            event_id, inputs, outputs, cost = rest.split()
            return Observation(usage=[{"id": event_id, "model": "m", "inputTokens": int(inputs),
                                       "outputTokens": int(outputs), "costUsd": float(cost)}])
        if word == "SESSION":
            return Observation(session_id=rest.strip())
        if word == "ERROR":
            return Observation(error=rest.strip())
        if word == "BOOM":
            raise RuntimeError("the test parser was told to fail")
        return None

    def finish(self) -> Observation | None:
        return Observation(usage=[{"id": "final", "model": "m", "outputTokens": self.lines}]) if self.lines else None
