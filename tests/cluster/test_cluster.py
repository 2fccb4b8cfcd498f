"""The cluster of namespaced hosts (tf_fusedrec.cluster): refusal without root or tools, distinct hosts and
interfaces, link shaping in force, and teardown that leaves nothing behind after success, a killed worker and an
interrupted launcher."""

import json
import os
import re
import sys

import pytest

from tests.subprocess_runner import execute, tail
from tf_fusedrec import cluster
from tf_fusedrec.cluster import __main__ as cli

CLUSTER = [sys.executable, "-m", "tf_fusedrec.cluster"]
TIMEOUT_S = 120
# What each worker reports: rank, hostname, interface, the interface's IPv4 address, its namespace, and the address
# the other host's name resolves to.
REPORT = ('echo "worker $HOROVOD_RANK/$HOROVOD_SIZE $(hostname) $HOROVOD_GLOO_IFACE '
          '$(ip -o -4 addr show dev $HOROVOD_GLOO_IFACE | awk \'{print $4}\') $(ip netns identify $$) '
          '$(getent hosts host$((1 - HOROVOD_CROSS_RANK)) | awk \'{print $1}\') local=$HOROVOD_LOCAL_RANK '
          'cross=$HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE"')


def test_refuses_without_root():
    with pytest.raises(cluster.ClusterError, match="needs root.*effective uid is 1000"):
        cluster.check_can_build(euid=1000)


def test_refuses_without_tools():
    def which(tool):
        return None if tool in ("tc", "unshare") else f"/usr/bin/{tool}"

    with pytest.raises(cluster.ClusterError, match=r"needs tc, unshare on the PATH: install iproute2"):
        cluster.check_can_build(euid=0, which=which)


def test_cli_refuses_without_root(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["--hosts", "2", "--", "true"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_parse_rate():
    assert cluster.parse_rate("1gbit") == 10**9
    assert cluster.parse_rate("100Mbit") == 10**8
    assert cluster.parse_rate("125mbps") == 10**9
    assert cluster.format_rate(10**10) == "10gbit"
    for bad in ("fast", "1 gigabit", "0mbit", "-1gbit"):
        with pytest.raises(ValueError, match="link rate"):
            cluster.parse_rate(bad)


def _namespaces(out):
    return set(re.findall(r"\b(frc-\d+-[0-9a-f]+-h\d+)\b", out))


def test_hosts_interfaces_and_teardown(netstate):
    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--workers-per-host", "2", "--link-rate", "100mbit", "--",
                                    "sh", "-c", REPORT], TIMEOUT_S, merge_stderr=True)
    assert rc == 0, tail(out)
    rows = sorted(line.split() for line in out.splitlines() if line.startswith("worker "))
    assert len(rows) == 4, tail(out)
    by_rank = {int(r[1].split("/")[0]): r for r in rows}
    assert sorted(by_rank) == [0, 1, 2, 3] and all(r[1].endswith("/4") for r in rows)
    for rank, (_, _, host, iface, address, netns, peer, local, cross) in by_rank.items():
        h = rank // 2  # horovod's assignment: ranks 0, 1 on host0, 2, 3 on host1
        assert (host, iface, address) == (f"host{h}", f"host{h}-eth0", f"10.213.0.{h + 1}/24"), by_rank[rank]
        assert netns.endswith(f"-h{h}"), by_rank[rank]
        assert peer == f"10.213.0.{2 - h}", f"host{1 - h} resolves to {peer!r} on host{h}"
        assert (local, cross) == (f"local={rank % 2}", f"cross={h}/2"), by_rank[rank]
    assert len({r[5] for r in rows}) == 2, "the two hosts share a namespace"
    netstate(_namespaces(out))


def test_killed_worker_fails_the_job_and_teardown_is_clean(netstate, tmp_path):
    # Rank 1 is SIGKILLed; rank 0 would sleep a minute and leaves a process in another session behind, which only
    # the namespace teardown can find.
    script = (f'ip netns identify $$ > {tmp_path}/ns.$HOROVOD_RANK; '
              f'setsid sleep 300 & echo $! > {tmp_path}/orphan.$HOROVOD_RANK; '
              'if [ "$HOROVOD_RANK" = 1 ]; then sleep 2; kill -KILL $$; fi; exec sleep 60')
    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--link-rate", "1gbit", "--", "sh", "-c", script], 50,
                         merge_stderr=True)
    assert rc == 128 + 9, f"exit status {rc}\n{tail(out)}"
    assert "rank 1 (on host1) was killed by SIGKILL" in out, tail(out)
    for r in range(2):
        pid = int((tmp_path / f"orphan.{r}").read_text())
        assert not _running(pid), f"rank {r}'s background process {pid} survived the teardown"
    netstate({(tmp_path / f"ns.{r}").read_text().strip() for r in range(2)})


