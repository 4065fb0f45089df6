from decimal import Decimal

import pytest

from moneykit import Money, round_minor
from moneykit.parse import parse_amount, parse_money
from moneykit.split import allocate


def test_add_and_subtract():
    assert Money("1.10") + Money("2.20") == Money("3.30")
    assert Money("5") - Money("0.01") == Money("4.99")


def test_currencies_do_not_mix():
    with pytest.raises(ValueError):
        Money("1", "USD") + Money("1", "EUR")


def test_round_minor_plain_values():
    assert round_minor(Decimal("1.234")) == Decimal("1.23")
    assert round_minor(Decimal("1.236")) == Decimal("1.24")
    assert round_minor(Decimal("1234.4"), "JPY") == Decimal("1234")


def test_parse_amount():
    assert parse_amount(" 12.50 ") == Decimal("12.50")
    assert parse_amount("-3") == Decimal("-3")


def test_parse_amount_comma_decimals():
    assert parse_amount("1.234,50", decimal_sep=",") == Decimal("1234.50")
    assert parse_amount("0,5", decimal_sep=",") == Decimal("0.5")


def test_parse_money_with_currency():
    assert parse_money("12.50 eur") == Money("12.50", "EUR")
    with pytest.raises(ValueError):
        parse_money("twelve")


def test_allocate_needs_parts():
    with pytest.raises(ValueError):
        allocate(Money("10"), 0)
