"""The embedding servers the serving scripts (bench_serve_ab.py, bench_serve_hostile.py, serve_stages.py) start."""

import os

from tf_fusedrec.serve import bench


def start_embedding_servers(export, work_dir, services, num=2, timeout_s=120, flags=(), name="server"):
    """Starts `num` embedding servers of `export` on free loopback ports, with `flags` added (logs in
    work_dir/{name}{shard}.log), appending each to `services` as it starts (so the caller stops those started if a
    later one fails); -> "host:port,..."."""
    ports = [bench.free_port() for _ in range(num)]
    for shard, port in enumerate(ports):
        services.append(bench.Service(f"{name} {shard}", "tf_fusedrec.serve.embedding_server",
                                      ["--export", export, "--shard", str(shard), "--num-shards", str(num),
                                       "--port", str(port), *flags], os.path.join(work_dir, f"{name}{shard}.log")))
        services[-1].start(timeout_s)
    return ",".join(f"127.0.0.1:{p}" for p in ports)
