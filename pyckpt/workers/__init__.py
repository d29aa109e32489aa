"""Multi-worker saves over an existing distributed engine: communicators, the planner,
the 7-step protocol, its background variant and node-local replicas (docs/PROTOCOL.md
section 6). Users reach the communicators as ``pyckpt.dist`` (docs/API.md section 6)."""
