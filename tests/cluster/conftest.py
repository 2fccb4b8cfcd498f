"""Fixtures of the cluster tests: `cluster_ok` stops a test that needs root, ip and tc where they are missing, as a
failure in CI (CI=true, which runs as root) and as a skip with the reason elsewhere. `netstate` snapshots the
namespaces, /etc/netns entries and root-namespace links of this machine, to check that a run leaves nothing."""

import os
import subprocess

import pytest

from tf_fusedrec.cluster import ETC_NETNS, ClusterError, check_can_build, list_namespaces


@pytest.fixture
def cluster_ok():
    try:
        check_can_build()
    except ClusterError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI runs the cluster tests as root with iproute2 installed: {e}", pytrace=False)
        pytest.skip(str(e))


def root_links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def etc_netns():
    return set(os.listdir(ETC_NETNS)) if os.path.isdir(ETC_NETNS) else set()


@pytest.fixture
def netstate(cluster_ok):  # noqa: ARG001
    """Returns check(namespaces): asserts those namespaces are gone and the root namespace has no new link."""
    links_before = root_links()

    def check(namespaces):
        namespaces = set(namespaces)
        assert namespaces, "the workers reported no namespace"
        left = namespaces & set(list_namespaces())
        assert not left, f"namespaces left behind: {sorted(left)}"
        left = namespaces & etc_netns()
        assert not left, f"{ETC_NETNS} entries left behind: {sorted(left)}"
        new_links = root_links() - links_before
        assert not new_links, f"links appeared in the root namespace: {sorted(new_links)}"

    return check
