"""Fixture plugins shared across test folders: the moto S3 server and the API emulator;
and the checkpoint key every test runs with.

pytest accepts ``pytest_plugins`` only in the top-level conftest, so folders that need
these fixtures get them from here.
"""

from collections.abc import Iterator

import pytest

from resumequal.signing import KEY_ENV

pytest_plugins = ("tests.s3server", "tests.kubeapi.fixtures")

# The checkpoint key every test's checkpoints are signed with (workers started by a test
# inherit it); tests of a missing or wrong key change or remove it.
TEST_CHECKPOINT_KEY = "0123456789abcdef" * 4


@pytest.fixture(autouse=True, scope="session")
def checkpoint_key() -> Iterator[str]:
    # Session-wide, so that module-scoped fixtures save with it too.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, TEST_CHECKPOINT_KEY)
        yield TEST_CHECKPOINT_KEY
