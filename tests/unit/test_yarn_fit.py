"""A YARN job whose containers cannot fit its queue is one line before anything is packed or submitted.

The sizes are Spark's own: the figures below are the ones spark-submit and the ResourceManager printed for
the demo config on the minicluster (executor memory 8192 MB + 819 MB overhead; 1 GB -> <memory:1408,
vCores:4>). The scheduler documents are the two JSON mappings Hadoop's REST API uses; the hadoop tier runs
the check against a real ResourceManager (tests/hadoop/test_hadoop_cluster.py).
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from hvdtrain.core.config import YarnConfig
from hvdtrain.core.errors import ConfigError
from hvdtrain.hadoop import hadoop_conf
from hvdtrain.hadoop import resourcemanager as rm
from yarn import resources

LIMITS = rm.Limits("root.default", 4096, 3, 8192, 6, "http://rm:8088", min_memory_mb=256)


def _queue(name: str, path: str, memory: int = 4096, vcores: int = 3, key: str = "memorySize") -> dict[str, Any]:
    return {"queueName": name, "queuePath": path, "maximumAllocation": {key: memory, "vCores": vcores},
            "maxEffectiveCapacity": {key: 2 * memory, "vCores": 2 * vcores}, "queues": None}


def test_spark_sizes_executors_and_the_application_master_as_spark_does() -> None:
    demo = {r.role: r for r in resources.requests(YarnConfig(), "client", 2)}
    assert (demo["executor"].heap_mb, demo["executor"].overhead_mb, demo["executor"].vcores) == (8192, 819, 4)
    assert demo["application master"].memory_mb == 512 + 384 and demo["application master"].vcores == 1
    small = {r.role: r for r in resources.requests(YarnConfig(executor_memory="1g"), "client", 2)}
    assert (small["executor"].memory_mb, small["executor"].vcores) == (1408, 4)  # the RM's <memory:1408, vCores:4>
    cluster = {r.role: r for r in resources.requests(YarnConfig(driver_memory="4g"), "cluster", 2)}
    assert cluster["application master"].memory_mb == 4096 + 409 and cluster["application master"].memory_key == \
        "yarn.driver_memory"
    custom = YarnConfig(executor_memory="2g", spark_conf={"spark.executor.memoryOverhead": "1g",
                                                          "spark.executor.pyspark.memory": "512m",
                                                          "spark.yarn.am.memory": "1g"})
    sized = {r.role: r for r in resources.requests(custom, "client", 2)}
    assert sized["executor"].memory_mb == 2048 + 1024 + 512 and sized["application master"].memory_mb == 1024 + 384
    factor = YarnConfig(executor_memory="10g", spark_conf={"spark.executor.memoryOverheadFactor": "0.2"})
    assert resources.requests(factor, "client", 1)[0].overhead_mb == 2048
    with pytest.raises(ConfigError, match="yarn.executor_memory must be a memory size"):
        resources.requests(YarnConfig(executor_memory="lots"), "client", 1)


def test_a_container_above_the_queue_s_largest_names_the_setting_the_request_the_limit_and_the_fix() -> None:
    found = resources.misfits(YarnConfig(), resources.requests(YarnConfig(), "client", 2), LIMITS, gang=True)
    assert [e.field for e in found] == ["yarn.executor_memory", "yarn.executor_cores"]
    memory, cores = (str(e) for e in found)
    assert "9,011 MB" in memory and "4,096 MB per container" in memory and "root.default" in memory
    assert "set yarn.executor_memory=3712m or less" in memory and "(got '8g')" in memory
    assert "4 vcores" in cores and "at most 3" in cores and "yarn.executor_cores=3 or fewer" in cores
    # The fix it names fits exactly: 3712 MB + 384 MB overhead = 4096 MB; one MB more does not.
    assert not resources.misfits(YarnConfig(executor_memory="3712m", executor_cores=3),
                                 resources.requests(YarnConfig(executor_memory="3712m", executor_cores=3), "client", 1),
                                 LIMITS, gang=False)
    over = YarnConfig(executor_memory="3713m", executor_cores=3)
    assert [e.field for e in resources.misfits(over, resources.requests(over, "client", 1), LIMITS, False)] == \
        ["yarn.executor_memory"]
    am = YarnConfig(executor_memory="1g", executor_cores=1, spark_conf={"spark.yarn.am.memory": "4g"})
    (error,) = resources.misfits(am, resources.requests(am, "client", 1), LIMITS, False)
    assert error.field == "yarn.spark_conf.spark.yarn.am.memory" and "application master container" in str(error)


def test_a_training_executor_s_container_holds_the_rank_s_process_and_its_fix_fits_exactly() -> None:
    """#56 item 6: spark.executor.memoryOverhead is Spark's rule + yarn.rank_memory for a training job (none for
    an ETL's executors, and none added to an explicit overhead); a rank too big for the queue's containers names
    yarn.rank_memory and the largest that fits beside a 1 GB heap."""
    y = YarnConfig(executor_memory="1g", executor_cores=1, rank_memory="1536m")
    assert resources.executor_overhead(y) == "1920m"
    assert resources.executor_overhead(YarnConfig(executor_memory="10g")) == f"{1024 + 4096}m"
    assert resources.executor_overhead(YarnConfig(spark_conf={"spark.executor.memoryOverhead": "2g"})) is None
    training, etl = (resources.requests(y, "client", 2, ranks=r)[0] for r in (True, False))
    assert (training.memory_mb, training.rank_mb, etl.memory_mb, etl.rank_mb) == (1024 + 384 + 1536, 1536, 1408, 0)
    explicit = YarnConfig(spark_conf={"spark.executor.memoryOverhead": "2g"}, executor_memory="1g")
    assert resources.requests(explicit, "client", 2, ranks=True)[0].memory_mb == 1024 + 2048
    big = YarnConfig(executor_memory="1g", executor_cores=1)  # the default 4 GB for the rank
    (error,) = resources.misfits(big, resources.requests(big, "client", 1, ranks=True), LIMITS, False)
    assert error.field == "yarn.rank_memory" and "(got '4g')" in str(error)
    assert "1,024 MB + 4,480 MB overhead (of it yarn.rank_memory 4,096 MB, for the rank's process) = 5,504 MB" \
        in str(error) and "set yarn.rank_memory=2688m or less with yarn.executor_memory=1024m" in str(error)
    for rank, fits in (("2688m", True), ("2689m", False)):  # the fix it names fits exactly
        y = YarnConfig(executor_memory="1g", executor_cores=1, rank_memory=rank)
        assert (resources.misfits(y, resources.requests(y, "client", 1, ranks=True), LIMITS, False) == []) == fits
    with pytest.raises(ConfigError, match="yarn.rank_memory must be a memory size"):
        resources.requests(YarnConfig(rank_memory="plenty"), "client", 1, ranks=True)


def test_a_ring_that_can_never_start_together_is_refused_and_one_that_can_is_not() -> None:
    """Every rank starts at once: 5 executors of 1408 MB (1536 in 256 MB steps) and the AM (1024) do not fit in
    8192 MB; 4 do. An ETL's executors need not run together."""
    def refused(workers: int, gang: bool = True) -> list[ConfigError]:
        y = YarnConfig(executor_memory="1g", executor_cores=1, num_workers=workers)
        return resources.misfits(y, resources.requests(y, "client", workers), LIMITS, gang)

    (five,) = refused(5)
    assert five.field == "yarn.num_workers" and "8,704 MB" in str(five) and "8,192 MB" in str(five)
    assert refused(4) == [] and refused(5, gang=False) == []


