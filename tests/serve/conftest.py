"""Fixtures of the serving tests."""

import pytest

from tf_fusedrec.serve import security


@pytest.fixture(autouse=True)
def _security_log_restored():
    """A command's main() run in this process (the refuse-to-start tests) sends the security log to stderr alone
    (security.log_to_stderr: not through the root logger, where pytest's caplog listens): restored after each test, so
    the tests that read that log through caplog see it whatever ran before them in this worker."""
    log = security.LOG
    saved = list(log.handlers), log.propagate, log.level
    yield
    log.handlers[:], log.propagate = saved[0], saved[1]
    log.setLevel(saved[2])
