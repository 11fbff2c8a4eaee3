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

# Taichi's front end with the app's caches, as the app runs it (app.headless.init_taichi): the same compiled
# code, built about twice as fast (tests/test_frontend_cache.py checks that they change nothing).
install()


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_at_module_boundaries():
    gc.collect()
    yield
    gc.collect()
