"""Shared test setup.

Every test module runs its own Taichi program (one ti.init per module). Objects of an earlier program
that sit in reference cycles are freed whenever Python's cycle collector happens to run, and Taichi's
destructors (e.g. Ndarray.__del__) free through whichever program is current, so an old program's
garbage collected during a later module corrupts that module's memory (seen as wrong filter results
and segfaults, depending on collector timing). Collecting garbage at every module boundary frees each
program's objects under their own program.
"""
import gc

import pytest

from app.frontend_cache import install

# Taichi's front end with app.frontend_cache's caches (off by default in the app): the same compiled code, built
# about twice as fast, and the suite's time is mostly kernel compilation (tests/test_frontend_cache.py checks that
# the caches change nothing).
install(force=True)


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_at_module_boundaries():
    gc.collect()
    yield
    gc.collect()
