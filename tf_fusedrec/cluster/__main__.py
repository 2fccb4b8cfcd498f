"""`python -m tf_fusedrec.cluster --hosts N [--link-rate 1gbit] [--workers-per-host W] [--cores-per-worker K] --
COMMAND ...`

Builds N hosts in network namespaces with links shaped to --link-rate, runs COMMAND as N x W Horovod (Gloo)
workers, each in its host's namespace, and tears everything down on exit, on Ctrl-C / SIGTERM and when a worker
fails. Exit status: 0, the failed worker's status (128 + signal if it was killed), 2 for usage and setup errors,
130 / 143 when interrupted.
"""

import argparse
import signal
import sys

from tf_fusedrec.cluster import Cluster, ClusterError, WorkerFailed, check_can_build, parse_rate, pin_plan


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.cluster",
                                description="Run a command as Horovod workers on N namespaced hosts with shaped "
                                            "links.")
    p.add_argument("--hosts", type=int, required=True, help="number of hosts (network namespaces)")
    p.add_argument("--link-rate", default="1gbit",
                   help="rate of each host's link, tc syntax (1gbit, 100mbit, 10gbit); 'none' for unshaped")
    p.add_argument("--workers-per-host", type=int, default=1, help="Horovod workers on each host (default 1)")
    p.add_argument("--cores-per-worker", type=int, default=None,
                   help="pin each worker to this many CPUs of its own (default: no pinning)")
    p.add_argument("--verbose", action="store_true", help="log each step of building and tearing down the hosts")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = p.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        p.error("no command: put it after --, e.g. -- python -m tf_fusedrec.cluster.probe")
    if args.link_rate.lower() == "none":
        args.link_rate = None
    else:
        try:
            parse_rate(args.link_rate)
        except ValueError as e:
            p.error(str(e))
    if args.hosts < 1 or args.workers_per_host < 1:
        p.error("--hosts and --workers-per-host must be at least 1")
    if args.cores_per_worker is not None:
        try:
            pin_plan(args.hosts * args.workers_per_host, args.cores_per_worker)
        except ValueError as e:
            p.error(f"--cores-per-worker: {e}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        check_can_build()
    except ClusterError as e:
        print(f"tf_fusedrec.cluster: {e}", file=sys.stderr)
        return 2

    def interrupt(signum, frame):  # noqa: ARG001
        raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
    cluster = Cluster(args.hosts, args.link_rate, args.workers_per_host, verbose=args.verbose,
                      cores_per_worker=args.cores_per_worker)
    try:
        cluster.up()
        return cluster.run(args.command)
    except WorkerFailed as e:
        print(f"tf_fusedrec.cluster: {e}", file=sys.stderr)
        return e.exit_status
    except ClusterError as e:
        print(f"tf_fusedrec.cluster: {e}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as e:
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        print(f"tf_fusedrec.cluster: interrupted ({signal.Signals(signum).name}), stopping the workers",
              file=sys.stderr)
        return 128 + signum
    finally:
        # A second Ctrl-C must not cut the teardown short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())
