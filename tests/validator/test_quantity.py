"""Kubernetes quantities: one parser (the official client's), a bad one is an error naming the field, never 0."""

from __future__ import annotations

import pytest

from raytrain.validator.quantity import QuantityError, parse_quantity, whole_units

GiB = 2**30


@pytest.mark.parametrize("text, value", [
    ("500m", 0.5), ("2", 2), ("4Gi", 4 * GiB), ("1G", 1e9), ("128Mi", 128 * 2**20), ("1e3", 1000), (3, 3), (1.5, 1.5),
])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "two", "2 cores", "4GB", "1.5.2", None, True, [1]])
def test_a_bad_quantity_is_an_error_naming_the_field(text):
    with pytest.raises(QuantityError, match=r"^spec\.x: .* is not a Kubernetes quantity\. Fix: write it like"):
        parse_quantity(text, "spec.x")


def test_a_negative_quantity_is_refused():
    with pytest.raises(QuantityError, match=r"spec\.x: '-1' is negative"):
        parse_quantity("-1", "spec.x")


@pytest.mark.parametrize("text, value", [("500m", 1), ("1", 1), ("1500m", 2), ("2.0", 2), ("1Gi", GiB)])
def test_whole_units_round_up_like_quantity_value(text, value):
    assert whole_units(text) == value
