"""Fixture plugins shared across test folders: the moto S3 server and the API emulator.

pytest accepts ``pytest_plugins`` only in the top-level conftest, so folders that need
these fixtures get them from here.
"""

pytest_plugins = ("tests.s3server", "tests.kubeapi.fixtures")
