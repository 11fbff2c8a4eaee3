"""Shared test setup.

Every test module runs its own Taichi program (one ti.init per module). Objects of an earlier program
that sit in reference cycles are freed whenever Python's cycle collector happens to run, and Taichi's
destructors (e.g. Ndarray.__del__) free through whichever program is current, so an old program's
garbage collected during a later module corrupts that module's memory (seen as wrong filter results
and segfaults, depending on collector timing). Collecting garbage at every module boundary frees each
program's objects under their own program.
"""
import gc
import os

import pytest

from app.frontend_cache import install

# Taichi's front end with app.frontend_cache's caches (off by default in the app), in this process and in the
# run.py processes that tests start (batch workers, the viewer, headless runs): the same compiled code, built
# about twice as fast, and the suite's time is mostly kernel compilation (tests/test_frontend_cache.py checks that
# the caches change nothing).
os.environ["SMOLVLA_FRONTEND_CACHE"] = "1"
install()


# The modules that take longest on 2 cores (mostly compiling kernels), longest first. pytest-xdist's --dist loadfile
# hands whole modules to the workers in collection order, so starting with the long ones keeps both busy to the
# end instead of leaving one of them alone with a long module that came last.
SLOW_MODULES = ("tests/sim/test_sim.py", "tests/vla/test_vla.py", "tests/batch/test_batch_sim.py",
                "tests/viewer/test_viewer.py", "tests/sim/test_physics.py")


def pytest_collection_modifyitems(items):
    def rank(item):
        path = item.nodeid.split("::")[0]
        return SLOW_MODULES.index(path) if path in SLOW_MODULES else len(SLOW_MODULES)

    items.sort(key=rank)   # (stable: each module's tests keep their order)


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_at_module_boundaries():
    gc.collect()
    yield
    gc.collect()