def test_a_ring_the_nodemanagers_cannot_hold_at_once_is_refused_though_the_queue_total_would_hold_it() -> None:
    """The minicluster's case (two NodeManagers of 4,096 MB and 3 vcores, 256 MB steps): in cluster mode the
    driver's application master (1,536 MB) and a rank's executor (1 GB heap + 384 MB + yarn.rank_memory 1,536 MB =
    3,072 MB) never share a node, so the second executor never starts (Spark waited out its 600 s start timeout),
    though 7,680 MB is within the queue's 8,192 MB. A smaller rank, or client mode's smaller master, fits."""
    nodes = rm.Limits("root.default", 4096, 3, 8192, 6, "http://rm:8088", min_memory_mb=256,
                      nodes=((4096, 3), (4096, 3)))

    def refused(mode: str, rank: str, workers: int = 2, cores: int = 1) -> list[ConfigError]:
        y = YarnConfig(executor_memory="1g", executor_cores=cores, rank_memory=rank, num_workers=workers,
                       driver_memory="1g")
        return resources.misfits(y, resources.requests(y, mode, workers, ranks=True), nodes, gang=True)

    (error,) = refused("cluster", "1536m")
    assert error.field == "yarn.num_workers" and "(got 2)" in str(error)
    assert ("need 3,072 MB and 1 vcores each, beside the application master's 1,536 MB and 1 vcores, and the "
            "NodeManagers of the ResourceManager at http://rm:8088 (4,096 MB and 3 vcores, 4,096 MB and 3 vcores) "
            "hold at most 1 of them at once") in str(error)
    assert refused("cluster", "1024m") == []  # 1,536 + 2,560 MB on one node, 2,560 MB on the other
    assert refused("client", "1536m") == []  # the client-mode master is 1,024 MB
    assert refused("client", "1536m", workers=3) != []  # ... but a third executor has no node
    assert [e.field for e in refused("client", "512m", workers=3, cores=2)] == ["yarn.num_workers"]  # vcores too
    assert [str(e) for e in refused("cluster", "1536m", workers=2)] == [str(error)]  # pure
    unknown = rm.Limits("root.default", 4096, 3, 8192, 6, "http://rm:8088", min_memory_mb=256)
    y = YarnConfig(executor_memory="1g", executor_cores=1, rank_memory="1536m", num_workers=2, driver_memory="1g")
    assert resources.misfits(y, resources.requests(y, "cluster", 2, ranks=True), unknown, True) == []  # not read


