import pytest

from csvtext import read_csv, split_line


def test_plain_fields():
    assert split_line("a,b,,c") == ["a", "b", "", "c"]


def test_quoted_comma():
    assert split_line('"Smith, J",42') == ["Smith, J", "42"]


def test_quoted_spaces_are_kept():
    assert split_line('" padded ",x') == [" padded ", "x"]


def test_unterminated_quote():
    with pytest.raises(ValueError):
        split_line('"open,1')


def test_read_csv_skips_blank_lines():
    assert read_csv("a,b\n\n1,2\n") == [["a", "b"], ["1", "2"]]
