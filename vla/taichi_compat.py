"""What the VLA does around Taichi 1.7.4's limits: SNode trees, their ids, and programs that end.

* **Growth keeps compiled kernels.** Growing a VLA replaces one of its SNode trees. Compiled kernels address a
  tree through the runtime's root table by tree id, and Taichi hands a destroyed tree's id to the next tree; so
  when the new tree takes the old id, every kernel already compiled against the VLA stays valid and nothing
  recompiles. When it does not (or in debug mode, where bounds checks bake field shapes into code), all compiled
  kernels are dropped and recompile on next use: slower, never wrong. ``SNodeTree.destroy()`` would drop them
  every time (Taichi cannot know that the next tree takes the same id and layout), so the tree is freed through
  the program directly (:func:`place`).
* **At most 512 trees.** The LLVM backends (CPU, CUDA) keep the roots of SNode trees in a fixed table of 512
  (kMaxNumSnodeTreesLlvm) and do not check a new tree's id: the 513th live tree is written past the table, into
  the runtime's own state, and a later kernel launch segfaults (a loop of FieldsBuilder trees dies at id 512,
  silently). A growth reuses the id it frees, so the count rises only with trees made and never released: VLAs
  and Batches created again and again without ``release()``. :func:`finalize` stops short of the limit with an
  error that says so, leaving a few ids to the application's own fields.
* **A refused allocation breaks the CPU backend.** Taichi's CPU backend asks the OS for a new tree's memory at once,
  and once the OS refuses (a request beyond the machine's memory) every later field of the process fails too.
  :func:`place` and :func:`check_allocation` refuse such a size first, with the size in the message.
* **Ndarrays outlive their program.** ``Ndarray.__del__`` frees its memory through the *current* program, so an
  ndarray of a VLA that outlived its program (``ti.reset()``, a new ``ti.init``) must not die under a newer one
  (it would free that program's memory: wrong results, segfaults). :func:`bury` keeps such objects, inert, until
  the interpreter exits.
"""
import os

import taichi as ti
from taichi._lib import core as _ti_core
from taichi.lang import impl
from taichi.lang.matrix import MatrixType
from taichi.lang.struct import StructType

from .errors import VLACapacityError

SNODE_TREE_LIMIT = 512
SNODE_TREE_MARGIN = 12
I32_MAX = 2**31 - 1

_GRAVEYARD: list = []


def program():
    """The current Taichi program (None before ti.init)."""
    return impl.get_runtime().prog


def require_program(what: str):
    """The current Taichi program; a clear error instead of Taichi's AttributeError before ti.init()."""
    prog = program()
    if prog is None:
        raise RuntimeError(f"{what}: Taichi is not initialised; call ti.init(...) first")
    return prog


def bury(obj):
    """Keep obj (ndarrays of an ended program) alive until the interpreter exits (see the module docstring)."""
    _GRAVEYARD.append(obj)


def is_primitive(dtype) -> bool:
    return isinstance(dtype, _ti_core.DataType)


def finalize(fb, what: str):
    """fb.finalize(), refusing the tree (VLACapacityError) when its id comes near Taichi's limit."""
    tree = fb.finalize()
    if tree.id >= SNODE_TREE_LIMIT - SNODE_TREE_MARGIN:
        tree.ptr.destroy_snode_tree(program())   # (no kernel uses it yet: nothing to recompile)
        tree.destroyed = True
        raise VLACapacityError(
            f"{what}: this Taichi program already holds {SNODE_TREE_LIMIT - SNODE_TREE_MARGIN} SNode trees, and "
            f"Taichi 1.7's CPU/CUDA backends corrupt memory beyond {SNODE_TREE_LIMIT}. Every VLA holds a few and "
            f"every Batch() without failed_at one, until release(): reuse them, or release() those no longer used")
    return tree


def entry_bytes(dtype) -> int:
    """Bytes of one field entry of ``dtype`` (a primitive, vector/matrix or struct type; no padding)."""
    if isinstance(dtype, MatrixType):
        return dtype.n * (dtype.m if dtype.ndim == 2 else 1) * entry_bytes(dtype.dtype)
    if isinstance(dtype, StructType):
        return sum(entry_bytes(m) for m in dtype.members.values())
    return _ti_core.data_type_size(dtype)


def host_memory_bytes() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_allocation(nbytes: int, what: str):
    """Refuse (VLACapacityError) an allocation the CPU backend cannot make: more than the machine's memory. Taichi
    would ask the OS for it and, refused, stay broken for the rest of the process (see the module docstring). On
    CUDA, Taichi's own allocator answers (an error naming device_memory_GB)."""
    if impl.current_cfg().arch in (ti.x64, ti.arm64) and nbytes > host_memory_bytes():
        raise VLACapacityError(
            f"{what} would need {nbytes / 2**30:.1f} GiB, more than this machine's {host_memory_bytes() / 2**30:.1f} "
            f"GiB of memory; use fewer lists or elements per VLA")


def place(dtype, length: int, what: str, replace=None):
    """A new field of ``length`` entries of ``dtype`` in an SNode tree of its own: (field, tree). ``replace``: the
    tree it replaces, freed just before the new one is built so that the new one takes its id."""
    if length > I32_MAX:
        raise VLACapacityError(f"{what} would need {length} entries, beyond the 32-bit index space; use a larger "
                               f"chunk_size or fewer elements per VLA")
    check_allocation(length * entry_bytes(dtype), what)
    field = ti.field(dtype) if is_primitive(dtype) else dtype.field()
    if replace is not None:
        replace.ptr.destroy_snode_tree(program())
        replace.destroyed = True
    fb = ti.FieldsBuilder()
    fb.dense(ti.i, length).place(field)
    try:
        tree = finalize(fb, what)
    except RuntimeError as e:  # device allocation failure
        raise VLACapacityError(
            f"{what}: could not allocate {length} elements: {e}. Give Taichi more device memory "
            f"(ti.init(device_memory_GB=...)), lower reserve, or trim()") from None
    return field, tree


def program_kernels_changed():
    """Drop every compiled kernel of the program (they compile again on their next launch): a VLA changed a size
    its kernels were compiled with. Taichi keys a kernel compiled for a data-oriented object on the object, not on
    the values its code read from it."""
    impl.get_runtime().clear_compiled_functions()


def replace(old_tree, dtype, length: int, what: str, debug: bool):
    """place() a field in place of old_tree's; returns (field, tree, recompiled): whether the compiled kernels had
    to be dropped (the new tree got another id, or debug mode)."""
    runtime = impl.get_runtime()
    runtime.materialize()   # finalise pending ti.root fields now, so they cannot take the id about to be freed
    old_id = old_tree.id
    field, tree = place(dtype, length, what, replace=old_tree)
    recompiled = tree.id != old_id or debug
    if recompiled:
        runtime.clear_compiled_functions()
    return field, tree, recompiled
