"""``--price [CLUSTER=]PRICE`` and ``--currency``: what a GPU-hour costs, shared by the commands that
put money on lost time (``babysitter incidents``, ``babysitter scorecard``)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["add_price_arguments", "parse_prices"]


def add_price_arguments(p: Any) -> None:
    """Add ``--price`` (repeatable) and ``--currency`` to a subcommand's parser."""
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="[CLUSTER=]PRICE",
        help="price per GPU-hour, for one cluster or (without CLUSTER=) for all (repeatable)",
    )
    p.add_argument("--currency", default="USD", help="the prices' currency, as shown (default USD)")


def parse_prices(items: list[str]) -> tuple[dict[str, float], float | None]:
    """Per-cluster prices and the default for the others; ValueError naming the bad item."""
    prices: dict[str, float] = {}
    default = None
    for item in items:
        name, sep, value = item.rpartition("=")
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"--price {item!r}: expected [CLUSTER=]PRICE, e.g. provider-a=2.49") from None
        if not price >= 0 or math.isinf(price):
            raise ValueError(f"--price {item!r}: a price is a finite number >= 0")
        if sep:
            prices[name] = price
        else:
            default = price
    return prices, default
