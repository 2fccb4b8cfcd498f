"""A cluster of network hosts on one machine: Horovod workers in network namespaces joined by shaped links.

    with Cluster(hosts=2, link_rate="1gbit") as cluster:
        status = cluster.run(["python", "-m", "tf_fusedrec.bench"])

Layout of one run (every name carries the run id `frc-<pid>-<tag>`, so concurrent runs never collide and the
leftovers of a crashed run are recognisable):

    namespace frc-...-sw   ("switch"): bridge br0 10.213.0.254/24, one port p<i> per host, the rendezvous server
    namespace frc-...-h<i> ("host<i>"): lo, host<i>-eth0 10.213.0.<i+1>/24, the veth peer of p<i>;
                           /etc/netns/frc-...-h<i>/hosts, the /etc/hosts its workers see, names every host

The root namespace gets no device and no address: the veth pairs are created directly inside the namespaces, and
the Gloo rendezvous server's socket is bound inside the switch namespace (the launching thread enters it with
setns(2) for the bind only). The addresses are private to these namespaces, so they cannot clash with the
machine's own.

A link's rate is set with a token bucket (`tc qdisc ... tbf`) on both of its ends: the host's egress (upload) and
the switch port's egress towards the host (download), so each host has a full-duplex link of the given rate.
Traffic between workers of one host stays on that host's loopback and is not shaped, as on a real machine.

Workers are started the way `horovodrun --gloo` starts them (horovod/runner/gloo_run.py): horovod's own
RendezvousServer, initialised with horovod's host assignment plan, and per worker the variables gloo_run sets
(HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER=gloo, HOROVOD_CPU_OPERATIONS=gloo, HOROVOD_GLOO_IFACE and
HOROVOD_HOSTNAME/RANK/SIZE/LOCAL_*/CROSS_*), with no ssh: `ip netns exec <host ns> unshare --uts`, then
`hostname host<i>`, then the command. Each worker thus has its host's network and a UTS namespace whose hostname is
its host's name. With cores_per_worker K, worker r is pinned (sched_setaffinity, inherited by everything it runs)
to CPUs rK .. rK+K-1 of those this process may use, so that each worker has cores of its own as on separate
machines. Each worker is its own process group; if one exits with a nonzero status the others are stopped.
Teardown kills every process left in the namespaces and deletes the namespaces, which deletes the veths and the
bridge with them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time

PREFIX = "frc-"
SUBNET = "10.213.0"  # /24, inside this cluster's namespaces only
SWITCH_ADDRESS = f"{SUBNET}.254"
MAX_HOSTS = 250
CLONE_NEWNET = 0x40000000
ETC_NETNS = "/etc/netns"  # `ip netns exec NS` bind-mounts the files of /etc/netns/NS over /etc
REQUIRED_TOOLS = ("ip", "tc", "unshare", "hostname")
# Set by horovodrun for its workers; never inherited from the launching environment.
WORKER_ENV = ("FUSEDREC_CLUSTER_LINK_RATE", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
              "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
              "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_IFACE",
              "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "NCCL_SOCKET_IFNAME", "OMPI_COMM_WORLD_RANK",
              "OMPI_COMM_WORLD_SIZE", "PMI_RANK")


class ClusterError(RuntimeError):
    """The cluster could not be built or used; the message says why and what to do."""


class WorkerFailed(ClusterError):
    """A worker exited with a nonzero status (the others were stopped)."""

    def __init__(self, rank, host, returncode):
        self.rank, self.host, self.returncode = rank, host, returncode
        how = f"was killed by {signal.Signals(-returncode).name}" if returncode < 0 else \
            f"exited with status {returncode}"
        super().__init__(f"rank {rank} (on {host}) {how}; the other workers were stopped")

    @property
    def exit_status(self):
        """The status a shell reports for the failure: the worker's, or 128 + signal number."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


# ----------------------------------------------------------------------------------------------------------------
# Checks and small parsers
# ----------------------------------------------------------------------------------------------------------------

def check_can_build(euid=None, which=shutil.which):
    """Raises ClusterError unless this process is root and ip, tc, unshare and hostname are on the PATH."""
    euid = os.geteuid() if euid is None else euid
    if euid != 0:
        raise ClusterError("tf_fusedrec.cluster needs root (network namespaces, veth pairs and tc qdiscs): "
                           f"run it as root or with sudo (effective uid is {euid})")
    missing = [tool for tool in REQUIRED_TOOLS if which(tool) is None]
    if missing:
        raise ClusterError(f"tf_fusedrec.cluster needs {', '.join(missing)} on the PATH: install iproute2 (ip, tc) "
                           "and util-linux / hostname (apt-get install iproute2 util-linux hostname)")


