"""Where the viewer can draw: display and Vulkan checks, the GGUI window, sizes, image files.

GGUI draws with Vulkan, windowed or offscreen. Without a display `python run.py` runs headless and writes a
preview image; without a Vulkan driver every viewer command says which package to install.
"""
from __future__ import annotations

import ctypes.util
import glob
import os
import sys

from app.errors import UserError

DEFAULT_SIZE = (1280, 720)
OFFSCREEN_SIZE = (1024, 576)   # multiples of 16: H.264 encoders need no resize
SCREENSHOT_DIR = os.path.join("out", "screenshots")
WINDOW_TITLE = "SmolVLA viewer"
# How bodies are coloured: by material, by the contacts in their list, awake / asleep, or by speed (replays: as
# material).
COLOR_MODES = ("material", "contacts", "sleep", "speed")
VULKAN_HINT = ("install a Vulkan driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers libvulkan1` "
               "(lavapipe renders on the CPU), or your GPU vendor's driver")


def has_display() -> bool:
    """True where a window can open: an X11 or Wayland display on Linux; always on macOS and Windows."""
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


# Where a Linux distribution puts the Vulkan loader, beside the dynamic linker's cache and LD_LIBRARY_PATH. Looked
# up file by file: a recursive search of /usr/lib* can loop through symlinked build trees (Debian's llvm-*-dev
# has `Release -> ..`) and never end.
LOADER_DIRS = ("/usr/lib", "/usr/lib64", "/usr/local/lib", "/lib", "/lib64", "/usr/lib/x86_64-linux-gnu",
               "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu")


def _vulkan_loader_found() -> bool:
    if ctypes.util.find_library("vulkan") is not None:
        return True
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(LOADER_DIRS)
    return any(os.path.isfile(os.path.join(d, name)) for d in dirs for name in ("libvulkan.so.1", "libvulkan.so"))


def vulkan_problem() -> str | None:
    """None when a Vulkan loader and at least one driver manifest are present, else a one-line reason with
    the package to install. GGUI draws with Vulkan, windowed or offscreen."""
    if not sys.platform.startswith("linux"):
        return None
    if not _vulkan_loader_found():
        return f"no Vulkan loader (libvulkan.so.1) found; {VULKAN_HINT}"
    listed = [p for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES") for p in os.environ.get(var, "").split(":") if p]
    if listed:
        if not any(os.path.isfile(p) for p in listed):
            return f"no Vulkan driver: the manifests named by VK_ICD_FILENAMES/VK_DRIVER_FILES do not exist; {VULKAN_HINT}"
        return None
    dirs = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"]
    xdg = os.environ.get("XDG_DATA_DIRS", "")
    dirs += [os.path.join(d, "vulkan", "icd.d") for d in xdg.split(":") if d]
    if not any(glob.glob(os.path.join(d, "*.json")) for d in dirs):
        return f"no Vulkan driver found (no ICD manifest in /usr/share/vulkan/icd.d); {VULKAN_HINT}"
    return None


def vulkan_icds() -> list:
    """Vulkan driver manifests visible to the loader (file names): tells lavapipe (lvp_icd, a CPU rasteriser)
    from a GPU driver (nvidia_icd, ...) when reading benchmark figures."""
    listed = [p for var in ("VK_ICD_FILENAMES", "VK_DRIVER_FILES") for p in os.environ.get(var, "").split(":") if p]
    if listed:
        return [os.path.basename(p) for p in listed if os.path.isfile(p)]
    found = []
    for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d"):
        found += sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "*.json")))
    return found


# Dear ImGui, inside GGUI, saves its panels' layout to imgui.ini in the working directory when a window is destroyed
# (or at exit), and Taichi offers no setting for it. close_window removes the file unless it was there before the
# window opened: {id(window): (path, existed)}.
_IMGUI_INI = {}


def open_window(title: str, size, show_window: bool):
    """A GGUI window (show_window=False: offscreen); close it with close_window. Raises UserError naming the
    package when Vulkan is missing instead of GGUI's traceback."""
    problem = vulkan_problem()
    if problem:
        raise UserError(problem)
    import taichi as ti

    ini = os.path.abspath("imgui.ini")
    existed = os.path.exists(ini)
    try:
        window = ti.ui.Window(title, tuple(int(x) for x in size), vsync=show_window, show_window=show_window)
        _IMGUI_INI[id(window)] = (ini, existed)
        return window
    except RuntimeError as e:
        if "vulkan" in str(e).lower():
            raise UserError(f"cannot start Vulkan ({e}); {VULKAN_HINT}") from None
        if show_window:
            raise UserError(f"cannot open a window ({e}); check $DISPLAY, or run with --headless") from None
        raise


def close_window(window) -> None:
    """Destroy a window of open_window, leaving no imgui.ini behind that was not there before."""
    try:
        window.destroy()
    finally:
        ini, existed = _IMGUI_INI.pop(id(window), (None, True))
        if not existed:
            try:
                os.remove(ini)
            except FileNotFoundError:
                pass


def parse_size(text: str, what="--size"):
    try:
        w, h = (int(x) for x in text.lower().split("x"))
        if w < 64 or h < 64:
            raise ValueError
        return w, h
    except ValueError:
        raise UserError(f"{what} {text!r}: expected WIDTHxHEIGHT, at least 64x64 (e.g. 1280x720)") from None


def fmt_bytes(n) -> str:
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def ensure_taichi(arch, scene_arch="auto", scene=None, capacity=0):
    from app.runtime import ensure_taichi as _ensure

    return _ensure(arch if arch not in (None, "auto") else scene_arch, scene=scene, capacity=capacity)


def save_png(path, rgb):
    from PIL import Image

    from app.files import write_atomic

    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise UserError(f"{path}: cannot make its directory ({e.strerror or e})") from None
    write_atomic(path, lambda fh: Image.fromarray(rgb).save(fh, format="PNG", optimize=True))
