"""Real storage servers for the store tests, started once per session on 127.0.0.1.

Without the server packages the tests are skipped locally; CI sets
PYCKPT_REQUIRE_ALL=1, which turns a missing package into a failure.
"""

import json
import uuid

import pytest

from pyckpt.testing import servers
from pyckpt.testing.requirements import require

def _need(*modules):
    for m in modules:
        require(m, "a storage server or its client")


@pytest.fixture(scope="session")
def seaweed_options():
    _need("s3fs")
    with servers.seaweedfs() as so:
        servers.make_bucket("s3", so, "pyckpt")
        yield so


@pytest.fixture(scope="session")
def moto_options():
    _need("s3fs", "moto", "flask")
    with servers.moto() as so:
        yield so


@pytest.fixture(scope="session")
def gcs_options():
    _need("gcsfs", "gcp_storage_emulator")
    with servers.gcs_emulator() as so:
        servers.make_bucket("gs", so, "pyckpt")
        yield so


def _unique():
    return uuid.uuid4().hex[:12]


@pytest.fixture
def moto_bucket(moto_options):
    servers.moto_reset(moto_options)
    servers.make_bucket("s3", moto_options, "pyckpt")
    return moto_options


@pytest.fixture(params=["memory", "seaweedfs", "moto", "gcs"])
def remote(request):
    """(URL prefix unique to this test, storage_options) on every kind of store."""
    kind = request.param
    if kind == "memory":
        return f"memory://pyckpt-tests/{_unique()}", None
    if kind == "seaweedfs":
        return f"s3://pyckpt/{_unique()}", request.getfixturevalue("seaweed_options")
    if kind == "moto":
        return f"s3://pyckpt/{_unique()}", request.getfixturevalue("moto_bucket")
    return f"gs://pyckpt/{_unique()}", request.getfixturevalue("gcs_options")


# -- what the fault proxy injected, and what became of the operations ---------------------

class FaultReport:
    """One row per save or load made through a FaultProxy: the faults injected during
    it (per kind) and its outcome. Printed at the end of the session and written to
    ``fault_proxy_summary.txt`` (and ``.json``) under pytest's base temporary directory."""

    def __init__(self):
        self.rows = []
        self.path = None

    def add(self, test, operation, faults, outcome):
        self.rows.append({"test": test, "operation": operation, "faults": dict(faults),
                          "outcome": outcome})

    def totals(self):
        faults, outcomes = {}, {}
        for row in self.rows:
            for kind, n in row["faults"].items():
                faults[kind] = faults.get(kind, 0) + n
            head = row["outcome"].split(":", 1)[0]
            outcomes[head] = outcomes.get(head, 0) + 1
        return faults, outcomes

    def lines(self):
        faults, outcomes = self.totals()
        out = ["faults injected: " + ", ".join(f"{k} {n}" for k, n in faults.items()),
               "outcomes: " + ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items()))]
        for row in self.rows:
            injected = ", ".join(f"{k} {n}" for k, n in row["faults"].items() if n) or "none"
            out.append(f"  {row['test']} | {row['operation']} | faults: {injected} | "
                       f"{row['outcome']}")
        return out

    def write(self, directory):
        self.path = directory / "fault_proxy_summary.txt"
        self.path.write_text("\n".join(self.lines()) + "\n")
        (directory / "fault_proxy_summary.json").write_text(json.dumps(self.rows, indent=1))


_REPORT = pytest.StashKey()


@pytest.fixture(scope="session")
def fault_report(request, tmp_path_factory):
    report = FaultReport()
    request.config.stash[_REPORT] = report
    yield report
    if report.rows:
        report.write(tmp_path_factory.getbasetemp())


def pytest_terminal_summary(terminalreporter, config):
    report = config.stash.get(_REPORT, None)
    if report is None or not report.rows:
        return
    terminalreporter.write_sep("-", "fault proxy: faults injected and outcomes")
    for line in report.lines():
        terminalreporter.write_line(line)
    if report.path is not None:
        terminalreporter.write_line(f"(written to {report.path})")