def test_the_nodemanagers_sizes_come_from_either_json_mapping_leaving_out_labelled_and_lost_nodes() -> None:
    jaxb = {"nodes": [{"state": "RUNNING", "nodeLabels": [], "totalResource": {"memorySize": 4096, "vCores": 3}},
                      {"state": "RUNNING", "nodeLabels": ["gpu"], "totalResource": {"memorySize": 65536, "vCores": 16}},
                      {"state": "LOST", "totalResource": {"memorySize": 8192, "vCores": 8}}]}
    older = {"nodes": {"node": [{"state": "RUNNING", "usedMemoryMB": 1024, "availMemoryMB": 7168,
                                 "usedVirtualCores": 1, "availableVirtualCores": 7},
                                {"state": "RUNNING", "totalResource": {"memory": 4096, "vCores": 3}}]}}
    assert rm.parse_nodes(jaxb) == ((4096, 3),)
    assert rm.parse_nodes(older) == ((8192, 8), (4096, 3))
    assert rm.parse_nodes({"nodes": None}) is None and rm.parse_nodes({"nodes": {"node": []}}) is None


@pytest.mark.parametrize("key", ["memorySize", "memory"])
def test_the_queue_s_limits_come_from_either_json_mapping_and_an_unknown_queue_names_those_there_are(key: str) -> None:
    jaxb = {"schedulerInfo": {"queueName": "root", "queues": {"queueInfoList": [
        _queue("default", "root.default", key=key),
        {"queueName": "ml", "queuePath": "root.ml", "queues": {"queueInfoList": [
            _queue("gpu", "root.ml.gpu", memory=65536, vcores=16, key=key)]}}]}}}
    xml_style = {"scheduler": {"schedulerInfo": {"queueName": "root", "queues": {"queue": [
        _queue("default", "root.default", key=key), _queue("gpu", "root.ml.gpu", 65536, 16, key)]}}}}
    for doc in (jaxb, xml_style):
        assert rm.parse_scheduler(doc, None, "http://rm:8088") == rm.Limits("root.default", 4096, 3, 8192, 6,
                                                                             "http://rm:8088")
        gpu = rm.parse_scheduler(doc, "gpu", "http://rm:8088", min_memory_mb=512)
        assert gpu is not None and (gpu.queue, gpu.max_memory_mb, gpu.min_memory_mb) == ("root.ml.gpu", 65536, 512)
        assert rm.parse_scheduler(doc, "root.ml.gpu", "http://rm:8088") == gpu.__class__(
            "root.ml.gpu", 65536, 16, 131072, 32, "http://rm:8088")
        with pytest.raises(ConfigError, match=r"yarn.queue names no queue .*root.default, root.ml.gpu.*got 'etl'"):
            rm.parse_scheduler(doc, "etl", "http://rm:8088")
    assert rm.parse_scheduler({"scheduler": {"schedulerInfo": {"type": "fifoScheduler"}}}, None, "x") is None


