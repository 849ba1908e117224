"""One JSON record of a device run (tools/gpu_run.sh devices | multigpu): the machine, every test's outcome from
pytest's JUnit XML, and the tensor-parallel example's diffs. Printed to stdout (results/devices.json,
results/multigpu.json are copies of it).

    python tools/device_report.py JUNIT.xml TENSOR_PARALLEL.json > results/multigpu.json
"""
import json
import sys
import xml.etree.ElementTree as ElementTree

from gemm.heuristics import device_facts
from gemm.testing.records import device_info
from ptx.device import device_count


def test_outcomes(path: str) -> dict:
    outcomes = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.attrib['classname'].split('.')[-1]}::{case.attrib['name']}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[name] = kinds[0].replace("failure", "failed").replace("error", "failed") if kinds else "passed"
    return outcomes


def main(junit: str, tensor_parallel: str) -> None:
    outcomes = test_outcomes(junit)
    with open(tensor_parallel) as handle:
        example = json.load(handle)
    totals = {kind: sum(1 for value in outcomes.values() if value == kind) for kind in ("passed", "failed", "skipped")}
    devices = [vars(device_facts(ordinal)) for ordinal in range(device_count())]
    print(json.dumps({"device": device_info(), "devices": devices, "tests": totals, "outcomes": outcomes,
                      "tensor_parallel": example}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
