"""``keeper-bench bulk-import`` imports each size in one invoke and prints a row a size: every
message archived or noted (the cuts the step made), the CPU time a message, and the command
that made the table."""

from __future__ import annotations

from keeper_bench.cli import main


def test_bulk_import_prints_a_row_a_size_with_its_command(tmp_path):
    out = tmp_path / "bulk_import.md"
    argv = ["bulk-import", "--sizes", "300,900", "--window", "8192", "--out", str(out)]
    assert main(argv) == 0
    text = out.read_text()
    assert "Command: `keeper-bench bulk-import --sizes 300,900 --window 8192`" in text
    assert "load average" in text
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ")]
    body = [[cell.strip() for cell in row] for row in rows[2:]]  # past the header and rule
    assert [int(row[0].replace(",", "")) for row in body] == [300, 900]
    for _messages, cuts, archived, *_ in body:
        # a history many windows long is taken in parts, a cut each, in the one invoke
        assert int(cuts) >= 1 and int(archived.replace(",", "")) > 0
    assert int(body[1][1]) > int(body[0][1])
    assert body[0][-1] == "1.00x"
