import pytest

from csvtext import Table
from csvtext.format import render

CSV = "name,qty,price\nbolt,10,0.05\nnut,200,0.02\nwasher,5,0.10\n"


def test_from_csv_and_column():
    t = Table.from_csv(CSV)
    assert t.header == ["name", "qty", "price"]
    assert t.column("Qty") == ["10", "200", "5"]


def test_select_and_where():
    t = Table.from_csv(CSV)
    assert t.where("name", "nut").select("price").rows == [["0.02"]]
    with pytest.raises(KeyError):
        t.column("weight")


def test_sort_numeric_and_text():
    t = Table.from_csv(CSV)
    assert t.sort_by("qty").column("name") == ["washer", "bolt", "nut"]
    assert t.sort_by("name", reverse=True).column("name") == ["washer", "nut", "bolt"]


def test_ragged_rows_are_refused():
    with pytest.raises(ValueError):
        Table(["a", "b"], [["1"]])


def test_render():
    t = Table.from_csv("item,qty\nbolt,10\nnut,5\n")
    assert render(t) == "item  qty\n----  ---\nbolt   10\nnut     5"
