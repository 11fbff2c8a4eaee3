"""SmolVLA application: a rigid-body collision simulator whose contact and grid lists are VLAs."""
