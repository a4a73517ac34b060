"""Fixture plugins shared across test folders: the S3 servers (SeaweedFS, and moto for
the tests that kill theirs), the Cloud Storage emulator (fake-gcs-server) and the local
cluster (with the tests' API server and pod
cluster); and the checkpoint key every test runs with.

pytest accepts ``pytest_plugins`` only in the top-level conftest, so folders that need
these fixtures get them from here.
"""

import tempfile
from collections.abc import Iterator

import pytest

from resumequal.run.signing import KEY_ENV, RUN_ID_ENV

pytest_plugins = ("tests.s3server", "tests.gcsserver", "testing.cluster.fixtures")

# The checkpoint key and run id every test's legs are started with (workers started by a
# test inherit them; `resumequal run` makes a run id of its own); tests of a missing or
# wrong key or run change or remove them.
TEST_CHECKPOINT_KEY = "0123456789abcdef" * 4
TEST_RUN_ID = "test-run"


@pytest.fixture(autouse=True, scope="session")
def checkpoint_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # Session-wide, so that module-scoped fixtures save with it too. The keys `resumequal
    # run` keeps for its runs go to a folder of the session's, not the user's.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, TEST_CHECKPOINT_KEY)
        mp.setenv(RUN_ID_ENV, TEST_RUN_ID)
        mp.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
        yield TEST_CHECKPOINT_KEY


@pytest.fixture(autouse=True, scope="session")
def session_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``TMPDIR`` for every process the session starts: torchrun's log folders
    (``torchelastic_*``), multiprocessing's ``pymp-*`` and the rest go under the session's
    base folder, which pytest prunes, instead of piling up in /tmp."""
    folder = str(tmp_path_factory.mktemp("tmp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", folder)
        mp.setattr(tempfile, "tempdir", None)  # re-read from TMPDIR by this process too
        yield folder
    tempfile.tempdir = None
