"""The ResourceManager's limits, read from its REST API before a job is submitted.

A YARN submission whose containers cannot fit fails late and in Java: spark-submit's client refuses executor
memory above the cluster's largest container with a stack trace, and a request above the largest container's
vcores is accepted and then FAILED by the ResourceManager. :func:`read_limits` reads, for the job's queue, the
largest container the queue grants (``maximumAllocation``: YARN's ``yarn.scheduler.maximum-allocation-*``
capped by the largest NodeManager) and everything the queue can hold at once (``maxEffectiveCapacity``), from
``GET /ws/v1/cluster/scheduler`` (the Capacity Scheduler, YARN's default), and the size of every running
NodeManager (``GET /ws/v1/cluster/nodes``: a job whose containers must all run at once has to be packed onto
them, not only into the queue's total); :func:`parse_scheduler` and :func:`parse_nodes` are the pure part. A
queue that does not exist is one line naming the queues that do.

Read-only and best effort: when the web services do not answer (SPNEGO without a ticket, a firewall), the
caller goes on and YARN checks the request itself.
"""
from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop import hadoop_conf

SCHEDULER_PATH = "/ws/v1/cluster/scheduler"
NODES_PATH = "/ws/v1/cluster/nodes?states=RUNNING"
TIMEOUT = 10.0
DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class Limits:
    """What one queue grants: its largest container and, when the scheduler says, all it holds at once."""

    queue: str  # the queue's path, e.g. root.default
    max_memory_mb: int
    max_vcores: int
    queue_memory_mb: Optional[int]  # the queue's maximum capacity (None: not reported)
    queue_vcores: Optional[int]
    source: str  # the ResourceManager's URL the figures come from
    min_memory_mb: int = 1024  # every container is rounded up to a multiple of this (YARN's default 1024)
    # (memory MB, vcores) of every running NodeManager of the default partition (no node label); None: not read
    nodes: Optional[tuple[tuple[int, int], ...]] = None


def _resource(doc: Any) -> Optional[tuple[int, int]]:
    """(memory MB, vcores) of a ResourceInfo, whichever JSON mapping the ResourceManager used."""
    if not isinstance(doc, Mapping):
        return None
    memory = doc.get("memorySize", doc.get("memory"))
    vcores = doc.get("vCores", doc.get("virtualCores"))
    if not isinstance(memory, (int, float)) or not isinstance(vcores, (int, float)) or memory <= 0 or vcores <= 0:
        return None
    return int(memory), int(vcores)


def _children(queue: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    queues = queue.get("queues")
    if not isinstance(queues, Mapping):
        return []
    children = queues.get("queue") or queues.get("queueInfoList") or []  # the XML-style and the JAXB mapping
    return [children] if isinstance(children, Mapping) else list(children)


def _leaves(queue: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    children = _children(queue)
    return [queue] if not children else [leaf for child in children for leaf in _leaves(child)]


def parse_scheduler(doc: Mapping[str, Any], queue: Optional[str], source: str,
                    min_memory_mb: int = 1024) -> Optional[Limits]:
    """The limits of ``queue`` (a leaf name or path; None: ``default``) in a ``/ws/v1/cluster/scheduler``
    answer (pure). None when the scheduler reports no container limits (not the Capacity Scheduler).

    Raises ConfigError when the Capacity Scheduler has no such leaf queue."""
    info = (doc.get("scheduler") or doc).get("schedulerInfo")
    if not isinstance(info, Mapping) or "queues" not in info:
        return None
    wanted = queue or DEFAULT_QUEUE
    leaves = _leaves(info)
    found = [leaf for leaf in leaves if wanted in (leaf.get("queueName"), leaf.get("queuePath"))]
    if not found:
        names = ", ".join(sorted(str(leaf.get("queuePath") or leaf.get("queueName")) for leaf in leaves))
        raise ConfigError("yarn.queue", wanted, f"names no queue of the ResourceManager at {source} (its queues: "
                                                f"{names}); pass --queue with one of them")
    leaf = found[0]
    largest = _resource(leaf.get("maximumAllocation")) or _resource(info.get("maximumAllocation"))
    if largest is None:
        return None
    capacity = _resource(leaf.get("maxEffectiveCapacity"))
    smallest = _resource(info.get("minAllocation"))
    return Limits(str(leaf.get("queuePath") or leaf.get("queueName")), largest[0], largest[1],
                  capacity[0] if capacity else None, capacity[1] if capacity else None, source,
                  smallest[0] if smallest else min_memory_mb)


def parse_nodes(doc: Mapping[str, Any]) -> Optional[tuple[tuple[int, int], ...]]:
    """(memory MB, vcores) of each running, unlabelled NodeManager in a ``/ws/v1/cluster/nodes`` answer (pure),
    largest first; None when the answer names none (a labelled partition only, or an unexpected shape)."""
    nodes = (doc.get("nodes") or {}) if isinstance(doc, Mapping) else {}
    listed = nodes.get("node") if isinstance(nodes, Mapping) else nodes
    listed = [listed] if isinstance(listed, Mapping) else list(listed or [])
    out = []
    for node in listed:
        if not isinstance(node, Mapping) or node.get("state", "RUNNING") != "RUNNING" or node.get("nodeLabels"):
            continue
        total = _resource(node.get("totalResource"))
        if total is None and isinstance(node.get("usedMemoryMB"), (int, float)):  # the older fields
            total = _resource({"memory": node["usedMemoryMB"] + node.get("availMemoryMB", 0),
                               "vCores": node.get("usedVirtualCores", 0) + node.get("availableVirtualCores", 0)})
        if total is not None:
            out.append(total)
    return tuple(sorted(out, reverse=True)) or None


def fetch_json(url: str) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310 (the cluster's own URL)
        return json.loads(response.read().decode("utf-8"))


def read_limits(props: Mapping[str, str], queue: Optional[str],
                fetch: Callable[[str], Any] = fetch_json) -> tuple[Optional[Limits], str]:
    """(limits, why not): the queue's limits from the first ResourceManager that answers, or (None, the reason
    no limits were read). Raises ConfigError for a queue the scheduler does not have."""
    urls = hadoop_conf.resourcemanager_web_urls(props)
    if not urls:
        return None, "the client configs name no ResourceManager web address (yarn.resourcemanager.webapp.address)"
    problems = []
    for base in urls:
        try:
            doc = fetch(base + SCHEDULER_PATH)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            problems.append(f"{base}{SCHEDULER_PATH}: {getattr(exc, 'reason', None) or exc}")
            continue
        # The JAXB mapping leaves minAllocation out: the client's yarn-site mirrors the cluster's.
        limits = parse_scheduler(doc, queue, base, int(props.get("yarn.scheduler.minimum-allocation-mb", 1024)))
        if limits is None:
            return None, f"{base} reports no per-queue container limits"
        try:  # best effort, as the rest: without the nodes, only the queue's total is checked
            limits = dataclasses.replace(limits, nodes=parse_nodes(fetch(base + NODES_PATH)))
        except (OSError, ValueError, urllib.error.URLError):
            pass
        return limits, ""
    return None, "; ".join(problems)