def test_interrupted_launcher_tears_down(netstate, tmp_path):
    # The runner sends SIGTERM to the launcher's process group once both workers have written their namespace (they
    # are then running, in their own sessions); 120 s only bounds a launcher that never starts them.
    script = f"ip netns identify $$ > {tmp_path}/ns.$HOROVOD_RANK; exec sleep 120"

    def both_running():
        return all((tmp_path / f"ns.{r}").exists() and (tmp_path / f"ns.{r}").stat().st_size > 0 for r in range(2))

    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--link-rate", "1gbit", "--", "sh", "-c", script], TIMEOUT_S,
                         merge_stderr=True, interrupt_when=both_running)
    assert both_running(), f"the workers did not start within {TIMEOUT_S} s\n{tail(out)}"
    assert rc is None, f"the launcher finished before it was interrupted\n{tail(out)}"
    assert "interrupted (SIGTERM)" in out, tail(out)
    netstate({(tmp_path / f"ns.{r}").read_text().strip() for r in range(2)})


def test_worker_failure_status_is_passed_on(cluster_ok):  # noqa: ARG001
    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--link-rate", "none", "--", "sh", "-c",
                                    'exit $((HOROVOD_RANK * 3))'], TIMEOUT_S, merge_stderr=True)
    assert rc == 3 and "rank 1 (on host1) exited with status 3" in out, tail(out)


def test_link_shaping_is_in_force(cluster_ok, tmp_path):  # noqa: ARG001
    # 8 MiB per worker: 4 MiB of each all-to-all crosses each host's 100 Mbit/s link, at least 0.34 s.
    rate, nbytes = "100mbit", 8 << 20
    probe = [sys.executable, "-m", "tf_fusedrec.cluster.probe", "--sizes", str(nbytes), "--reps", "2",
             "--only-alltoall", "--out", str(tmp_path)]
    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--link-rate", rate, "--"] + probe, TIMEOUT_S, merge_stderr=True)
    assert rc == 0, tail(out)
    report = json.loads((tmp_path / "probe.json").read_text())
    assert (report["network"], report["workers"], report["hosts"]) == (rate, 2, 2)
    crossing = report["alltoall"]["link_bytes_per_byte"] * report["alltoall"]["points"][0]["bytes"]
    floor = crossing * 8 / cluster.parse_rate(rate)
    seconds = report["alltoall"]["points"][0]["seconds"]
    assert seconds >= 0.95 * floor, f"an all-to-all of {crossing} link bytes took {seconds:.3f} s < {floor:.3f} s"


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pin_plan():
    assert cluster.pin_plan(3, None) is None
    assert cluster.pin_plan(2, 1, available={0, 1}) == [{0}, {1}]
    assert cluster.pin_plan(2, 2, available={4, 5, 6, 7, 9}) == [{4, 5}, {6, 7}]
    with pytest.raises(ValueError, match=r"2 workers x 2 cores each need 4 CPUs; this process may use 2 \(0,1\)"):
        cluster.pin_plan(2, 2, available={0, 1})
    with pytest.raises(ValueError, match="cores_per_worker must be at least 1"):
        cluster.pin_plan(2, 0, available={0, 1})


def test_cli_refuses_more_pinned_cores_than_the_machine_has(capsys):
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["--hosts", "2", "--cores-per-worker", str(len(os.sched_getaffinity(0))), "--", "true"])
    assert e.value.code == 2
    assert "--cores-per-worker" in capsys.readouterr().err


def test_workers_are_pinned_to_cores_of_their_own(cluster_ok):  # noqa: ARG001
    # Each worker writes its line in ONE write (atomic on the shared pipe): the workers run with PYTHONUNBUFFERED=1,
    # under which print() writes each argument apart, and two workers' words interleaved ("pinned 0 pinned[0]").
    rc, out, _ = execute(CLUSTER + ["--hosts", "2", "--cores-per-worker", "1", "--link-rate", "1gbit", "--",
                                    sys.executable, "-c",
                                    "import os; os.write(1, ('pinned %s %s\\n' % (os.environ['HOROVOD_RANK'], "
                                    "sorted(os.sched_getaffinity(0)))).encode())"], TIMEOUT_S, merge_stderr=True)
    assert rc == 0, tail(out)
    rows = sorted(line.split(" ", 2)[1:] for line in out.splitlines() if line.startswith("pinned "))
    cpus = sorted(os.sched_getaffinity(0))
    assert rows == [["0", str(cpus[:1])], ["1", str(cpus[1:2])]], tail(out)