_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]?)(bit|bps)\s*$", re.IGNORECASE)


def parse_rate(text):
    """'1gbit', '100mbit', '10Gbit', '500kbit', '125mbps' (bytes/s, tc's spelling) -> bits per second (int)."""
    m = _RATE.match(str(text))
    if not m:
        raise ValueError(f"link rate {text!r}: expected a number and a unit, e.g. 1gbit, 100mbit, 10gbit")
    value = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    bits = int(value * (8 if m.group(3).lower() == "bps" else 1))
    if bits <= 0:
        raise ValueError(f"link rate {text!r} must be positive")
    return bits


def format_rate(bits_per_s):
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale and bits_per_s % scale == 0:
            return f"{int(bits_per_s // scale)}{unit}"
    return f"{bits_per_s}bit"


def _run(cmd, check=True):
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def list_namespaces():
    """Names of all network namespaces `ip netns` knows."""
    out = _run(["ip", "netns", "list"]).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _namespace_pids(ns):
    out = _run(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _delete_namespace(ns):
    """Kills every process in namespace ns, then deletes it (its devices go with it) and its /etc/netns files."""
    for _ in range(50):
        pids = [p for p in _namespace_pids(ns) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    _run(["ip", "netns", "delete", ns], check=False)
    shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale():
    """Deletes the namespaces (and so devices and processes) of runs whose launching process is gone. Returns them."""
    stale = []
    names = set(list_namespaces())
    if os.path.isdir(ETC_NETNS):
        names |= set(os.listdir(ETC_NETNS))
    for ns in sorted(names):
        m = re.match(rf"^{PREFIX}(\d+)-[0-9a-f]+-", ns)
        if m and not _pid_alive(int(m.group(1))):
            _delete_namespace(ns)
            stale.append(ns)
    return stale


class _InNamespace:
    """Runs the body with the calling thread inside network namespace `ns` (setns(2)), then goes back.

    Sockets created inside stay in that namespace after the thread leaves it: this is how the rendezvous server's
    socket lives in the switch namespace while the server runs in this process."""

    def __init__(self, ns):
        self.ns = ns

    def __enter__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self._setns = libc.setns
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
        try:
            if self._setns(target, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                os.close(self._home)
                raise ClusterError(f"setns into {self.ns} failed: {os.strerror(err)}")
        finally:
            os.close(target)
        return self

    def __exit__(self, *exc):
        try:
            if self._setns(self._home, CLONE_NEWNET) != 0:
                raise ClusterError(f"could not return from namespace {self.ns}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(self._home)


# ----------------------------------------------------------------------------------------------------------------
# The cluster
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Host:
    index: int
    name: str  # hostname its workers see, and HOROVOD_HOSTNAME
    netns: str
    iface: str  # HOROVOD_GLOO_IFACE
    address: str
    switch_port: str


class Cluster:
    """N hosts (network namespaces) on one bridge, each link shaped to `link_rate` (None: unshaped).

    Use as a context manager (or call up() and down()); run() starts the workers and waits for them."""

    def __init__(self, hosts=2, link_rate="1gbit", workers_per_host=1, verbose=False, cores_per_worker=None):
        if not 1 <= int(hosts) <= MAX_HOSTS:
            raise ValueError(f"hosts must be in 1..{MAX_HOSTS}, got {hosts}")
        if int(workers_per_host) < 1:
            raise ValueError(f"workers_per_host must be at least 1, got {workers_per_host}")
        self.num_hosts = int(hosts)
        self.workers_per_host = int(workers_per_host)
        self.worker_cores = pin_plan(self.size, cores_per_worker)
        self.rate_bits = parse_rate(link_rate) if link_rate else None
        self.verbose = verbose
        self.run_id = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.switch_ns = f"{self.run_id}-sw"
        self.hosts = [Host(i, f"host{i}", f"{self.run_id}-h{i}", f"host{i}-eth0", f"{SUBNET}.{i + 1}", f"p{i}")
                      for i in range(self.num_hosts)]
        self._created = []
        self._rendezvous = None
        self._procs = []

    @property
    def size(self):
        return self.num_hosts * self.workers_per_host

    @property
    def namespaces(self):
        return [self.switch_ns] + [h.netns for h in self.hosts]

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()

    def _log(self, msg):
        if self.verbose:
            print(f"[cluster] {msg}", file=sys.stderr, flush=True)

    # -- building ----------------------------------------------------------------------------------------------

    def up(self):
        check_can_build()
        cleanup_stale()
        try:
            self._add_namespace(self.switch_ns)
            sw = ["ip", "-n", self.switch_ns]
            _run(sw + ["link", "set", "lo", "up"])
            _run(sw + ["link", "add", "br0", "type", "bridge"])
            _run(sw + ["link", "set", "br0", "addrgenmode", "none"])
            _run(sw + ["addr", "add", f"{SWITCH_ADDRESS}/24", "dev", "br0"])
            _run(sw + ["link", "set", "br0", "up"])
            for h in self.hosts:
                self._add_host(h)
            self._start_rendezvous()
        except BaseException:
            self.down()
            raise
        self._log(f"up: {self.num_hosts} hosts x {self.workers_per_host} workers, links "
                  f"{format_rate(self.rate_bits) if self.rate_bits else 'unshaped'}, namespaces {self.run_id}-*")
        return self

    def _add_namespace(self, ns):
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)

    def _add_host(self, h):
        self._add_namespace(h.netns)
        self._write_hosts_file(h)
        # Both ends are created inside their namespaces: nothing ever appears in the root namespace.
        _run(["ip", "link", "add", h.iface, "netns", h.netns, "type", "veth", "peer", "name", h.switch_port,
              "netns", self.switch_ns])
        sw, host = ["ip", "-n", self.switch_ns], ["ip", "-n", h.netns]
        # No IPv6 link-local address: Gloo takes the first address of HOROVOD_GLOO_IFACE, which must be IPv4.
        for cmd, dev in ((sw, h.switch_port), (host, h.iface)):
            _run(cmd + ["link", "set", dev, "addrgenmode", "none"])
        _run(sw + ["link", "set", h.switch_port, "master", "br0"])
        _run(sw + ["link", "set", h.switch_port, "up"])
        _run(host + ["link", "set", "lo", "up"])
        _run(host + ["addr", "add", f"{h.address}/24", "dev", h.iface])
        _run(host + ["link", "set", h.iface, "up"])
        if self.rate_bits:
            for ns, dev in ((h.netns, h.iface), (self.switch_ns, h.switch_port)):
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf"] + tbf_parameters(self.rate_bits))

    def _write_hosts_file(self, h):
        """/etc/hosts of host h names every host, as DNS would on a real cluster: Horovod's process-set contexts
        find their address by resolving the hostname (they do not get HOROVOD_GLOO_IFACE)."""
        lines = ["127.0.0.1\tlocalhost"] + [f"{o.address}\t{o.name}" for o in self.hosts]
        os.makedirs(os.path.join(ETC_NETNS, h.netns), exist_ok=True)
        with open(os.path.join(ETC_NETNS, h.netns, "hosts"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def _start_rendezvous(self):
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts  # noqa: PLC0415
        from horovod.runner.http.http_server import RendezvousServer  # noqa: PLC0415

        self.slots = get_host_assignments(
            parse_hosts(",".join(f"{h.name}:{self.workers_per_host}" for h in self.hosts)), self.size)
        self._rendezvous = RendezvousServer(verbose=self.verbose)
        with _InNamespace(self.switch_ns):  # the listening socket is bound in the switch namespace
            self.rendezvous_port = self._rendezvous.start()
        self._rendezvous.init(self.slots)

    # -- running -----------------------------------------------------------------------------------------------

    def host_of(self, slot):
        return next(h for h in self.hosts if h.name == slot.hostname)

    def worker_env(self, slot, base=None):
        """The environment of one worker: what horovodrun --gloo sets (gloo_run.create_run_envs and
        create_slot_env_vars), PYTHONUNBUFFERED as gloo_run sets it, and nothing of a launching worker's."""
        host = self.host_of(slot)
        env = {k: v for k, v in (os.environ if base is None else base).items() if k not in WORKER_ENV}
        env.update({
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": SWITCH_ADDRESS,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.rendezvous_port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": host.iface,
            "NCCL_SOCKET_IFNAME": host.iface,
            "HOROVOD_HOSTNAME": host.name,
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "PYTHONUNBUFFERED": "1",
            # Not horovodrun's: tells programs (the probe, the bench) what network they run on.
            "FUSEDREC_CLUSTER_LINK_RATE": format_rate(self.rate_bits) if self.rate_bits else "unshaped",
        })
        return env

    def start(self, command, env=None, stdout=None, stderr=None):
        """Starts one worker per slot, each in its host's namespace, its own UTS namespace and process group.
        Returns the Popen objects in rank order."""
        if self._rendezvous is None:
            raise ClusterError("the cluster is not up")
        if self._procs:
            raise ClusterError("this cluster already ran a job; build a new one (the rendezvous is single-use)")
        for slot in self.slots:
            host = self.host_of(slot)
            argv = ["ip", "netns", "exec", host.netns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                    host.name] + list(command)
            cores = self.worker_cores[slot.rank] if self.worker_cores else None
            self._procs.append(subprocess.Popen(argv, env=self.worker_env(slot, env), stdout=stdout, stderr=stderr,
                                                start_new_session=True,
                                                preexec_fn=(lambda c=cores: os.sched_setaffinity(0, c)) if cores
                                                else None))
        self._log(f"started {len(self._procs)} workers: {' '.join(command)}")
        return list(self._procs)

    def wait(self, poll_s=0.05):
        """Waits for all workers. Raises WorkerFailed for the first one to exit nonzero, after stopping the rest."""
        pending = dict(enumerate(self._procs))
        while pending:
            for rank, proc in list(pending.items()):
                code = proc.poll()
                if code is None:
                    continue
                del pending[rank]
                if code != 0:
                    self.stop_workers()
                    raise WorkerFailed(rank, self.host_of(self.slots[rank]).name, code)
            time.sleep(poll_s)
        return 0

    def run(self, command, env=None):
        """start() then wait(): 0 when every worker exits 0; raises WorkerFailed otherwise."""
        self.start(command, env=env)
        return self.wait()

    def stop_workers(self, grace_s=3.0):
        """SIGTERM to every worker's process group, SIGKILL to those still there after grace_s."""
        live = [p for p in self._procs if p.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in live:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(p.poll() is None for p in live):
                time.sleep(0.05)
            live = [p for p in live if p.poll() is None]
            if not live:
                break
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # -- teardown ----------------------------------------------------------------------------------------------

    def down(self):
        """Stops the workers and the rendezvous server, kills what is left in the namespaces, deletes them.
        Safe to call more than once and after a partial up()."""
        self.stop_workers()
        if self._rendezvous is not None:
            self._rendezvous.stop()
            # RendezvousServer.stop() does not close the listening socket, which would keep the switch
            # namespace alive (unnamed) until this process exits.
            self._rendezvous._httpd.server_close()  # noqa: SLF001
            self._rendezvous = None
        for ns in reversed(self._created):
            _delete_namespace(ns)
        self._created = []
        self._log(f"down: {self.run_id}-* deleted")


def pin_plan(workers, cores_per_worker, available=None):
    """Worker rank -> the CPU set it is pinned to: disjoint sets of cores_per_worker CPUs each, in CPU order
    (None: no pinning). Refuses (ValueError) when the CPUs this process may use cannot give every worker its own."""
    if cores_per_worker is None:
        return None
    k = int(cores_per_worker)
    if k < 1:
        raise ValueError(f"cores_per_worker must be at least 1, got {cores_per_worker}")
    cpus = sorted(os.sched_getaffinity(0) if available is None else available)
    if workers * k > len(cpus):
        raise ValueError(f"{workers} workers x {k} cores each need {workers * k} CPUs; this process may use "
                         f"{len(cpus)} ({','.join(map(str, cpus))})")
    return [set(cpus[r * k:(r + 1) * k]) for r in range(workers)]


def tbf_burst_bytes(rate_bits):
    """The token bucket of a link of rate_bits/s: what it lets through at once when full (2 ms, at least 64 KiB)."""
    return max(64 * 1024, int(rate_bits / 8 * 0.002))


def tbf_parameters(rate_bits):
    """tc tbf arguments for a link of rate_bits/s: a bucket of 2 ms of traffic (at least 64 KiB, so one GSO
    segment always fits) and a queue of 50 ms, deep enough that TCP is paced by the bucket rather than by drops."""
    rate_bytes = rate_bits / 8
    burst = tbf_burst_bytes(rate_bits)
    limit = max(4 * burst, int(rate_bytes * 0.05))
    return ["rate", f"{rate_bits}bit", "burst", str(burst), "limit", str(limit)]
