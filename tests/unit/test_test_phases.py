"""The test phases' summary line counts what each phase ran, skips included,
from the JUnit reports pytest and ctest write."""

from __future__ import annotations

import subprocess
import sys

from pipeline.sessions import junit_counts


def test_a_pytest_report_counts_passed_failed_skipped_and_expected_failures(tmp_path):
    (tmp_path / "test_five.py").write_text(
        "import pytest\n"
        "def test_passes(): pass\n"
        "def test_fails(): assert False\n"
        "def test_skips(): pytest.skip('no reason')\n"
        "@pytest.mark.xfail(strict=True)\n"
        "def test_fails_as_expected(): assert False\n"
        "def test_passes_too(): pass\n"
    )
    report = tmp_path / "report.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_five.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert junit_counts(report) == "2 passed, 1 failed, 1 skipped, 1 xfailed"


def test_a_ctest_report_counts_its_skips(tmp_path):
    # What ctest --output-junit writes (CMake 3.21+): a case per test, a
    # <skipped> or <failure> child where it did not pass.
    report = tmp_path / "ctest.xml"
    report.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<testsuite name="Linux" tests="4" failures="1" disabled="0" skipped="1" time="1">\n'
        '<testcase name="A.a" status="run" time="0"/>\n'
        '<testcase name="A.b" status="run" time="0"/>\n'
        '<testcase name="A.c" status="fail" time="0"><failure message="Failed"/></testcase>\n'
        '<testcase name="A.d" status="notrun" time="0"><skipped message="skipped"/></testcase>\n'
        "</testsuite>\n"
    )
    assert junit_counts(report) == "2 passed, 1 failed, 1 skipped"


def test_a_phase_that_wrote_no_report_says_so(tmp_path):
    assert junit_counts(tmp_path / "missing.xml") == "no report"
