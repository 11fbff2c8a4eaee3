"""Simulation: the facade the CLI, viewer and batch runner use.

    sim = Simulation(scene)                    # a validated app.scene.Scene; ti.init must have run
    sim.step_frame()                           # sim.substeps steps of sim.dt
    sim.advance(n)                             # n steps, their VLA commits checked every few steps
    sim.positions(), sim.orientations()        # numpy, bodies in scene order

It owns the objects of a simulation, each of its own kind: the Model (static definition, written by its
ModelBuilder), the State (what changes every step), the ContactSet (per-body contact lists, two generations),
the Grid (broadphase), the JacobiSolver (`step(state_in, state_out, contacts, dt)`) and the Diagnostics (what
the steps report). A step is: flip contact generations -> grid broadphase (VLA cell lists) -> narrowphase
(appends to both bodies' contact lists; a step whose VLAs could not hold its appends is redone after they grow,
so no contact is lost: see advance) -> solver (prepare + Jacobi/mass-splitting iterations + integrate, in place
on `state`). Every `resort_interval` steps a large scene's bodies are stored again in the order of where they are
(app.sim.reorder), which keeps neighbours near in memory and changes nothing in the motion.

Everything the viewer changes live is runtime data: gravity and materials go through the builder into the
Model's fields, dt and solver iterations are plain attributes passed to kernels as scalars.
"""
from __future__ import annotations

import sys

import numpy as np

from app.errors import UserError
from app.scene import SIM_DEFAULTS, Scene, validate
from app.sim.broadphase import Grid
from app.sim.contacts import ContactSet, dynamic_pool_gb
from app.sim.diagnostics import (NO_ERROR, READOUT_FIELDS, READOUT_FLOATS, Diagnostics, OverlapWatch,
                                  kernel_frame_readout, kernel_kinetic_energy)
from app.sim.model import Model, ModelBuilder, has_static_bodies, hull_capacity_for
from app.sim.narrowphase import find_contacts
from app.sim.reorder import Reorder, resort_bodies, storage_order
from app.sim.solver import JacobiSolver
from app.sim.state import State
from vla import Batch

NO_FAILURE = Batch.NO_FAILURE


class SimulationError(UserError):
    """The simulation blew up (NaN or a body faster than sim.max_speed). Names the body and the step."""

    exit_code = 1


class SimulationCapacityError(SimulationError):
    """Taichi cannot hold another allocation of the simulation's fields in this process (see _check_tree_room)."""


# Taichi 1.7's CPU/CUDA backends address at most 512 SNode trees and do not check (vla.taichi_compat). An
# allocation makes about 23 (the model's, state's and solver's fields, and the VLAs; counted on bounce.yaml), and
# the fields of an earlier one cannot be freed (they sit on Taichi's root), so a process that keeps allocating
# (capacity growths, new Simulations) is refused before the limit instead of crashing in a later kernel.
TREES_PER_ALLOCATION = 40


def _check_tree_room():
    from taichi.lang import impl

    from vla.taichi_compat import SNODE_TREE_LIMIT, SNODE_TREE_MARGIN

    used = impl.get_runtime().prog.get_snode_tree_size()
    if used + TREES_PER_ALLOCATION > SNODE_TREE_LIMIT - SNODE_TREE_MARGIN:
        raise SimulationCapacityError(
            f"this process has allocated {used} of the {SNODE_TREE_LIMIT} SNode trees Taichi 1.7 can address, and a "
            f"simulation needs about {TREES_PER_ALLOCATION} more: load scenes that fit the capacity already allocated "
            f"(Simulation.load), add bodies in fewer, larger steps, or run each simulation in a process of its own")


def _round_capacity(n: int) -> int:
    cap = 16
    while cap < n:
        cap *= 2
    return cap


def body_capacity_for(scene: Scene, capacity: int = 0) -> int:
    """Body capacity a Simulation allocates for `scene` when asked for at least `capacity`: the scene's body
    count rounded up to a power of two (>= 16), or `capacity` if larger."""
    return max(int(capacity or 0), _round_capacity(scene.body_count))


