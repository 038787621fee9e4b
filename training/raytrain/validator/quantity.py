"""Kubernetes resource quantities ("500m", "2", "4Gi", "1e3"), parsed by the official client's
`kubernetes.utils.parse_quantity`, the same grammar the API server accepts. A quantity that is not one
("2 cores") is an error naming the field, never 0."""

from __future__ import annotations

from typing import Any


class QuantityError(ValueError):
    """A value is not a Kubernetes quantity of a resource; the message names the field and the fix."""

    def __init__(self, field: str, value: Any, why: str = "is not a Kubernetes quantity"):
        self.field, self.value = field, value
        super().__init__(f"{field}: {value!r} {why}. Fix: write it like 500m, 2, 1.5 or 4Gi")


def parse_quantity(value: Any, field: str = "quantity") -> float:
    """The quantity as a number (cores, bytes, GPUs); QuantityError naming `field` when it is not one, or negative."""
    if isinstance(value, bool):  # YAML `true` is not an amount
        raise QuantityError(field, value)
    # Imported here: the client package takes ~0.3 s to import and only a few commands read quantities.
    from kubernetes.utils import parse_quantity as kubernetes_parse_quantity

    try:
        amount = float(kubernetes_parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        raise QuantityError(field, value) from None
    if amount < 0:  # the grammar allows a sign; no resource amount is negative
        raise QuantityError(field, value, "is negative; a resource amount is 0 or more")
    return amount


def whole_units(value: Any, field: str = "quantity") -> int:
    """The quantity rounded up to a whole number, as Kubernetes' Quantity.Value() does (KubeRay's num-cpus)."""
    amount = parse_quantity(value, field)
    whole = int(amount)
    return whole + 1 if amount > whole else whole
