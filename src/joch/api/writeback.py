"""What a run writes back to the tracker its work came from (``writeBack`` on a TriggerRule or an
Agent), and what it wrote (``AgentRun.status.writeBack``).

A TriggerRule's ``writeBack`` wins over its Agent's, field by field (``joch.controllers.writeback``
merges them). Every write it asks for becomes a ``WriteIntent`` (runtime.joch.dev): see
``joch.api.integrations``.
"""

from __future__ import annotations

from pydantic import Field

from joch.api.meta import Bool, Model, PositiveInt, Str


class CommentWriteBack(Model):
    """One comment per run on the source issue, created when the run starts and edited in place as it
    progresses. ``template``: a Jinja2 template (sandboxed) for the comment's body; the default shows
    the phase, the run, its cost, the pull request, the summary artifact and the failure reason."""

    enabled: Bool = True
    template: Str | None = None


class PullRequestWriteBack(Model):
    """When a run Succeeds with a non-empty ``changes.patch``: a commit of that patch on the run's base
    commit is pushed to ``<branchPrefix>/<run>`` of the run's repository and a pull request opened
    against ``base`` (the run's ref when left out). ``titleTemplate``/``bodyTemplate``: Jinja2 (the
    body gets ``Closes #N`` for a GitHub issue unless it says so itself). ``sourceRef``: the GitHub
    ImplementationSource whose credentials and repository open the pull request (the run's own
    source when left out; required for runs from Linear)."""

    enabled: Bool = True
    branchPrefix: Str = Field(default="joch", min_length=1)
    base: Str | None = None
    draft: Bool = False
    titleTemplate: Str | None = None
    bodyTemplate: Str | None = None
    sourceRef: Str | None = None
    requireApproval: Bool = False


class WriteBack(Model):
    comment: CommentWriteBack | None = None
    pullRequest: PullRequestWriteBack | None = None
    # Every write of the run waits for a ``write-back`` Approval (a Policy rule with phase writeBack
    # can ask for one too).
    requireApproval: Bool = False
    maxAttempts: PositiveInt = 8


class PullRequestRef(Model):
    url: Str
    number: int | None = None
    branch: Str | None = None
    commit: Str | None = None


class RunWriteBack(Model):
    """``AgentRun.status.writeBack``: where the run's writes landed."""

    commentUrl: Str | None = None
    pullRequest: PullRequestRef | None = None
    pending: list[Str] = Field(default_factory=list)  # intents waiting for approval, by name
