import os
import sys
from pathlib import Path

# the scripts run by the tests print progress lines that tests wait for (e.g. "step ..." before sending Ctrl-C);
# into a pipe, Python would hold them in its buffer until the run ends
os.environ["PYTHONUNBUFFERED"] = "1"

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: `import rlhf_ppo_mujoco`


import pytest  # noqa: E402
from helpers import LabelServer  # noqa: E402


@pytest.fixture
def label_server(tmp_path):
    """Starts label_server.py processes (`label_server(*args, db=..., token=...)`); all are stopped after the test."""
    servers = []

    def start(*args, db=None, port=0, token=None):
        server = LabelServer(db or tmp_path / "labels.sqlite", *args, port=port, token=token)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def pytest_collection_modifyitems(items):
    # the Slurm tests (xdist_group "slurm", test_sweep.py) spend about two minutes waiting for Slurm: run them first,
    # so that under `pytest -n 3` the other workers' tests fill that wait instead of the run ending on it
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
