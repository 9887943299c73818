"""Hosts side by side: the facts that hosts serving one model should share, compared.

Each host's :class:`HostSide` (what 00_preflight or 05_diagnose read there: GPU model and
count, driver, CUDA, vLLM, torch, Ray, the KV-cache dtype and attention backend the engine
runs with, the launch script's hash) goes into :func:`compare`, which groups the hosts by the
model they serve and names each fact whose values differ within a group. A
:class:`Comparison` shows as one host x fact table, the differing cells highlighted, and
gives each host its findings ("hosts differ: vLLM: host-a 0.15.1, host-b 0.33.0"). Pure: what
is read from the hosts is :mod:`opsbook.steps.host_side`'s.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields

from opsbook.core.results import Finding, Table

# The codes of a "hosts differ" finding, and of the one that notes a host's row of the table
# in its record (core/results.Finding.code).
HOSTS_DIFFER = "hosts-differ"
SIDE_BY_SIDE = "hosts-side-by-side"
# The cell colours of the table: a value that is not the group's most common one.
DIFFERS_COLOUR = "#ffebe9"
# Unknown (not read): never counted as a difference.
UNKNOWN = ""


@dataclass(frozen=True)
class HostSide:
    """What one host shows of the facts that hosts serving one model should share.

    Attributes:
        host: the host's name.
        model: the model it serves (its served name, else its checkpoint folder's name): the
            hosts compared are those serving the same one.
        gpus: GPU model and count (``8 × NVIDIA B200``).
        driver: the NVIDIA driver.
        cuda: the CUDA version the driver supports.
        vllm: vLLM of the deployment's python (``not installed``).
        torch: torch of the deployment's python.
        ray: Ray of the deployment's python.
        kv_cache_dtype: the KV-cache dtype the engine runs with (or is predicted to).
        attention_backend: the attention backend it runs with (or is predicted to).
        engine_from: where those two come from (``the server's log``, ``predicted``).
        script_sha256: the launch script's hash (empty: none on the host).

    An empty value is unknown, and differs from nothing.
    """

    host: str
    model: str
    gpus: str = UNKNOWN
    driver: str = UNKNOWN
    cuda: str = UNKNOWN
    vllm: str = UNKNOWN
    torch: str = UNKNOWN
    ray: str = UNKNOWN
    kv_cache_dtype: str = UNKNOWN
    attention_backend: str = UNKNOWN
    engine_from: str = UNKNOWN
    script_sha256: str = UNKNOWN

    def value(self, fact: Fact) -> str:
        value: str = getattr(self, fact.field)
        return value


@dataclass(frozen=True)
class Fact:
    """One column of the table.

    Attributes:
        name: as the table and findings name it.
        field: the :class:`HostSide` attribute.
        warns: whether hosts that differ in it get a finding (a launch script differs
            wherever a host's vars do, a port or a path: shown, not a finding).
        refused_by_ray: a cluster's nodes that differ in it cannot form one Ray cluster or
            one vLLM (Ray's ``check_version_info``, ray-project/ray
            ``python/ray/_private/utils.py``, refuses a node whose Ray or Python differs;
            vLLM's workers run the head's code): an error there, not a warning.
        per_engine: a choice of the engine: a cluster's nodes run one engine, whose choice
            is the head's (a worker's prediction is not compared with the head's log).
    """

    name: str
    field: str
    warns: bool = True
    refused_by_ray: bool = False
    per_engine: bool = False


FACTS = (
    Fact("GPUs", "gpus"),
    Fact("driver", "driver"),
    Fact("CUDA", "cuda"),
    Fact("vLLM", "vllm", refused_by_ray=True),
    Fact("torch", "torch", refused_by_ray=True),
    Fact("Ray", "ray", refused_by_ray=True),
    Fact("KV cache dtype", "kv_cache_dtype", per_engine=True),
    Fact("attention backend", "attention_backend", per_engine=True),
    Fact("launch script", "script_sha256", warns=False),
)
assert {f.field for f in FACTS} < {f.name for f in fields(HostSide)}


@dataclass(frozen=True)
class Difference:
    """A fact whose values differ between hosts serving one model, each host with its value."""

    model: str
    fact: Fact
    values: tuple[tuple[str, str], ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(host for host, _ in self.values)

    def text(self) -> str:
        each = ", ".join(f"{host} {shown_value(self.fact, value)}" for host, value in self.values)
        return f"hosts differ: {self.fact.name}: {each}"

    def here(self, host: str) -> str:
        """What ``host`` has against the others, for its one-line message: ``vLLM 0.33.0
        (others 0.15.1)``."""
        mine = dict(self.values)[host]
        others = list(dict.fromkeys(v for h, v in self.values if v != mine))
        shown = ", ".join(shown_value(self.fact, v) for v in others)
        return f"{self.fact.name} {shown_value(self.fact, mine)} (others {shown})"

    def finding(self, *, cluster: bool = False) -> Finding:
        """The finding: a warning, an error for what keeps a cluster's nodes apart."""
        refused = cluster and self.fact.refused_by_ray
        if refused:
            remedy = (
                f"install the head's {self.fact.name} on every node (Ray and vLLM refuse "
                "nodes whose versions differ), then launch again"
            )
        else:
            remedy = (
                f"make {self.fact.name} the same on every host serving {self.model} "
                "(or serve them as different models), then run 00_preflight again"
            )
        return Finding(
            "error" if refused else "warning",
            self.fact.name,
            self.text(),
            remedy=remedy,
            code=HOSTS_DIFFER,
        )


@dataclass(frozen=True)
class Comparison:
    """Hosts side by side: each one's facts, and the facts that differ within a model.

    Attributes:
        sides: one per host compared, in the deployment's order.
        differences: the facts that differ (findings only for those whose fact warns).
        cluster: the hosts are the nodes of one cluster (a version difference is an error).
    """

    sides: tuple[HostSide, ...]
    differences: tuple[Difference, ...]
    cluster: bool = False

    @property
    def agree(self) -> bool:
        return not self.warnings()

    def warnings(self) -> list[Difference]:
        """The differences that make findings."""
        return [d for d in self.differences if d.fact.warns]

    def findings_for(self, host: str) -> list[Finding]:
        """The findings of the differences ``host`` takes part in."""
        return [d.finding(cluster=self.cluster) for d in self.warnings() if host in d.hosts]

    def row_finding(self, host: str) -> Finding | None:
        """``host``'s row as an info finding, so that the record (``summary.json``) keeps
        what was compared, when the hosts agree too; None for a host not compared."""
        side = next((s for s in self.sides if s.host == host), None)
        if side is None:
            return None
        peers = sum(1 for s in self.sides if s.model == side.model) - 1
        values = ", ".join(f"{f.name} {shown_value(f, side.value(f))}" for f in FACTS)
        differs = [d.fact.name for d in self.warnings() if host in d.hosts]
        verdict = f"differs in {', '.join(differs)}" if differs else "agrees"
        return Finding(
            "info",
            "hosts side by side",
            f"{values} (engine facts from {side.engine_from or '?'}); {verdict} with the "
            f"{peers} other host(s) serving {side.model}",
            code=SIDE_BY_SIDE,
        )

    def line_for(self, host: str) -> str:
        """The differences ``host`` takes part in, in one line for its result's message
        (empty: none)."""
        mine = [d.here(host) for d in self.warnings() if host in d.hosts]
        return "hosts differ: " + ", ".join(mine) if mine else ""

    def summary(self) -> str:
        """One line: what differs, or that all agree (and on what)."""
        shown = self.warnings()
        if shown:
            return "; ".join(d.text() for d in shown)
        differ = {d.fact.name for d in self.differences}
        same = [f.name for f in FACTS if f.name not in differ]
        line = f"the {len(self.sides)} hosts agree on {', '.join(same)}"
        return line + "".join(f"; {name} differs (not a problem)" for name in sorted(differ))

    def differs(self, host: str, fact: Fact) -> bool:
        return any(host in d.hosts and d.fact == fact for d in self.differences)

    def table(self) -> Table:
        """One row per host, one column per fact (the record's copy: plain values)."""
        columns = ["host", "model", *(f.name for f in FACTS), "engine facts from"]
        rows = [
            [
                s.host,
                s.model,
                *(shown_value(f, s.value(f)) for f in FACTS),
                s.engine_from or "?",
            ]
            for s in self.sides
        ]
        return Table(columns, rows)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.table().columns)
        body = ""
        for side in self.sides:
            cells = [f"<td>{html.escape(side.host)}</td><td>{html.escape(side.model)}</td>"]
            for fact in FACTS:
                text = html.escape(shown_value(fact, side.value(fact)))
                if self.differs(side.host, fact):
                    cells.append(f'<td style="background:{DIFFERS_COLOUR}"><b>{text}</b></td>')
                else:
                    cells.append(f"<td>{text}</td>")
            cells.append(f"<td>{html.escape(side.engine_from or '?')}</td>")
            body += f"<tr>{''.join(cells)}</tr>"
        colour = "#cf222e" if not self.agree else "#1a7f37"
        return (
            f'<p><b>Hosts side by side</b>: <span style="color:{colour}">'
            f"{html.escape(self.summary())}</span></p>"
            f"<table><tr>{head}</tr>{body}</table>"
        )

    def __repr__(self) -> str:
        lines = ["Hosts side by side: " + self.summary()]
        table = self.table()
        marked = [
            [
                *row[:2],
                *(
                    f"*{cell}*" if self.differs(row[0], fact) else cell
                    for fact, cell in zip(FACTS, row[2:], strict=False)
                ),
                row[-1],
            ]
            for row in table.rows
        ]
        lines.append(str(Table(table.columns, marked)))
        return "\n".join(lines)


def compare(sides: Sequence[HostSide], *, cluster: bool = False) -> Comparison:
    """The hosts' facts compared within each model they serve; unknown values aside."""
    differences = []
    models = list(dict.fromkeys(s.model for s in sides))
    for model in models:
        group = [s for s in sides if s.model == model]
        for fact in FACTS:
            if cluster and fact.per_engine:
                continue
            known = [(s.host, s.value(fact)) for s in group if s.value(fact) != UNKNOWN]
            if len({value for _, value in known}) > 1:
                differences.append(Difference(model, fact, _odd_first(known)))
    return Comparison(tuple(sides), tuple(differences), cluster)


def _odd_first(values: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The hosts with the most common value first, then the others: the finding reads
    "host-a X, host-b Y" with the odd one out last. On a tie, the deployment's order."""
    counts = Counter(value for _, value in values)
    order = {value: i for i, (_, value) in enumerate(values)}
    return tuple(sorted(values, key=lambda hv: (-counts[hv[1]], order[hv[1]])))


def shown_value(fact: Fact, value: str) -> str:
    """A value as the table and findings show it (a hash cut to 12 characters)."""
    if value == UNKNOWN:
        return "?"
    return value[:12] if fact.field == "script_sha256" else value


__all__ = [
    "FACTS",
    "HOSTS_DIFFER",
    "SIDE_BY_SIDE",
    "Comparison",
    "Difference",
    "Fact",
    "HostSide",
    "compare",
    "shown_value",
]
