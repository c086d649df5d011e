"""Runs under horovodrun: times hvd.allreduce; rank 0 prints one JSON line.

    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.allreduce_worker sweep [TF0,TF1,TCP] [--quick]
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.allreduce_worker fusion [--quick]

``sweep`` with ports first times, between the same 2 processes and interleaved (Horovod, TF,
TCP, Horovod, ...), a 64 MB Horovod all-reduce, TensorFlow's ring collective
all-reduce of the same tensor (MultiWorkerMirroredStrategy with
``CommunicationImplementation.RING``, on ports TF0/TF1), and loopback TCP with
two concurrent streams, one each way, of the same bytes (rank 0 listens on TCP);
then Horovod's bus bandwidth over tensor sizes.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import numpy as np

from benchmarks.common import interleaved, median_time


def _tf_ring_strategy(ports: list[int]):
    """MWMS over 2 local workers with ring collectives; must exist before TensorFlow's context starts."""
    import tensorflow as tf

    rank = int(os.environ["HOROVOD_RANK"])
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def _tcp_pair(rank: int, port: int) -> socket.socket:
    """One loopback TCP connection between rank 0 (listening) and rank 1."""
    if rank == 0:
        with socket.create_server(("127.0.0.1", port)) as server:
            conn, _ = server.accept()
            return conn
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:  # rank 0 not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _exchange(conn: socket.socket, out: memoryview, into: memoryview) -> None:
    """Send ``out`` while receiving as many bytes into ``into``: one stream each way, concurrently."""
    sender = threading.Thread(target=conn.sendall, args=(out,))
    sender.start()
    got = 0
    while got < len(into):
        got += conn.recv_into(into[got:])
    sender.join()


def peers(ports: list[int], quick: bool) -> dict:
    import tensorflow as tf

    strategy = _tf_ring_strategy(ports[:2])  # before horovod's import, which starts TensorFlow's context
    import horovod.tensorflow as hvd

    hvd.init()
    nbytes = (8 if quick else 64) << 20
    x = tf.constant(np.ones(nbytes // 4, dtype=np.float32))
    barrier = tf.constant([0.0])

    device = strategy.extended.worker_devices[0]

    def replica_sum(v):
        with tf.device(device):  # inside tf.function a tensor has no device, and MWMS reduces to the value's
            v = tf.identity(v)
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)

    @tf.function
    def ring(t):
        return strategy.run(replica_sum, args=(t,))

    conn = _tcp_pair(hvd.rank(), ports[2])
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out_buf, in_buf = memoryview(np.ones(nbytes, np.uint8)), memoryview(np.empty(nbytes, np.uint8))

    times = interleaved({
        "horovod": lambda: hvd.allreduce(x, op=hvd.Sum, name="ar64").numpy(),
        "tf_ring": lambda: strategy.experimental_local_results(ring(x))[0].numpy(),
        "tcp": lambda: _exchange(conn, out_buf, in_buf),
    }, reps=3 if quick else 7, before=lambda: hvd.allreduce(barrier, name="barrier").numpy())  # ranks start together
    conn.close()
    size = hvd.size()
    # Both all-reduces really summed over the 2 ranks (a ring that silently reduced nothing would be fast).
    for name, got in (("horovod", hvd.allreduce(x[:4], op=hvd.Sum, name="check")),
                      ("tf_ring", strategy.experimental_local_results(ring(x[:4]))[0])):
        if not np.allclose(got.numpy(), size):
            raise RuntimeError(f"{name} all-reduce of ones over {size} ranks gave {got.numpy()}")
    # NCCL-tests bus bandwidth: bytes / seconds * 2(n-1)/n. The TCP pair moves the same bytes each way at once,
    # which is what a 2-rank ring all-reduce puts on each direction of its one link, so its figure is bytes / s.
    busbw = {k: [nbytes / t / 1e9 * (2 * (size - 1) / size if k != "tcp" else 1.0) for t in v]
             for k, v in times.items()}
    return {"size": size, "rank": hvd.rank(), "bytes": nbytes, "busbw_gbps": busbw}


def sweep(hvd, quick: bool) -> list[dict]:
    """Horovod all-reduce bus bandwidth from 4 KB to 4 MB (quick) or 256 MB."""
    import tensorflow as tf

    points = []
    top = 22 if quick else 28
    for log2 in range(12, top + 1, 2):
        n = (1 << log2) // 4
        x = tf.constant(np.ones(n, dtype=np.float32))
        sec = median_time(lambda: hvd.allreduce(x, op=hvd.Sum, name=f"ar{log2}").numpy(), 5)
        algbw = n * 4 / sec / 1e9
        # NCCL-tests bus bandwidth: algbw * 2(n-1)/n (equal to algbw for 2 ranks).
        points.append({"bytes": n * 4, "seconds": sec, "algbw_gbps": algbw,
                       "busbw_gbps": algbw * 2 * (hvd.size() - 1) / hvd.size()})
    return points


def main() -> None:
    mode, quick = sys.argv[1], "--quick" in sys.argv
    ports = [a for a in sys.argv[2:] if a != "--quick"]
    if mode == "sweep" and ports:  # one launch for the peers and the sweep: each horovodrun costs ~10-20 s here
        out = peers([int(p) for p in ports[0].split(",")], quick)
        import horovod.tensorflow as hvd

        out["sweep"] = sweep(hvd, quick)
        if out["rank"] == 0:
            print("BENCH " + json.dumps(out), flush=True)
        return
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    if mode == "sweep":  # the sweep alone (bench_scale fits its link model to it)
        out = {"size": hvd.size(), "sweep": sweep(hvd, quick)}  # every rank takes part
        if hvd.rank() == 0:
            print("BENCH " + json.dumps(out), flush=True)
        return
    xs = [tf.constant(np.full(1024, float(i), dtype=np.float32)) for i in range(200)]  # 200 x 4 KB

    @tf.function
    def many() -> list:
        return [hvd.allreduce(x, op=hvd.Sum, name=f"small{i}") for i, x in enumerate(xs)]

    out = {"size": hvd.size(), "fusion_seconds": median_time(lambda: [t.numpy() for t in many()], 5)}
    if hvd.rank() == 0:
        print("BENCH " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
