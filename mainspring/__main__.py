from mainspring.cli import app

app(prog_name="mainspring")
