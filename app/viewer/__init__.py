"""The viewer, a plug-in of the simulation: the interactive window (interactive), offscreen frames and video
(offscreen), replay of recorded runs (replay), and what they share: the display checks (display), the renderer
(render: sources, camera, draw calls), its kernels (kernels) and meshes (meshes). Nothing here is imported by
app.sim; headless runs import none of it unless they render."""
