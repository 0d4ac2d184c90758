"""Budgets: which apply to a run, what they have spent, the dispatch check, and their status.

A ``Budget`` (ops.joch.dev) caps what runs may spend in a UTC calendar period (``day``: from
midnight; ``week``: from Monday midnight; ``month``: from the 1st; ``total``: ever).

* **Which runs a Budget counts.** A Budget in ``joch-system`` counts runs of every namespace, or of
  ``scope.namespace``; a Budget in any other namespace counts only runs of its own namespace (a
  ``scope.namespace`` naming another one makes it count nothing, and its ``Ready`` condition says
  so: a namespace's users must not be able to stop another namespace's runs). ``scope.agent``
  narrows to one Agent (by name, in the counted namespaces), ``scope.team`` to Agents labelled
  ``joch.dev/team: <team>`` (``kinds.TEAM_LABEL``; the label as it was when the usage was metered).
* **Spend** is what was metered (``joch.controllers.metering``: the usage table) in the period, by
  runs the scope counts. It survives the runs: deleting a run does not give its spend back.
* **Reservations.** Before a run is queued, its reservation (``spec.budgetUsd``, else its Agent's
  ``spec.defaults.budgetUsd``, else 0) is checked against every Budget that applies: the check
  fails when spend + reserved + the reservation is above ``limitUsd``, or when spend + reserved has
  reached it already (a run that reserves nothing still needs something left). ``reserved`` is
  what runs in flight may still spend: for every run the check admitted that has not ended (and
  every run found Running at start), its reservation less what it has metered so far, never below
  zero. The run controller keeps those in memory under one lock, so two runs checked at once
  cannot both take the last dollars.
* A failed check ends the run ``Failed/BudgetExceeded`` (``onExceed: deny``) or holds it ``Queued``
  with reason ``BudgetExceeded`` until the period rolls over (``hold``; the run is looked at again
  at the boundary, and whenever the Budget changes). Either way the message gives the limit, the
  spend, what is reserved and the run's reservation, and an audit entry records the block.
* **While a run goes,** spend that crosses its own cap or any Budget's limit stops it (see
  ``metering``): a Budget counts only metered spend then, not other runs' reservations.

``BudgetController`` keeps each Budget's status current (``spendUsd``, ``reservedUsd``,
``remainingUsd`` = limit - spend, ``runsCounted``, ``periodStart``/``periodEnd``, and an
``Exceeded`` condition): on every change of the Budget, of any run it may count, at the period
boundary and at every resync.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joch.api import kinds
from joch.api.meta import set_condition
from joch.api.registry import KindInfo
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.store.base import ListOptions, Obj, UsageFilter, Writer

SYSTEM_NAMESPACE = "joch-system"
EPSILON = 1e-9  # sums of float dollars: a cent is never lost to rounding either way


# --- periods ---------------------------------------------------------------------------------------

def period_bounds(period: str, now: float) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The UTC calendar period containing ``now``: (start, end); both None for ``total``."""
    at = dt.datetime.fromtimestamp(now, dt.UTC)
    midnight = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return midnight, midnight + dt.timedelta(days=1)
    if period == "week":
        start = midnight - dt.timedelta(days=midnight.weekday())
        return start, start + dt.timedelta(days=7)
    if period == "month":
        start = midnight.replace(day=1)
        end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
        return start, end
    return None, None


