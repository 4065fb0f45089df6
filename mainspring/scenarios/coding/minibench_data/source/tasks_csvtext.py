# ruff: noqa: E501  (the edits are code quoted verbatim, at its own line lengths)
"""The csvtext tasks: each a problem statement, the gold edits and the hidden tests as (file, exact text or None to
append, replacement); build.py turns them into instances."""

TASKS = []

TASKS.append(dict(
    instance_id="csvtext-1", repo="csvtext", kind="missing edge case", difficulty="medium",
    problem_statement=(
        "split_line() in csvtext/parse.py loses escaped quotes: the CSV line '\"say \"\"hi\"\"\",x' should give "
        "['say \"hi\"', 'x'] (inside a quoted field two double quotes stand for one, as the module docstring says) "
        "but gives ['say hi', 'x']."),
    hints_text="",
    gold=[("csvtext/parse.py", '''    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
''', '''    i = 0
    while i < len(line):
        ch = line[i]
        if ch == '"':
            if quoted and line[i + 1:i + 2] == '"':  # "" inside quotes: one literal quote
                current.append('"')
                i += 1
            else:
                quoted = not quoted
        elif ch == "," and not quoted:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
''')],
    tests=[("tests/test_parse.py", None, '''

def test_escaped_quotes():
    assert split_line('"say ""hi""",x') == ['say "hi"', "x"]
    assert split_line('""""') == ['"']
    assert split_line('a,""') == ["a", ""]
''')]))

TASKS.append(dict(
    instance_id="csvtext-2", repo="csvtext", kind="off-by-one", difficulty="easy",
    problem_statement=(
        "truncate() in csvtext/format.py returns more characters than asked: truncate('abcdefgh', 5) is 'abcde…', "
        "6 characters. A cut text must fit in `width` characters, the ellipsis included: 'abcd…'. render() cuts "
        "its cells with it, so its columns come out one character too wide."),
    hints_text="",
    gold=[("csvtext/format.py", "return text[:width] + ELLIPSIS", "return text[:width - 1] + ELLIPSIS")],
    tests=[("tests/test_table.py", None, '''

def test_truncate_fits_the_width():
    from csvtext.format import truncate

    assert truncate("abcdefgh", 5) == "abcd…"
    assert truncate("abcde", 5) == "abcde"
    assert truncate("ab", 1) == "…"
    assert all(len(truncate("x" * n, 4)) <= 4 for n in range(10))


def test_render_cuts_long_cells():
    t = Table.from_csv("name,qty\\nan extremely long name,3\\n")
    assert render(t, max_width=8).splitlines()[2] == "an extr…    3"
''')]))

TASKS.append(dict(
    instance_id="csvtext-3", repo="csvtext", kind="underspecified", difficulty="hard", underspecified=True,
    problem_statement=(
        "Table.sort_by() gets numeric columns wrong when a cell is empty: with one empty price the column is "
        "sorted as text, so '10' comes before '9'."),
    hints_text="Empty cells go last, in both directions; the other cells sort as numbers.",
    gold=[("csvtext/table.py", '''        """Rows ordered by a column: by value when every cell is a number, else as text."""
        i = self.index(name)
        numbers = [to_number(r[i]) for r in self.rows]
        if all(n is not None for n in numbers):
            rows = sorted(self.rows, key=lambda r: float(r[i]), reverse=reverse)
        else:
            rows = sorted(self.rows, key=lambda r: r[i], reverse=reverse)
        return Table(self.header, rows)''', '''        """Rows ordered by a column: by value when every non-empty cell is a number, else as text; rows with an
        empty cell there come last, in either direction."""
        i = self.index(name)
        filled = [r for r in self.rows if r[i].strip()]
        blank = [r for r in self.rows if not r[i].strip()]
        if all(to_number(r[i]) is not None for r in filled):
            filled.sort(key=lambda r: float(r[i]), reverse=reverse)
        else:
            filled.sort(key=lambda r: r[i], reverse=reverse)
        return Table(self.header, filled + blank)''')],
    tests=[("tests/test_table.py", None, '''

def test_sort_with_empty_cells():
    t = Table.from_csv("name,price\\na,10\\nb,\\nc,9\\nd,100\\n")
    assert t.sort_by("price").column("name") == ["c", "a", "d", "b"]
    assert t.sort_by("price", reverse=True).column("name") == ["d", "a", "c", "b"]
''')]))

