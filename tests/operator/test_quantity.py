"""Quantities as the API server keeps them, and compared as quantities by the drift check."""

from __future__ import annotations

import pytest

from slopilot.operator.quantity import canonical, same_quantity
from slopilot.operator.reconcile import covers

# What the API server stores for what a client wrote (apimachinery's resource.Quantity:
# its quantity_test.go table for the binary cases, kubectl's answers for the rest).
STORED = [
    ("0", "0"), ("1", "1"), (1, "1"), (2, "2"), ("0.5", "500m"), (0.5, "500m"),
    ("1500m", "1500m"), ("2000m", "2"), ("1000", "1k"), ("1500", "1500"), ("100m", "100m"),
    ("0.1m", "100u"), ("1Ki", "1Ki"), ("1Mi", "1Mi"), ("1Gi", "1Gi"), ("1024Mi", "1Gi"),
    ("1000M", "1G"), ("1.5Gi", "1536Mi"), ("0.5Ki", "512"), (".001Ki", "1024m"),
    (".000001Ki", "1024u"), (".000000001Ki", "1024n"), (".000000000001Ki", "2n"),
    ("1073741824", "1073741824"), ("16Gi", "16Gi"), ("1e3", "1e3"), ("+4", "4"),
]


@pytest.mark.parametrize(("written", "stored"), STORED)
def test_a_quantity_renders_as_the_api_server_stores_it(written: str | int,
                                                        stored: str) -> None:
    assert canonical(written) == stored
    assert canonical(stored) == stored  # stored again, it stays


@pytest.mark.parametrize("bad", ["16GB", "four", "NaN", "Infinity", True, None, "1_000"])
def test_what_is_no_quantity_is_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        canonical(bad)


def test_quantities_compare_by_amount() -> None:
    assert same_quantity("1", 1) and same_quantity("500m", "0.5")
    assert same_quantity("1073741824", "1Gi") and same_quantity("1536Mi", "1.5Gi")
    assert not same_quantity("1", 2) and not same_quantity("1G", "1Gi")
    assert not same_quantity("x", "1") and same_quantity("x", "x")  # not quantities: ==


def test_covers_reads_a_containers_resources_as_quantities() -> None:
    desired = {"containers": [{"name": "engine", "resources": {
        "requests": {"cpu": "0.5", "memory": "1Gi", "nvidia.com/gpu": 1},
        "limits": {"cpu": "0.5", "memory": "1Gi", "nvidia.com/gpu": 1}}}]}
    stored = {"containers": [{"name": "engine", "resources": {
        "requests": {"cpu": "500m", "memory": "1073741824", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}}}]}
    assert covers(stored, desired)
    stored["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    assert not covers(stored, desired)
    del stored["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert not covers(stored, desired)
    # Elsewhere a string is not a number: an env value "1" is not 1.
    assert not covers({"env": [{"name": "N", "value": "1"}]}, {"env": [{"name": "N", "value": 1}]})