def stamp(moment: dt.datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ") if moment is not None else None


def usd(amount: float) -> str:
    """``$0.80``; amounts below a cent keep their digits (``$0.000125``)."""
    if abs(amount - round(amount, 2)) < EPSILON:
        return f"${amount:.2f}"
    return "$" + f"{amount:.6f}".rstrip("0")


def per(period: str) -> str:
    return "in total" if period == "total" else f"per {period}"


# --- scope -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunScope:
    """What a Budget's scope is matched against: a run's namespace, Agent and team label."""

    namespace: str
    agent: str
    team: str

    @classmethod
    def of(cls, run: Obj, agent: Obj | None) -> RunScope:
        labels = ((agent or {}).get("metadata") or {}).get("labels") or {}
        return cls(run["metadata"].get("namespace") or "", run["spec"]["agentRef"]["name"],
                   str(labels.get(kinds.TEAM_LABEL) or ""))


def counted_namespace(budget: Obj) -> str | None:
    """The namespace whose runs ``budget`` counts (None: every namespace). A Budget outside
    ``joch-system`` whose scope names another namespace counts nothing: ``scope_problem`` says so."""
    own = budget["metadata"].get("namespace") or ""
    named = ((budget.get("spec") or {}).get("scope") or {}).get("namespace")
    if own == SYSTEM_NAMESPACE:
        return named or None
    return own


def scope_problem(budget: Obj) -> str | None:
    own = budget["metadata"].get("namespace") or ""
    named = ((budget.get("spec") or {}).get("scope") or {}).get("namespace")
    if own != SYSTEM_NAMESPACE and named and named != own:
        return (f'spec.scope.namespace "{named}" is not this Budget\'s namespace "{own}": a Budget counts only '
                f"runs of its own namespace (a Budget in {SYSTEM_NAMESPACE} may name any); it counts nothing")
    return None


def applies(budget: Obj, scope: RunScope) -> bool:
    if scope_problem(budget) is not None:
        return False
    wanted = (budget.get("spec") or {}).get("scope") or {}
    namespace = counted_namespace(budget)
    return ((namespace is None or namespace == scope.namespace)
            and (not wanted.get("agent") or wanted["agent"] == scope.agent)
            and (not wanted.get("team") or wanted["team"] == scope.team))


def usage_filter(budget: Obj, since: dt.datetime | None) -> UsageFilter:
    wanted = (budget.get("spec") or {}).get("scope") or {}
    return UsageFilter(since=since.timestamp() if since is not None else None, namespace=counted_namespace(budget),
                       agent=wanted.get("agent") or None, team=wanted.get("team") or None)


def applicable(budgets: Iterable[Obj], scope: RunScope) -> list[Obj]:
    return sorted((b for b in budgets if applies(b, scope)),
                  key=lambda b: (b["metadata"].get("namespace") or "", b["metadata"]["name"]))


def budgets_for(reader: Writer, namespace: str) -> list[Obj]:
    """The Budgets that may count runs of ``namespace``: its own and ``joch-system``'s."""
    found = reader.list(kinds.BUDGET, ListOptions(namespace=namespace)).items
    if namespace != SYSTEM_NAMESPACE:
        found += reader.list(kinds.BUDGET, ListOptions(namespace=SYSTEM_NAMESPACE)).items
    return found


def name_of(budget: Obj) -> str:
    m = budget["metadata"]
    return f'Budget "{m["name"]}" in namespace "{m.get("namespace") or ""}"'


# --- reservations ----------------------------------------------------------------------------------

def reservation(run: Obj, agent: Obj | None) -> float | None:
    """What the run may spend: ``spec.budgetUsd``, else its Agent's ``defaults.budgetUsd`` (None: neither)."""
    own = run["spec"].get("budgetUsd")
    if isinstance(own, int | float) and not isinstance(own, bool):
        return float(own)
    default = (((agent or {}).get("spec") or {}).get("defaults") or {}).get("budgetUsd")
    if isinstance(default, int | float) and not isinstance(default, bool):
        return float(default)
    return None


def cost_of(run: Obj | None) -> float:
    cost = ((run or {}).get("status") or {}).get("costUsd")
    return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else 0.0


@dataclass(frozen=True)
class Reserved:
    """A run in flight and what it may spend (``amount``); ``run_cost`` reads what it has spent."""

    scope: RunScope
    amount: float


def outstanding(reserved: Mapping[Key, Reserved], costs: Mapping[Key, float], budget: Obj,
                excluding: Key | None = None) -> float:
    return sum(max(0.0, r.amount - costs.get(key, 0.0)) for key, r in reserved.items()
               if key != excluding and applies(budget, r.scope))


# --- the dispatch check ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    """A Budget a run does not fit in: ``message`` names the limit, the spend and the reservation."""

    budget: Obj
    message: str
    hold: bool
    until: dt.datetime | None  # when a held run is looked at again (the period's end; None: total)


def check(budgets: Sequence[Obj], scope: RunScope, amount: float, spent: Mapping[str, float],
          reserved: Mapping[str, float], now: float) -> Block | None:
    """The first Budget (by namespace and name) that ``amount`` more does not fit in; ``spent`` and
    ``reserved`` are per Budget uid."""
    for budget in applicable(budgets, scope):
        spec = budget.get("spec") or {}
        limit = float(spec.get("limitUsd") or 0)
        uid = budget["metadata"]["uid"]
        spend, held = spent.get(uid, 0.0), reserved.get(uid, 0.0)
        committed = spend + held
        if committed + amount <= limit + EPSILON and committed < limit - EPSILON:
            continue
        period = str(spec.get("period") or "total")
        start, end = period_bounds(period, now)
        since = f" since {stamp(start)}" if start is not None else ""
        message = (f"{name_of(budget)}: limit {usd(limit)} {per(period)}; spent {usd(spend)}{since}, "
                   f"{usd(held)} reserved by runs in flight; this run reserves {usd(amount)}")
        hold = spec.get("onExceed") == "hold"
        if hold:
            message += (f"; held until the period ends at {stamp(end)}" if end is not None
                        else "; held until the Budget is raised")
        return Block(budget=budget, message=message, hold=hold, until=end)
    return None


def spend_in_period(reader: Writer, budget: Obj, now: float) -> float:
    start, _ = period_bounds(str((budget.get("spec") or {}).get("period") or "total"), now)
    return reader.usage_totals(usage_filter(budget, start))[0].cost_usd


# --- status ----------------------------------------------------------------------------------------

class BudgetController(Controller):
    """Keeps every Budget's status current (see the module docstring)."""

    name = "budgets"
    kind = kinds.BUDGET

    def __init__(self, resync_period: float = 30.0) -> None:
        self.resync_period = resync_period
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("BudgetController used before setup()")
        return self._ctx

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        ctx.cache(kinds.AGENT)

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ((kinds.AGENT_RUN, self._budgets_of_run),)

    def _budgets_of_run(self, run: Obj) -> Iterable[Key]:
        namespace = run["metadata"].get("namespace") or ""
        cache = self.ctx.cache(kinds.BUDGET)
        for budget in [*cache.list(namespace), *(cache.list(SYSTEM_NAMESPACE) if namespace != SYSTEM_NAMESPACE
                                                 else [])]:
            yield Key.of(budget)

    def reconcile(self, key: Key) -> Result | None:
        budget = self.ctx.cache(kinds.BUDGET).get(key.namespace, key.name)
        if budget is None:
            return None
        now = self.ctx.clock.time()
        spec = budget.get("spec") or {}
        period = str(spec.get("period") or "total")
        start, end = period_bounds(period, now)
        limit = float(spec.get("limitUsd") or 0)
        problem = scope_problem(budget)
        total = self.ctx.store.usage_totals(usage_filter(budget, start))[0]
        spend = total.cost_usd if problem is None else 0.0
        runs = total.runs if problem is None else 0
        held = self._reserved(budget) if problem is None else 0.0
        status: dict[str, Any] = dict(budget.get("status") or {})
        conditions = list(status.get("conditions") or [])
        if problem is not None:
            conditions = set_condition(conditions, _cond("Ready", "False", "ScopeOutsideNamespace", problem))
        else:
            conditions = set_condition(conditions, _cond("Ready", "True", "Counting",
                                                         f"counting spend {per(period)}"))
        over = problem is None and spend >= limit - EPSILON
        said = f"spent {usd(spend)} of {usd(limit)} {per(period)}"
        conditions = set_condition(conditions, _cond("Exceeded", "True" if over else "False",
                                                     "LimitReached" if over else "WithinLimit", said))
        status.update(spendUsd=round(spend, 6), reservedUsd=round(held, 6),
                      remainingUsd=round(max(0.0, limit - spend), 6), runsCounted=runs,
                      periodStart=stamp(start), periodEnd=stamp(end), conditions=conditions,
                      observedGeneration=budget["metadata"].get("generation"))
        if status != budget.get("status"):
            self.ctx.store.update_status(kinds.BUDGET, {**budget, "status": status})
        wait = self.resync_period if end is None else min(self.resync_period, max(0.5, end.timestamp() - now))
        return Result(requeue_after=wait)

    def _reserved(self, budget: Obj) -> float:
        """What runs in flight that ``budget`` counts may still spend of their reservations."""
        namespace = counted_namespace(budget)
        agents = self.ctx.cache(kinds.AGENT)
        total = 0.0
        for run in self.ctx.cache(kinds.AGENT_RUN).list(namespace):
            if (run.get("status") or {}).get("phase") != "Running":
                continue
            agent = agents.get(run["metadata"].get("namespace") or "", run["spec"]["agentRef"]["name"])
            if applies(budget, RunScope.of(run, agent)):
                total += max(0.0, (reservation(run, agent) or 0.0) - cost_of(run))
        return total


def _cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}
