"""Fixtures for the tests across test hosts: skipped, saying why, where network namespaces cannot be
made (not root, no `ip netns`); everything they start is torn down even when a test fails."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.hosts import netns
from tests.hosts.cluster import Cluster


@pytest.fixture(scope="session")
def can_make_hosts() -> None:
    if (why := netns.problem()) is not None:
        pytest.skip(why)


@pytest.fixture
def make_cluster(can_make_hosts, tmp_path) -> Iterator[Callable[..., Cluster]]:
    """Build a Cluster (its own test hosts) inside a test; closed when the test ends, however it ends."""
    made: list[Cluster] = []

    def make(codes: tuple[str, ...] = ("FRA", "ICN"), dev_args: tuple[str, ...] = ()) -> Cluster:
        folder = tmp_path / f"cluster-{len(made)}"
        folder.mkdir()
        made.append(Cluster(folder, netns.Hosts(len(codes)), codes, dev_args))
        return made[-1]

    yield make
    for cluster in made:
        cluster.close()


@pytest.fixture(scope="module")
def two_hosts(can_make_hosts, tmp_path_factory) -> Iterator[Cluster]:
    """FRA and ICN on two test hosts, shared by a module's tests that leave them as they found them."""
    cluster = Cluster(tmp_path_factory.mktemp("two-hosts"), netns.Hosts(2), ("FRA", "ICN"))
    yield cluster
    cluster.close()
