"""Reading a Hadoop client configuration (``HADOOP_CONF_DIR``): which WebHDFS address serves an ``hdfs://`` URI,
where the ResourceManager listens.

Python reaches HDFS through WebHDFS (the ``hdfs`` package) unless this host has
libhdfs (pyarrow's ``hdfs://``; it ships only in Hadoop's binary release, in no
package registry). So that one ``hdfs://namenode:8020/path`` works from Spark
(the JVM's own client) and from Python alike, :func:`webhdfs_urls` maps the
NameNode's RPC address to its HTTP(S) address as ``hdfs-site.xml`` declares them (every NameNode of an
HA nameservice).
Pure functions over the parsed properties, plus :func:`load` to read the files.
"""
from __future__ import annotations

import os
import xml.etree.ElementInclude as ElementInclude
import xml.etree.ElementTree as ElementTree
from typing import Any, Mapping, Optional

SITE_FILES = ("core-site.xml", "hdfs-site.xml", "yarn-site.xml")
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
DEFAULT_RPC_PORT = 8020


def parse_site(text: str, base_dir: Optional[str] = None) -> dict[str, str]:
    """name -> value of a Hadoop ``*-site.xml`` (pure but for its XIncludes): with ``base_dir``, the files it
    includes (``<xi:include href="mountTable.xml"/>``, as clusters keep their ViewFs mount table) are read from
    there, as Hadoop's Configuration reads them."""
    root = ElementTree.fromstring(text)
    if base_dir is not None:
        def loader(href: str, parse: Any, encoding: Optional[str] = None) -> Any:
            return ElementInclude.default_loader(os.path.join(base_dir, href), parse, encoding)

        ElementInclude.include(root, loader=loader)  # type: ignore[arg-type]  # typeshed: overloads
    out = {}
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name and value is not None:
            out[name.strip()] = value.strip()
    return out


def load(conf_dir: Optional[str] = None) -> dict[str, str]:
    """The properties of ``core-site.xml`` and ``hdfs-site.xml`` in ``conf_dir`` (default $HADOOP_CONF_DIR);
    empty when there is none."""
    conf_dir = conf_dir or os.environ.get("HADOOP_CONF_DIR")
    props: dict[str, str] = {}
    for name in SITE_FILES if conf_dir else ():
        path = os.path.join(conf_dir or "", name)
        if os.path.isfile(path):
            with open(path) as fh:
                props.update(parse_site(fh.read(), base_dir=conf_dir))
    return props


def _same_host(a: str, b: str) -> bool:
    return a.lower() == b.lower() or (a.lower() in LOOPBACK_NAMES and b.lower() in LOOPBACK_NAMES)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else (address, DEFAULT_RPC_PORT)


def webhdfs_urls(netloc: str, props: Mapping[str, str]) -> list[str]:
    """The WebHDFS base URLs (``http(s)://host:port``) for the NameNode ``netloc`` of an ``hdfs://`` URI (pure).

    An empty netloc means ``fs.defaultFS``. A nameservice id (HA) maps to every one of its NameNodes in
    ``dfs.ha.namenodes.<id>`` order: the WebHDFS client tries the next one when one is the standby
    (StandbyException) or down, as Hadoop's own failover proxy does. ``dfs.http.policy=HTTPS_ONLY`` gives the
    ``https-address`` of each (the delegation token then never travels in clear). [] when the configuration
    does not name that NameNode."""
    https = props.get("dfs.http.policy", "HTTP_ONLY").upper() == "HTTPS_ONLY"
    web_key, scheme = ("https-address", "https") if https else ("http-address", "http")
    if not netloc:
        default = props.get("fs.defaultFS", "")
        if not default.startswith("hdfs://"):
            return []
        netloc = default[len("hdfs://"):].split("/", 1)[0]
    namenodes = props.get(f"dfs.ha.namenodes.{netloc}")
    if namenodes:
        found = (props.get(f"dfs.namenode.{web_key}.{netloc}.{nn.strip()}") for nn in namenodes.split(","))
        return [f"{scheme}://{address}" for address in found if address]
    host, port = _split(netloc)
    for key, value in props.items():
        if not key.startswith("dfs.namenode.rpc-address"):
            continue
        rpc_host, rpc_port = _split(value)
        if _same_host(rpc_host, host) and rpc_port == port:
            address = props.get(key.replace("rpc-address", web_key, 1))
            return [f"{scheme}://{address}"] if address else []
    return []


