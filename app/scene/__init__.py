"""Scenes: YAML files read, overridden (--set), validated and expanded into a Scene (app.scene.schema). Nothing in
this package imports Taichi."""
from app.scene.loading import apply_overrides, load_scene, parse_override, read_yaml, scene_from_dict, validate
from app.scene.schema import (ARCHS, CONTACT_STORAGES, SHAPE_BOX, SHAPE_CAPSULE, SHAPE_SPHERE, SHAPES, SIM_DEFAULTS,
                              Scene,
                              body_bounding_radius)

__all__ = ["Scene", "load_scene", "scene_from_dict", "validate", "apply_overrides", "parse_override", "read_yaml",
           "SIM_DEFAULTS", "SHAPES", "SHAPE_SPHERE", "SHAPE_BOX", "SHAPE_CAPSULE",
           "CONTACT_STORAGES", "ARCHS", "body_bounding_radius"]
