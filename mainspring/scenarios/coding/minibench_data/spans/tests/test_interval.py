import pytest

from spans import Interval, gaps, merge


def test_bad_interval():
    with pytest.raises(ValueError):
        Interval(5, 1)


def test_contains_start_and_inside():
    iv = Interval(1, 4)
    assert iv.contains(1) and iv.contains(3)
    assert not iv.contains(0)


def test_overlaps_and_intersection():
    assert Interval(1, 5).overlaps(Interval(4, 8))
    assert Interval(1, 5).intersection(Interval(4, 8)) == Interval(4, 5)
    assert Interval(1, 2).intersection(Interval(6, 8)) is None


def test_touching_intervals_do_not_overlap():
    assert not Interval(1, 3).overlaps(Interval(3, 5))
    assert Interval(1, 3).intersection(Interval(3, 5)) is None


def test_merge_overlapping():
    assert merge([Interval(5, 9), Interval(1, 4), Interval(3, 6)]) == [Interval(1, 9)]
    assert merge([Interval(1, 2), Interval(4, 5)]) == [Interval(1, 2), Interval(4, 5)]


def test_gaps():
    assert gaps([Interval(2, 4), Interval(6, 7)], Interval(0, 10)) == [Interval(0, 2), Interval(4, 6),
                                                                      Interval(7, 10)]
