"""The container layer streams a command's output and keeps its tail for the
error it raises (a CI log's tail may not reach the streamed output)."""

from __future__ import annotations

import sys

from pipeline.container import echo_run_keeping_tail


def test_keeps_the_last_lines_and_the_exit_status(capsys):
    script = "import sys\nfor i in range(100): print(f'line {i}', file=sys.stderr if i % 2 else sys.stdout, flush=True)\nsys.exit(3)"  # noqa: E501
    status, tail = echo_run_keeping_tail([sys.executable, "-c", script], lines=5)
    assert status == 3
    assert tail.splitlines() == [f"line {i}" for i in range(95, 100)]
    streamed = capsys.readouterr().out
    assert "line 0\n" in streamed and "line 99\n" in streamed


def test_a_successful_command_returns_zero(capsys):
    status, tail = echo_run_keeping_tail([sys.executable, "-c", "print('done')"])
    assert (status, tail) == (0, "done\n")
