"""The code's shape kept: no source file of the engine, the pipeline or the
benchmarks over FILE_LINES lines (a file that grows past it holds more than
one job; split it along its seams). The functions' length is lizard's, in the
lint phase (pipeline/sessions.py)."""

from pipeline.paths import ROOT
from pipeline.sessions import SHAPED_CODE
from pipeline.source import project_files

FILE_LINES = 500
SOURCE_SUFFIXES = (".py", ".cpp", ".h", ".cu", ".cuh")


def shaped_sources() -> list[str]:
    return [f for f in project_files(*SHAPED_CODE) if f.endswith(SOURCE_SUFFIXES) and (ROOT / f).is_file()]


def test_no_source_file_of_the_engine_pipeline_or_benchmarks_is_over_500_lines():
    sources = shaped_sources()
    assert any(f.startswith("engine/src/") for f in sources), "no engine sources found: the listing is wrong"
    too_long = {}
    for f in sources:
        with open(ROOT / f, encoding="utf-8") as text:
            lines = sum(1 for _ in text)
        if lines > FILE_LINES:
            too_long[f] = lines
    assert not too_long, f"over {FILE_LINES} lines (split each along its seams): {too_long}"
