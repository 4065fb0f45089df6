"""csvtext: read small CSV texts into tables, query them, and print them as aligned text."""

from csvtext.parse import read_csv, split_line
from csvtext.table import Table

__all__ = ["Table", "read_csv", "split_line"]
