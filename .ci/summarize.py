"""Adds up the junit reports every pytest session wrote and prints one closing line."""

import pathlib
import sys
import xml.etree.ElementTree as ET

folder = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".nox-reports")
totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
reports = sorted(folder.glob("*.xml"))
for report in reports:
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"{len(reports)} pytest sessions")
print(f"{passed} passed, {failed} failed, {totals['skipped']} skipped")
sys.exit(1 if failed or not reports or passed == 0 else 0)