def taichi_pool_gb(scene: Scene, capacity: int = 0) -> float | None:
    """device_memory_GB for ti.init to run `scene` on CUDA: dynamic_pool_gb of its contact lists when it uses
    ``contacts: dynamic``, else None (Taichi's default). capacity: the body capacity the Simulation will be given,
    if more than the scene's (the viewer keeps headroom for dropped bodies)."""
    if scene.sim["contacts"] != "dynamic":
        return None
    return dynamic_pool_gb(2 * body_capacity_for(scene, capacity), scene.sim["padded_capacity"])


class Simulation:
    """A running scene.

    Attributes:
        scene: the Scene it was built from. builder (app.sim.model.ModelBuilder): the definition in scene order,
            bodies added at run time included (its bodies' rows give shapes()).
        model (app.sim.model.Model), state (app.sim.state.State; updated in place every step: fields keep their
            identity, so a viewer kernel bound to state.body_pos / state.body_quat stays valid until a
            capacity growth, see `generation_id`), contacts (app.sim.contacts.ContactSet), solver
            (app.sim.solver.JacobiSolver), grid (app.sim.broadphase.Grid), diagnostics
            (app.sim.diagnostics.Diagnostics).
        dt (s), substeps, solver_iterations: runtime; change freely between steps.
        step_count: steps since the start (or last reset), state.step; sim_time = step_count * dt.
        overflow_events: list of {"step", "lost", "total"} dicts, one per step range in which the padded or
            dynamic storage dropped contacts (also printed on stderr).
        generation_id: incremented whenever fields are reallocated (capacity growth in add_bodies).
        last_frame: the latest read_frame() (step_frame makes one a frame): health flags, contact points,
            max_depth (m), dropped contacts, kinetic energy (J); None before the first.
        overlap (app.sim.diagnostics.OverlapWatch), health_warnings: deep penetration over the run (health()).
        strict: False (default) reports a contact deeper than sim.penetration_limit as a warning; True raises
            SimulationError at the first.
        vla_regrowths: steps redone because a VLA had to grow on the host (see advance: the steps launched after
            the failed one, at most CHECK_STEPS - 1, ran again too); a cost, never a loss.
        scene_of, internal_of: int64 (N,): bodies are stored by shape, then in Z-order of their initial
            positions (app.sim.reorder.storage_order; spatial_sort=False keeps scene order), and again by shape
            and current positions by each resort(): stored body k is scene body scene_of[k], scene body s is
            stored at internal_of[s]. Fields, contact lists (and their `other`) and the grid use stored indices;
            the host accessors below and error messages use scene order. Bodies added at runtime are stored
            after the others, in their order; their scene indices continue the count.
        resort_interval: steps between two resort() calls made by step() (0: never): the scene's
            sim.resort_interval unless the constructor was given one; they happen only with at least
            resort_min_bodies bodies (a small scene's bodies share the caches whatever their order).
    """

    # Defaults of resort_interval / resort_min_bodies. A resort of pile_1m costs 13 ms on an H200 (a few kernels and
    # the host's bookkeeping): 0.03 ms a step at this interval, for a step 1 ms faster. Not tuned: bodies of
    # a pouring pile drift out of order within a few hundred steps, and below ~20k bodies the data of a step fits
    # the GPU's L2 cache in any order.
    RESORT_INTERVAL = SIM_DEFAULTS["resort_interval"]
    RESORT_MIN_BODIES = 20_000
    # Steps between the contact storage's lazy releases (ContactSet.release_unused; 0: never). A landed 8,000-body
    # slice of pile_1m (CPU): its contact storage held 1.88x the live records' bytes without, 1.33-1.39x with.
    RELEASE_INTERVAL = 500

    def __init__(self, scene: Scene, contacts=None, capacity=None, verbose=True, spatial_sort=True,
                 resort_interval=None):
        self.verbose = verbose
        self.strict = False   # deep penetration raises SimulationError instead of a warning
        self.spatial_sort = bool(spatial_sort)  # store bodies by shape and place (storage_order); False: scene order
        self._resort_interval_override = None if resort_interval is None else int(resort_interval)
        self.resort_min_bodies = self.RESORT_MIN_BODIES
        self.release_interval = self.RELEASE_INTERVAL
        self.contacts_kind = contacts or scene.sim["contacts"]
        if self.contacts_kind not in ("vla", "padded", "dynamic"):
            raise UserError(f"sim.contacts: expected vla | padded | dynamic, got {self.contacts_kind!r}")
        self.generation_id = 0
        self._padded = scene.sim["padded_capacity"]
        self._allocate(body_capacity_for(scene, capacity), scene)
        self.load(scene)

    # ------------------------------------------------------------------ setup
    def _allocate(self, capacity: int, scene: Scene, static_cells: bool = False):
        """New parts of `capacity` bodies. Built first and assigned together: when an allocation fails, the
        Simulation keeps its old parts, whole. The grid has static cells when the scene (or static_cells, for
        bodies being added) has static bodies, or the grid it replaces had them."""
        _check_tree_room()
        capacity = int(capacity)
        hulls = max(hull_capacity_for(len(scene.hulls)), getattr(getattr(self, "model", None), "hull_capacity", 0))
        model = Model(capacity, hull_capacity=hulls)
        state = State(capacity)
        diagnostics = Diagnostics()
        contacts = ContactSet(self.contacts_kind, capacity, max_per_body=int(self._padded))
        solver = JacobiSolver(model, diagnostics, contacts.normal_warm, scene.sim["solver_iterations"])
        grid = Grid(capacity, hull_class=hulls > 0, static_cells=static_cells or has_static_bodies(scene.bodies)
                    or getattr(getattr(self, "grid", None), "has_static", False),
                    keeps_still_pairs=self.contacts_kind == "vla")
        reorder = Reorder(capacity)
        # its failures are recorded where the narrowphase and solver kernels look (contacts.failed_step)
        batch = Batch(failed_at=contacts.failed_step)
        (self.capacity, self.model, self.state, self.diagnostics, self.contacts, self.solver, self.grid, self.reorder,
         self._batch) = capacity, model, state, diagnostics, contacts, solver, grid, reorder, batch
        self._unchecked = 0   # steps launched since the host last read whether their commits sufficed
        self._check_every = 1
        self.generation_id += 1

    def load(self, scene: Scene):
        """(Re)load a scene into the existing fields when it fits (no recompilation), else reallocate."""
        builder = ModelBuilder(scene)
        if not builder.fits(self.model) or scene.sim["padded_capacity"] > self._padded or \
                (builder.static_count and not self.grid.has_static):
            self._padded = max(self._padded, scene.sim["padded_capacity"])
            self._allocate(max(self.capacity, _round_capacity(scene.body_count)), scene)
        self.contacts.set_limit(scene.sim["padded_capacity"])
        self.scene = scene
        self.builder = builder
        sim = scene.resolved_sim()
        self.dt = float(sim["dt"])
        self.substeps = int(sim["substeps"])
        self.solver_iterations = int(sim["solver_iterations"])
        self.resort_interval = int(sim["resort_interval"]) if self._resort_interval_override is None else \
            self._resort_interval_override
        # Bodies are stored by shape, then in Z-order of their initial positions (storage_order); scene_of[k] is
        # the scene index of stored body k, internal_of its inverse. Host accessors and messages speak scene order.
        self._set_order(storage_order(scene.bodies["position"], scene.bodies["shape"]) if self.spatial_sort else
                        np.arange(scene.body_count, dtype=np.int64))
        builder.write(self.model, self._scene_of)
        self.grid.set_static(builder, self.model)
        self.solver.forget_stacks()
        self._update_mass_range()
        b = {key: np.asarray(scene.bodies[key])[self._scene_of]
             for key in ("position", "orientation", "velocity", "angular_velocity")}
        self.state.set_rows(0, b["position"], b["orientation"], b["velocity"], b["angular_velocity"])
        self.state.ext_body[None] = -1
        self.contacts.reset()
        self.grid.reset()
        self._grid_order_current = False   # grid.body_order describes this step's bodies (see resort)
        self.diagnostics.reset()
        self.step_count = 0
        self._unchecked = 0
        self._check_every = 1
        self.last_frame = None
        self.overlap = OverlapWatch()
        self.health_warnings = []
        self.overflow_events = []
        self.vla_regrowths = 0   # steps redone to grow a VLA (see advance)
        self._regrowths_seen = 0   # vla_regrowths at the last release step (advance)
        self._overflow_seen = self.contacts.overflowed()

    @property
    def body_count(self) -> int:
        """Bodies simulated (host copy of model.body_count: reading the field would sync the device)."""
        return self.builder.body_count

    @property
    def step_count(self) -> int:
        return self.state.step

    @step_count.setter
    def step_count(self, value: int):
        self.state.step = int(value)

    @property
    def sim_time(self) -> float:
        return self.step_count * self.dt

    def reset(self):
        """Back to the scene's initial state (bodies added at runtime are removed)."""
        self.load(self.scene)

    def add_bodies(self, bodies: list):
        """Append bodies at runtime (list of body dicts as in a scene file; generators allowed). Capacity
        grows (fields are reallocated, state copied) when needed; existing bodies keep their state."""
        raw = dict(self.scene.raw)
        raw["bodies"] = list(bodies)
        extra = validate(raw, self.scene.path + " (added bodies)")
        n0 = self.body_count
        k = extra.body_count
        # added bodies keep their order, after the stored ones (scene indices n0, n0 + 1, ...: their ids)
        order = np.concatenate([self.scene_of, np.arange(n0, n0 + k)])
        # parameters and materials written straight into the Model's fields (docs/simulator.md: live) are kept
        self.builder.read_live(self.model)
        if n0 + k > self.capacity or (has_static_bodies(extra.bodies) and not self.grid.has_static):
            saved = self.state.to_numpy(n0)
            step = self.step_count
            self._allocate(_round_capacity(n0 + k) if n0 + k > self.capacity else self.capacity, self.scene,
                           static_cells=has_static_bodies(extra.bodies))   # (raises before anything here has changed)
            self.builder.add_bodies(extra.bodies)
            self.builder.write(self.model, order)
            self.state.set_rows(0, saved["body_pos"], saved["body_quat"], saved["body_vel"], saved["body_omega"])
            self.state.set_slow_time(saved["body_slow_time"])   # (sleepers stay asleep)
            self.step_count = step
            self.contacts.reset()
        else:
            self.builder.add_bodies(extra.bodies)
            self.builder.write_bodies(self.model, order)
        self.grid.set_static(self.builder, self.model)
        self._grid_order_current = False
        self._set_order(order)
        self._update_mass_range()
        b = extra.bodies
        self.state.set_rows(n0, b["position"], b["orientation"], b["velocity"], b["angular_velocity"])

    def set_gravity(self, g):
        """Gravity (m/s^2, a 3-vector), from the next step; wakes every body."""
        self.builder.set_param(self.model, "gravity", [float(x) for x in g])
        self.wake()

    def set_material(self, index_or_name, friction=None, restitution=None):
        """Change a material's friction / restitution live (takes effect next step); wakes every body."""
        idx = index_or_name if isinstance(index_or_name, int) else self.scene.material_index[index_or_name]
        self.builder.set_material(self.model, idx, friction=friction, restitution=restitution)
        self.wake()

    def set_external_force(self, body=None, force=(0.0, 0.0, 0.0), point=None):
        """Apply `force` (N, world) at `point` (m, world; default the body's centre) to scene body `body` in every
        step from the next, until called with body=None; wakes the body. One body at a time (the viewer's drag)."""
        if body is None:
            self.state.ext_body[None] = -1
            return
        b = int(body)
        if not 0 <= b < self.body_count:
            raise ValueError(f"set_external_force: body {b} outside 0..{self.body_count - 1}")
        k = int(self.internal_of[b])
        self.state.ext_body[None] = k
        self.state.ext_force[None] = [float(x) for x in force]
        self.state.ext_point[None] = [float(x) for x in (point if point is not None else self.state.body_pos[k])]
        self.state.body_slow_time[k] = 0.0

    def set_fixed(self, body: int, fixed: bool = True):
        """Fix scene body `body` where it is (it stops and nothing moves it), or free it again (a body fixed in the
        scene stays fixed), from the next step; the viewer's f key."""
        k = int(self.internal_of[int(body)])
        self.builder.set_fixed(self.model, int(body), k, bool(fixed))
        self._update_mass_range()
        if fixed:
            self.state.body_vel[k] = [0.0, 0.0, 0.0]
            self.state.body_omega[k] = [0.0, 0.0, 0.0]
        self.wake()

    def _update_mass_range(self):
        """Tell the solver the movable bodies' masses (the load-path correction's switch: JacobiSolver.set_mass_range)
        after the set of bodies or of fixed ones changed."""
        b = self.builder.bodies
        self.solver.set_mass_range(np.asarray(b["mass"])[np.asarray(b["inv_mass"]) > 0],
                                   float(self.scene.sim["load_path_ratio"]))

    def wake(self):
        """Wake every sleeping body (sleeping: sim.sleep_speed, sim.sleep_time; app.sim.state.asleep): after a change
        that may move them (a parameter, an edit of the state's fields), from the next step."""
        self.state.body_slow_time.fill(0.0)

    def sleeping(self) -> np.ndarray:
        """bool (N,), scene order: the bodies asleep (slow for sim.sleep_time) at the end of the last step, but for
        those an awake body held awake in it (app.sim.state.HELD)."""
        slow = self.to_scene_order(self.state.body_slow_time.to_numpy()[: self.body_count])
        held = self.to_scene_order(self.state.body_woken.to_numpy()[: self.body_count]) < 0
        speed, limit = float(self.model.sleep_speed[None]), float(self.model.sleep_time[None])
        movable = self.to_scene_order(self.model.body_inv_mass.to_numpy()[: self.body_count]) > 0
        return (slow >= limit) & ~held & movable & (speed > 0)

    # ------------------------------------------------------------------ stepping
    # advance() reads back whether its steps' VLA commits sufficed every few steps (and at its end, and before a
    # resort): after each step while the VLAs grow, then after 2, 4, ... CHECK_STEPS steps while they do not. A
    # read idles the GPU while the host waits for it and launches the next kernel: one a step cost 0.3 ms of a
    # 10.4 ms pile_1m step on the H200. A failed step is redone with every step
    # launched after it, so checks are frequent where failures are (a pile's contacts grow for a while, and
    # their pool with them) and rare where the scene is settled.
    CHECK_STEPS = 16

    def step(self):
        """Advance one dt, checked: advance(1)."""
        self.advance(1)

    def advance(self, steps: int, check_end: bool = True):
        """Advance `steps` steps of dt; on return every step is final (as if each had been checked alone).

        A step is 7 kernel launches with 10 solver iterations (the solver runs ITERATION_BATCH of them per
        launch, see app.sim.solver) and 3 device-side commits (grid cells, candidate pairs, contacts) in one
        vla.Batch: lists that grew take chunks from their pool's free space on the device. Nothing is read back
        per step: the host reads every few steps (at most CHECK_STEPS, see above) whether every commit sufficed
        (_settle). When one did not (a pool or an overflow area too small: a few times while a scene's contacts
        grow), the narrowphase and solver kernels of that step and of every later one have done nothing (they
        skip while contacts.failed_step is set), and _settle redoes the steps from the failed one, that one
        through vla.launch, which grows the VLAs on the host; nothing is lost, and the motion is the same to the
        bit. check_end=False leaves the last steps unchecked for the caller, who must then read them
        (step_frame does, with the frame's readout)."""
        steps = int(steps)
        for k in range(steps):
            self._launch_step()
            resort = self.resort_interval > 0 and self.step_count % self.resort_interval == 0 and \
                self.body_count >= self.resort_min_bodies
            # (a step that probed the stacks is checked at once: the load-path correction then switches at the same
            # step however the caller advances, JacobiSolver.after_check)
            release = self.release_interval > 0 and self.step_count % self.release_interval == 0
            if resort or release or (check_end and k == steps - 1) or self._unchecked >= self._check_every or \
                    self.solver.probed:
                self._settle()
            if release:
                # only once the contacts grow no more than now and then (at most one step redone to grow the VLAs
                # since the last time): a release while a pile still lands would give back what its next steps take
                # again (8,000 bodies: 4 more steps redone after a release at step 500, 1 after one at step 1,000)
                if self.vla_regrowths - self._regrowths_seen <= 1:
                    self.contacts.release_unused()
                self._regrowths_seen = self.vla_regrowths
            if resort:
                self.resort()

    def _launch_step(self):
        """Launch one step (see advance) without reading anything back; its batch is tagged with its number."""
        self.contacts.flip()
        self._batch.begin(self.step_count)
        self.grid.build(self.model, self.state, self.dt, self._batch)
        find_contacts(self.model, self.state, self.grid, self.contacts, self.diagnostics, self.dt, self._batch)
        self._solve()
        self._unchecked += 1

    def _solve(self):
        self._grid_order_current = True
        self.solver.iterations = self.solver_iterations
        self.solver.step(self.state, self.state, self.contacts, self.dt)

    def _settle(self):
        """Make the launched steps final: one host read of the first failed step f, if any. The state and both
        contact generations are then as at f's start (f's kernels past its failure and every later step's did
        nothing), so f runs again with its broadphase and narrowphase through vla.launch, which grows the VLAs,
        and the steps after it are launched again and checked again."""
        while self._unchecked:
            f = self._batch.first_failure()
            if f is None:
                self._checked_clean()
                return
            self._check_every = 1
            end = self.step_count
            self._batch.clear_failure()
            if (end - f) % 2:   # each launched step flipped the generations: back to those of f's start
                self.contacts.flip()
            self.step_count = f
            self.vla_regrowths += 1
            self.solver.redoing()
            self.contacts.flip()
            self.grid.build(self.model, self.state, self.dt)
            find_contacts(self.model, self.state, self.grid, self.contacts, self.diagnostics, self.dt)
            self._solve()
            self._unchecked = 0
            while self.step_count < end:
                self._launch_step()
        self.solver.after_check()   # (the redone steps are final: the last of them went through vla.launch)

    def _checked_clean(self):
        """The launched steps were read back and none failed."""
        self._unchecked = 0
        self._check_every = min(2 * self._check_every, self.CHECK_STEPS)
        self.solver.after_check()

    def resort(self):
        """Store the bodies again in the order of where they are now (app.sim.reorder): by shape, then in grid order
        of this step's positions (the grid is rebuilt first if the bodies changed since the last step). Keeps every
        contact and its impulses; the motion is the same to the last bit. Device work only: the host's order
        (scene_of) is read back from model.body_id when next needed."""
        if not self._grid_order_current:
            self.grid.build(self.model, self.state, self.dt)
        resort_bodies(self.builder, self.model, self.state, self.contacts, self.diagnostics, self.reorder,
                      self.grid.body_order, self.body_count)
        self._grid_order_current = False   # body_order holds the old indices
        self._order_stale = True

    # ------------------------------------------------------------------ stored order <-> scene order
    def _set_order(self, scene_of: np.ndarray):
        self._scene_of = np.asarray(scene_of, np.int64)
        self._internal_of = np.empty_like(self._scene_of)
        self._internal_of[self._scene_of] = np.arange(self._scene_of.size)
        self._order_stale = False

    def _sync_order(self):
        """After resort(): read the new order back (model.body_id holds each stored body's scene index)."""
        if self._order_stale:
            self._set_order(self.model.body_id.to_numpy()[:self.body_count])

    @property
    def scene_of(self) -> np.ndarray:
        """int64 (N,): scene index of each stored body (see the class docstring)."""
        self._sync_order()
        return self._scene_of

    @property
    def internal_of(self) -> np.ndarray:
        """int64 (N,): stored index of each scene body."""
        self._sync_order()
        return self._internal_of

    def step_frame(self, steps=None):
        """Advance `substeps` steps (or `steps`), then check health and overflow. One host read a frame when no VLA had to
        grow: the frame's readout (read_frame, kept in last_frame) also says whether the steps' commits
        sufficed; when one did not, the steps are redone (see advance) and read again."""
        self.advance(self.substeps if steps is None else int(steps), check_end=False)
        frame = self.read_frame()
        if self._unchecked:
            if frame["failed_step"] != NO_FAILURE:
                self._settle()
                frame = self.read_frame()
            else:
                self._checked_clean()
        self.check(frame)

    def read_frame(self) -> dict:
        """One host read of app.sim.diagnostics.READOUT_FIELDS (health flags, contacts.failed_step, contact points of
        the last step, max_depth m, contacts dropped by a padded / dynamic storage, kinetic energy J), as a
        dict of ints (floats for max_depth and kinetic_energy); also kept in last_frame."""
        kernel_frame_readout(self.model, self.state, self.diagnostics, self.contacts)
        values = self.diagnostics.readout.to_numpy().tolist()
        frame = {name: (x if name in READOUT_FLOATS else int(x))
                 for name, x in zip(READOUT_FIELDS, values)}
        self.last_frame = frame
        return frame

    def check(self, frame=None):
        """Raise SimulationError on NaN/explosion; record and report contact overflow and deep penetration. frame: a
        read_frame() of the current state, or None to read one. step_frame calls it once a frame: the penetration
        record covers the steps since the last readout, taken as one frame of substeps steps."""
        if frame is None:
            frame = self.read_frame()
        if frame["error_step"] != NO_ERROR:
            body = int(self.scene_of[frame["error_body"]])
            step = frame["error_step"]
            kind = "a NaN" if frame["error_kind"] == 1 else \
                f"a speed above sim.max_speed = {float(self.model.max_speed[None]):g} m/s"
            raise SimulationError(
                f"{self.scene.path}: simulation exploded: body {body} (scene order) got {kind} at step {step} "
                f"(t = {step * self.dt:.4f} s); try a smaller sim.dt, more sim.solver_iterations, or bodies that do "
                f"not start overlapping")
        seen = frame
        if frame["deep_body"] != NO_ERROR:   # the pair in scene order, before a resort renumbers the stored indices
            j = frame["deep_other"]
            seen = dict(frame, deep_body=int(self.scene_of[frame["deep_body"]]),
                        deep_other=int(self.scene_of[j]) if j >= 0 else j)
        frame_time = self.substeps * self.dt
        for event in self.overlap.observe(seen, self.sim_time - frame_time, self.sim_time):
            message = self._overlap_message(event, seen)
            self.health_warnings.append(message)
            if self.strict:
                raise SimulationError(f"{message} (--strict stops the run)")
            if self.verbose:
                print(f"warning: {message}", file=sys.stderr)
        total = frame["dropped"]
        if total > self._overflow_seen:
            lost = total - self._overflow_seen
            self._overflow_seen = total
            ev = {"step": self.step_count, "lost": lost, "total": total}
            self.overflow_events.append(ev)
            if self.verbose:
                print(f"warning: contact storage '{self.contacts_kind}' dropped {lost} contacts before step "
                      f"{self.step_count} (capacity {self.scene.sim['padded_capacity']} per body; raise "
                      f"sim.padded_capacity or use contacts: vla)", file=sys.stderr)

    def _overlap_message(self, event: str, frame: dict) -> str:
        i, j = frame["deep_body"], frame["deep_other"]   # (in scene order: see check)
        who = f"bodies {min(i, j)} and {max(i, j)}" if j >= 0 else f"body {i} and the static geometry"
        limit = float(self.model.penetration_limit[None])
        if event == "deep":
            return (f"{self.scene.path}: {who} (scene order) overlap deeper than sim.penetration_limit = {limit:g} "
                    f"of the smaller half-size at t = {self.sim_time:.4f} s (deepest contact this frame: "
                    f"{frame['max_depth']:.3g} m, {frame['max_depth_fraction']:.2f} of its pair's size); bodies "
                    f"placed inside each other, a large sim.dt or too few sim.solver_iterations do this")
        return (f"{self.scene.path}: {who} (scene order) still overlap deeper than sim.penetration_limit = "
                f"{limit:g} after {self.overlap.PERSIST_S:g} s (every frame since t = "
                f"{self.sim_time - self.overlap.longest_deep_s:.4f} s)")

    def health(self) -> dict:
        """The run's penetration record (metrics.json "health"): penetration_limit, max_penetration_fraction (the
        deepest contact over its pair's size), deep_frames, longest_deep_s (s), first_deep ({time s, bodies in
        scene order, None for static geometry} or None), warnings (the messages printed)."""
        w = self.overlap
        first = None
        if w.first_deep is not None:
            i, j = w.first_deep["bodies"]
            first = {"time": w.first_deep["time"], "bodies": [i, j if j >= 0 else None]}
        return {"penetration_limit": float(self.model.penetration_limit[None]),
                "max_penetration_fraction": w.max_fraction, "deep_frames": w.deep_frames,
                "longest_deep_s": w.longest_deep_s, "first_deep": first, "warnings": list(self.health_warnings)}

    # ------------------------------------------------------------------ host accessors (numpy, scene order)
    def to_scene_order(self, stored: np.ndarray) -> np.ndarray:
        """Rows of a per-body array in stored order (a field's to_numpy()[:body_count]) put in scene order."""
        return stored[self.internal_of[: self.body_count]]

    def positions(self) -> np.ndarray:
        """(N, 3) float32, m."""
        return self.to_scene_order(self.state.body_pos.to_numpy()[: self.body_count])

    def orientations(self) -> np.ndarray:
        """(N, 4) float32 unit quaternions (w, x, y, z)."""
        return self.to_scene_order(self.state.body_quat.to_numpy()[: self.body_count])

    def velocities(self) -> np.ndarray:
        """(N, 3) float32, m/s."""
        return self.to_scene_order(self.state.body_vel.to_numpy()[: self.body_count])

    def angular_velocities(self) -> np.ndarray:
        """(N, 3) float32, rad/s (world frame)."""
        return self.to_scene_order(self.state.body_omega.to_numpy()[: self.body_count])

    def contact_counts(self) -> np.ndarray:
        """(N,) int32, contacts in each body's list after the last step."""
        return self.to_scene_order(self.contacts.lengths(self.body_count))

    def shapes(self) -> dict:
        """shape (N,) int32 (app.scene.schema.SHAPES), radius (N,) m (bounding radius), half_extents (N,3) m,
        material (N,) int32, fixed (N,) bool, mass (N,) kg, hull (N,) int32 (a convex body's index in hulls(), -1
        for the other shapes)."""
        h = self.builder.bodies
        return {"shape": h["shape"].astype(np.int32), "radius": h["radius"].astype(np.float32),
                "hull": (h["hull"] - 1).astype(np.int32),
                "half_extents": h["half_extents"].astype(np.float32), "material": h["material"].astype(np.int32),
                "fixed": h["fixed"].astype(bool), "mass": h["mass"].astype(np.float32)}

    def hulls(self) -> list:
        """The scene's convex hulls (app.scene.hull.Hull, in their bodies' frames), as shapes()["hull"] indexes them."""
        return self.builder.hulls

    def static_geometry(self) -> list:
        """The scene's static list as validated: dicts {type: plane, normal, offset, material} or
        {type: container, size, center, material} (material = index)."""
        return [dict(s) for s in self.builder.statics]

    def kinetic_energy(self) -> float:
        return float(kernel_kinetic_energy(self.model, self.state))

    def metrics(self) -> dict:
        """Snapshot: contact counts, penetration (the last frame's deepest, m), energy, storage statistics,
        overflow."""
        counts = self.contact_counts()
        return {
            "step": self.step_count,
            "sim_time": self.sim_time,
            "bodies": self.body_count,
            "contacts": int(self.diagnostics.contact_total[None]),
            "contacts_per_body_max": int(counts.max()) if counts.size else 0,
            "contacts_per_body_mean": float(counts.mean()) if counts.size else 0.0,
            "max_penetration": self.last_frame["max_depth"] if self.last_frame else 0.0,
            "kinetic_energy": self.kinetic_energy(),
            "contact_storage": self.contacts.stats(),
            "grid": self.grid.stats(),
            "overflow_total": self.contacts.overflowed(),
            "vla_regrowths": self.vla_regrowths,
        }