def test_the_web_address_follows_https_only_and_every_resourcemanager_of_an_ha_pair() -> None:
    assert hadoop_conf.resourcemanager_web_urls({"yarn.resourcemanager.webapp.address": "rm:8088"}) == ["http://rm:8088"]
    assert hadoop_conf.resourcemanager_web_urls({"yarn.resourcemanager.hostname": "rm"}) == ["http://rm:8088"]
    assert hadoop_conf.resourcemanager_web_urls({"yarn.http.policy": "HTTPS_ONLY",
                                                 "yarn.resourcemanager.hostname": "rm"}) == ["https://rm:8090"]
    ha = {"yarn.resourcemanager.ha.enabled": "true", "yarn.resourcemanager.ha.rm-ids": "rm1, rm2",
          "yarn.resourcemanager.webapp.address.rm1": "a:8088", "yarn.resourcemanager.hostname.rm2": "b"}
    assert hadoop_conf.resourcemanager_web_urls(ha) == ["http://a:8088", "http://b:8088"]
    assert hadoop_conf.resourcemanager_web_urls({}) == []


def test_the_first_resourcemanager_that_answers_is_read_and_none_answering_is_a_reason() -> None:
    doc = {"schedulerInfo": {"queues": {"queueInfoList": [_queue("default", "root.default")]}}}
    asked = []

    def fetch(url: str) -> Any:
        asked.append(url)
        if url.startswith("http://a"):
            raise OSError("connection refused")
        return json.loads(json.dumps(doc))

    props = {"yarn.resourcemanager.ha.enabled": "true", "yarn.resourcemanager.ha.rm-ids": "rm1,rm2",
             "yarn.resourcemanager.webapp.address.rm1": "a:8088", "yarn.resourcemanager.webapp.address.rm2": "b:8088",
             "yarn.scheduler.minimum-allocation-mb": "512"}
    limits, why = rm.read_limits(props, None, fetch)
    assert limits is not None and limits.source == "http://b:8088" and limits.min_memory_mb == 512 and why == ""
    assert asked == ["http://a:8088/ws/v1/cluster/scheduler", "http://b:8088/ws/v1/cluster/scheduler",
                     "http://b:8088/ws/v1/cluster/nodes?states=RUNNING"]  # ... and the nodes, from the one that answered
    assert limits.nodes is None  # that answer named no node: only the queue's total is checked
    none, why = rm.read_limits({"yarn.resourcemanager.webapp.address": "a:8088"}, None, fetch)
    assert none is None and "connection refused" in why


def test_the_submission_checks_before_packing_and_notes_limits_it_cannot_read(tmp_path, capsys) -> None:
    from hvdtrain.core import config as config_mod
    from yarn import submit

    (tmp_path / "yarn-site.xml").write_text(
        "<configuration><property><name>yarn.resourcemanager.webapp.address</name><value>rm:8088</value>"
        "</property></configuration>")
    cfg = config_mod.JobConfig()
    with pytest.raises(ConfigError, match="yarn.executor_memory does not fit"):
        submit.check_fits(cfg, "yarn", "etl", str(tmp_path), read=lambda props, queue: (LIMITS, ""))
    submit.check_fits(cfg, "yarn", "etl", str(tmp_path), read=lambda props, queue: (None, "HTTP 401"))
    assert "could not read the queue's limits (HTTP 401); YARN checks the request itself" in capsys.readouterr().err
    # the reason names the URL it tried: a password in it is masked
    submit.check_fits(cfg, "yarn", "etl", str(tmp_path),
                      read=lambda props, queue: (None, "https://ops:Pl4nted-S3cret@rm:8090/ws/v1/cluster/scheduler: 401"))
    assert "Pl4nted-S3cret" not in capsys.readouterr().err
    # a training job's executors also hold the rank's process: 1 GB + 384 MB + the default 4 GB cannot fit 4 GB
    with pytest.raises(ConfigError, match="yarn.rank_memory does not fit"):
        submit.check_fits(config_mod.JobConfig(yarn=YarnConfig(executor_memory="1g", executor_cores=1)), "yarn",
                          "submit", str(tmp_path), read=lambda props, queue: (LIMITS, ""))
    small = config_mod.JobConfig(yarn=YarnConfig(executor_memory="1g", executor_cores=1, num_workers=5,
                                                 rank_memory="1536m"))
    with pytest.raises(ConfigError, match="yarn.num_workers can never run at once"):
        submit.check_fits(small, "yarn", "submit", str(tmp_path), read=lambda props, queue: (LIMITS, ""))
    submit.check_fits(small, "yarn", "etl", str(tmp_path), read=lambda props, queue: (LIMITS, ""))  # no ring