TASKS.append(dict(
    instance_id="csvtext-4", repo="csvtext", kind="signature change across two files", difficulty="medium",
    problem_statement=(
        "Tables cannot be read from semicolon- or tab-separated text. Add a `delimiter` argument (default ',') "
        "to split_line() and read_csv(), and to Table.from_csv(), which passes it on. Quotes work as before "
        "with any delimiter."),
    hints_text="split_line and read_csv are in csvtext/parse.py; Table.from_csv is in csvtext/table.py.",
    gold=[("csvtext/parse.py", "def split_line(line: str) -> list[str]:", 'def split_line(line: str, delimiter: str = ",") -> list[str]:'),
          ("csvtext/parse.py", 'elif ch == "," and not quoted:', "elif ch == delimiter and not quoted:"),
          ("csvtext/parse.py", '''def read_csv(text: str) -> list[list[str]]:
    """The rows of a CSV text; blank lines are skipped."""
    return [split_line(line) for line in text.splitlines() if line.strip()]''', '''def read_csv(text: str, delimiter: str = ",") -> list[list[str]]:
    """The rows of a CSV text; blank lines are skipped."""
    return [split_line(line, delimiter) for line in text.splitlines() if line.strip()]'''),
          ("csvtext/table.py", '''    def from_csv(cls, text: str) -> Table:
        rows = read_csv(text)''', '''    def from_csv(cls, text: str, delimiter: str = ",") -> Table:
        rows = read_csv(text, delimiter)''')],
    tests=[("tests/test_parse.py", None, '''

def test_other_delimiters():
    assert split_line('a;"b;c";d', delimiter=";") == ["a", "b;c", "d"]
    assert split_line("a,b;c", delimiter=";") == ["a,b", "c"]
    assert read_csv("a\\tb\\n1\\t2\\n", delimiter="\\t") == [["a", "b"], ["1", "2"]]
'''), ("tests/test_table.py", None, '''

def test_from_csv_with_semicolons():
    t = Table.from_csv("name;price\\nbolt;0,05\\n", delimiter=";")
    assert t.column("price") == ["0,05"]
''')]))

TASKS.append(dict(
    instance_id="csvtext-5", repo="csvtext", kind="naive fix breaks a PASS_TO_PASS test", difficulty="medium",
    problem_statement=(
        "Spaces around unquoted CSV fields end up in the table: Table.from_csv('name, qty\\nbolt, 10\\n') has the "
        "cell ' 10', so where('qty', '10') finds nothing. Unquoted fields should lose their surrounding spaces."),
    hints_text="",
    gold=[("csvtext/parse.py", '''    quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append("".join(current))
            current = []''', '''    quoted = was_quoted = False
    for ch in line:
        if ch == '"':
            quoted = not quoted
            was_quoted = True
        elif ch == "," and not quoted:
            fields.append(_field(current, was_quoted))
            current, was_quoted = [], False'''),
          ("csvtext/parse.py", '''        raise ValueError(f"unterminated quote in {line!r}")
    fields.append("".join(current))
    return fields
''', '''        raise ValueError(f"unterminated quote in {line!r}")
    fields.append(_field(current, was_quoted))
    return fields


def _field(chars: list[str], was_quoted: bool) -> str:
    """An unquoted field loses its surrounding spaces; a quoted one keeps what the quotes hold."""
    text = "".join(chars)
    return text if was_quoted else text.strip()
''')],
    naive=[("csvtext/parse.py", '''            fields.append("".join(current))
            current = []''', '''            fields.append("".join(current).strip())
            current = []'''),
           ("csvtext/parse.py", '''    fields.append("".join(current))
    return fields''', '''    fields.append("".join(current).strip())
    return fields''')],
    tests=[("tests/test_parse.py", None, '''

def test_unquoted_fields_are_stripped():
    assert split_line(" a , b ") == ["a", "b"]
'''), ("tests/test_table.py", None, '''

def test_spaces_around_unquoted_fields():
    t = Table.from_csv("name, qty\\nbolt, 10\\n nut , 5\\n")
    assert t.header == ["name", "qty"]
    assert t.where("qty", "10").column("name") == ["bolt"]
    assert t.column("name") == ["bolt", "nut"]
''')]))
