from __future__ import annotations

from rankscope import node_name


def test_node_names_sort_as_a_fleet_numbers_them() -> None:
    names = ["f10", "f2", "f1", "f0", "gpu-b1", "gpu-a10", "gpu-a9", "f01", "x"]
    assert node_name.natural(names) == ["f0", "f01", "f1", "f2", "f10", "gpu-a9", "gpu-a10", "gpu-b1", "x"]
    assert node_name.items({"n10": 1, "n9": 2}) == [("n9", 2), ("n10", 1)]


def test_names_of_digits_only_or_of_differing_shapes_still_compare() -> None:
    assert node_name.natural(["10", "9", "a", "1a", "a1", ""]) == ["", "1a", "9", "10", "a", "a1"]


def test_a_run_of_digits_too_long_for_int_still_sorts_by_value() -> None:
    # A host name from a damaged export: int() refuses runs past 4,300 digits.
    huge = "node" + "9" * 5000
    assert node_name.natural([huge, "node10", "node" + "1" + "0" * 5000]) == ["node10", huge, "node1" + "0" * 5000]