VIEWFS_PREFIX = "fs.viewfs.mounttable."


def viewfs_table(netloc: str, props: Mapping[str, str]) -> str:
    """The mount table a ``viewfs://`` URI names (pure): its authority, else ``fs.defaultFS``'s when that is a
    viewfs URI, else Hadoop's ``default``."""
    if netloc:
        return netloc
    default = props.get("fs.defaultFS", "")
    if default.startswith("viewfs://"):
        return default[len("viewfs://"):].split("/", 1)[0] or "default"
    return props.get("fs.viewfs.mounttable.default.name.key", "default")


def viewfs_links(table: str, props: Mapping[str, str]) -> dict[str, str]:
    """mount point -> target URI of a ViewFs mount table (``fs.viewfs.mounttable.<table>.link.<path>``) (pure)."""
    prefix = f"{VIEWFS_PREFIX}{table}.link."
    return {"/" + key[len(prefix):].strip("/"): value.rstrip("/") for key, value in props.items()
            if key.startswith(prefix)}


def viewfs_target(netloc: str, path: str, props: Mapping[str, str]) -> Optional[str]:
    """The URI a ``viewfs://netloc/path`` names, as Hadoop's ViewFileSystem resolves it (pure): the longest mount
    point that holds ``path`` (its ``link.<mount point>``), else the table's ``linkMergeSlash`` (the whole namespace)
    or ``linkFallback`` (what no link covers), the rest of the path appended; None when none applies."""
    table = viewfs_table(netloc, props)
    links = viewfs_links(table, props)
    path = "/" + path.strip("/")
    best = max((m for m in links if path == m or path.startswith(m.rstrip("/") + "/")), key=len, default=None)
    if best is not None:
        return links[best] + (path[len(best):] if best != "/" else path)
    for key in ("linkMergeSlash", "linkFallback"):
        base = props.get(f"{VIEWFS_PREFIX}{table}.{key}")
        if base:
            return base.rstrip("/") + path
    return None


def resourcemanager_address(props: Mapping[str, str]) -> Optional[str]:
    """``host:port`` clients submit to (pure); None for an HA pair (its client fails over) or no yarn-site."""
    if props.get("yarn.resourcemanager.ha.enabled", "false").lower() == "true":
        return None
    address = props.get("yarn.resourcemanager.address")
    if address is None and "yarn.resourcemanager.hostname" in props:
        address = f"{props['yarn.resourcemanager.hostname']}:8032"
    return address


def resourcemanager_web_urls(props: Mapping[str, str]) -> list[str]:
    """The ResourceManager's web-service base URLs (pure): ``http(s)://host:port``, one per ResourceManager of
    an HA pair (the standby redirects to the active one), honouring ``yarn.http.policy=HTTPS_ONLY``; [] with
    no yarn-site."""
    https = props.get("yarn.http.policy", "HTTP_ONLY").upper() == "HTTPS_ONLY"
    key, port = ("yarn.resourcemanager.webapp.https.address", 8090) if https else \
        ("yarn.resourcemanager.webapp.address", 8088)
    ids = [""]
    if props.get("yarn.resourcemanager.ha.enabled", "false").lower() == "true":
        ids = [f".{rm.strip()}" for rm in props.get("yarn.resourcemanager.ha.rm-ids", "").split(",") if rm.strip()]
    out = []
    for rm in ids:
        address = props.get(f"{key}{rm}")
        if address is None and f"yarn.resourcemanager.hostname{rm}" in props:
            address = f"{props[f'yarn.resourcemanager.hostname{rm}']}:{port}"
        if address:
            out.append(f"{'https' if https else 'http'}://{address}")
    return out
